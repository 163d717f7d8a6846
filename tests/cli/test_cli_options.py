"""Shared engine options: each value is checked once, at the edge, with one line naming it
(issue 11 items 4-5), and `EngineOptions` holds the same checks for programmatic callers."""

from __future__ import annotations

import io
import json
import sys

import pytest

from ssdmoe_tui.cli import main
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.options import CacheBudget, EngineOptions, SamplingOptions, parse_bytes
from tests.helpers.bad_inputs import BAD_OPTIONS

# tests/helpers/bad_inputs.py's shared-option rows, and a few argparse refuses beyond them
BAD_ARGS = [(argv, says) for _, argv, says in BAD_OPTIONS] + [
    (["bench", "--model", "x", "--prefill-step", "0"], "got 0"),
    (["bench", "--model", "x", "--policy", "banana"], "unknown cache policy 'banana'"),
    (["bench", "--model", "x", "--policy", "predict:x"], "'predict:x'"),
    (["--expert-cache", "banana"], "'banana'"),
]


@pytest.mark.parametrize(("argv", "named"), BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_value_is_one_line_naming_it(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err and named in err, err
    assert "Traceback" not in err


def test_sizes_parse_once_and_tiny_ones_are_kept_for_the_clamp():
    assert CacheBudget.parse("auto").auto
    assert CacheBudget.parse("512M").bytes == 512 << 20
    assert CacheBudget.parse("1.5GiB").bytes == 3 << 29
    assert [CacheBudget.parse(t).bytes for t in ("0", "1K", "1e-30")] == [0, 1024, 0]
    for bad in ("banana", "inf", "-5", "", "4X"):
        with pytest.raises(BadValueError):
            CacheBudget.parse(bad)


def test_engine_options_check_programmatic_values_too():
    assert EngineOptions(expert_cache="2G").expert_cache.bytes == 2 << 30
    for bad in (
        {"k": 0},
        {"prefill_k": -1},
        {"expert_cache": "banana"},
        {"dtype": "int8"},
        {"reader": "fast"},
        {"experts": "both"},
        {"prefill_step": 0},
    ):
        with pytest.raises(BadValueError):
            EngineOptions(**bad)
    for bad in ({"max_tokens": 0}, {"temp": float("nan")}, {"top_p": 1.5}, {"seed": 2**70}):
        with pytest.raises(BadValueError):
            SamplingOptions(**bad)


def test_non_utf8_prompt_from_argv_and_stdin(monkeypatch, capsys, checkpoints):
    path = str(checkpoints("qwen3_moe"))
    bad_argv = b"caf\xe9".decode("utf-8", "surrogateescape")  # how Python decodes argv
    assert main(["generate", "--model", path, "--prompt", bad_argv]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not valid UTF-8 (byte 0xe9" in err, err

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok \xff\xfe")))
    assert main(["generate", "--model", path, "--prompt", "-"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stdin is not valid UTF-8 (byte 0xff at offset 3)" in err


def test_k_beyond_the_model_fails_on_its_header(checkpoints, capsys):
    path = str(checkpoints("qwen3_moe"))
    assert main(["generate", "--model", path, "--k", "999", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "K=999 is outside 1..16" in err, err
    # The model lock was never taken, so the next command loads at once.
    assert main(["generate", "--model", path, "--k", "2", "--prompt", "hi", "--json",
                 "--max-tokens", "3", "--expert-cache", "1e-30"]) == 0  # fmt: skip
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert set(result["k_per_token"]) == {2} and result["stats"]["k"] == 2
    assert out.err.count("minimum") == 1, out.err  # the clamp, said once with the numbers
    budget = result["stats"]["expert_cache_budget_bytes"]
    assert f"{budget:,} bytes" in out.err


def test_human_bytes_is_the_one_byte_formatter():
    """CLI lines, errors and the app's panels format bytes with units.human_bytes; the
    panels ask for live precision (two decimals below 10 of a unit, else one)."""
    from ssdmoe_tui.ui.fmt import fmt_bytes
    from ssdmoe_tui.units import human_bytes

    assert [human_bytes(n) for n in (0, 1023, 1536, 3 << 30, 5 << 40)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 GiB", "5.0 TiB",
    ]  # fmt: skip
    assert human_bytes(19 << 30, 2) == "19.00 GiB"
    assert [fmt_bytes(n) for n in (None, 512, 1536, 123 << 20, 3 << 30)] == [
        "—", "512 B", "1.50 KiB", "123.0 MiB", "3.00 GiB",
    ]  # fmt: skip
    assert parse_bytes(human_bytes(3 << 30).replace(" ", "")) == 3 << 30


def test_policy_is_checked_before_any_model_is_touched(tmp_path):
    """A typo in the eviction policy fails in plan_engine's first step (the model path
    is not even resolved) and as the CLI parses it."""
    from ssdmoe_tui.engine.policy.policies import parse_policy
    from ssdmoe_tui.engine.run.open import plan_engine

    for ok in ("auto", "lru", "lfu-decay:0.8", "predict:4"):
        assert parse_policy(ok) == ok
    missing = tmp_path / "no-such-model"
    with pytest.raises(BadValueError, match="unknown cache policy 'nope'"):
        plan_engine(EngineOptions(model=str(missing), policy="nope"))


def test_check_text_names_lone_surrogates_and_escaped_bytes():
    """Text with a lone surrogate (from JSON, not argv) is one line too, not a crash of
    the error path itself."""
    import pytest

    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import check_text

    with pytest.raises(BadValueError, match=r"lone surrogate U\+D800 at character 2"):
        check_text("ab\ud800c")
    with pytest.raises(BadValueError, match=r"byte 0xe9 at character 0"):
        check_text("\udce9x")
    assert check_text("héllo") == "héllo"
