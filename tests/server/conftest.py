"""Fixtures the server tests share."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlx_lm.utils import load_tokenizer

from tests.helpers.fixture_paths import MODELS
from tests.helpers.tools import OUTPUTS


@pytest.fixture(scope="module")
def tool_model(checkpoints, tmp_path_factory):
    """The small qwen3_moe checkpoint with Qwen3's own chat template (tools, thinking)."""
    src = checkpoints("qwen3_moe")
    dst = tmp_path_factory.mktemp("tools") / "qwen3-tools"
    shutil.copytree(src, dst)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    config["chat_template"] = (MODELS / "qwen3-30b-a3b" / "chat_template.jinja").read_text()
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    (dst / "chat_template.jinja").unlink(missing_ok=True)
    return dst


@pytest.fixture(scope="module")
def think_model(checkpoints, tmp_path_factory):
    """The small qwen3_moe checkpoint with a tokenizer that knows <think> / </think> and
    Qwen3.5's template, whose generation prompt opens the think block."""
    from ssdmoe_tui.models.demo import write_tokenizer

    src = checkpoints("qwen3_moe")
    dst = tmp_path_factory.mktemp("think") / "qwen3-think"
    shutil.copytree(src, dst)
    template = (MODELS / "qwen3.5-35b-a3b" / "chat_template.jinja").read_text()
    write_tokenizer(dst, 1024, template, ("<think>", "</think>"))
    return dst


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A module's data folder and lock folder (the module's server outlives each test's own)."""
    home = tmp_path_factory.mktemp("server-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSDMOE_HOME", str(home))
        mp.setenv("SSDMOE_LOCK_DIR", str(home / "locks"))
        yield home


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """family -> mlx-lm TokenizerWrapper: the genuine Qwen3 vocabulary with the family's
    own chat template (all three use <|im_start|>/<|im_end|>)."""
    out = {}
    for family in OUTPUTS:
        folder = tmp_path_factory.mktemp(family)
        for name in ("vocab.json", "merges.txt"):
            shutil.copy(MODELS / "qwen3-30b-a3b" / name, folder / name)
        config = json.loads((MODELS / "qwen3-30b-a3b" / "tokenizer_config.json").read_text())
        config["chat_template"] = (MODELS / family / "chat_template.jinja").read_text()
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
        out[family] = load_tokenizer(Path(folder))
    return out
