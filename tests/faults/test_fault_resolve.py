"""Hub revisions are validated and a hub-cache ref can never send `--model` outside the
Hugging Face cache (issue 11, item 3)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ssdmoe_tui.errors import BadValueError, ModelError, user_message
from ssdmoe_tui.models.resolve import check_revision, parse_spec, resolve_model
from tests.helpers.fakes import (
    add_to_hub_cache,
    fake_config,
    hub_repo_dir,
    write_checkpoint,
)

REPO = "test-org/Tiny-MoE-4bit"


@pytest.mark.parametrize(
    "rev",
    [
        "main",
        "v1.0",
        "refs/pr/1",
        "release_2",
        "a" * 40,
        "0123456789abcdef0123456789abcdef01234567",
    ],
)
def test_good_revisions(rev):
    assert check_revision(rev) == rev
    assert parse_spec(f"{REPO}@{rev}").revision == rev


@pytest.mark.parametrize(
    "rev",
    [
        "../../../x",
        "..",
        "main/../../x",
        "/etc",
        "a//b",
        "x\ty",
        "x:y",
        "x~1",
        "x^",
        "br anch",
        "v1.lock",
        "-rf",
        "a" * 300,
        "main/",
        ".hidden",
    ],
)
def test_bad_revisions_are_refused_in_one_line(rev):
    with pytest.raises(BadValueError) as e:
        parse_spec(f"{REPO}@{rev}")
    assert "\n" not in user_message(e.value) and "not a revision" in str(e.value)


def test_backslash_is_a_missing_path():
    with pytest.raises(ModelError, match="no such file"):
        parse_spec(f"{REPO}@a\\b")


def test_planted_ref_cannot_resolve_outside_the_cache(tmp_path: Path):
    """A ref file naming `../../../x` (or a traversal revision) must not load the model
    planted outside the cache."""
    src = tmp_path / "src"
    write_checkpoint(src, fake_config())
    cache = tmp_path / "hub"
    add_to_hub_cache(cache, REPO, src, refs=("main",))
    outside = tmp_path / "x"
    shutil.copytree(src, outside)
    repo = hub_repo_dir(cache, REPO)
    # A traversal revision, with a ref file planted where it would point.
    (repo / "refs" / "evil").write_text("../../../x")
    with pytest.raises(ModelError, match="outside"):
        resolve_model(f"{REPO}@evil", cache_dir=cache, check=False)
    with pytest.raises(BadValueError):
        resolve_model(f"{REPO}@../../../x", cache_dir=cache, check=False)
    # The good ref still resolves inside the cache.
    assert resolve_model(REPO, cache_dir=cache, check=False).parent == repo / "snapshots"
