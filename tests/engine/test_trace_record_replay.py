"""A trace the engine records (`generate --trace`) and routes by (`--routing-trace`)
use the same step convention: replaying the model's own routing reproduces it
step for step, and the same tokens (the routed weights are the router's own)."""

from __future__ import annotations

import json

from ssdmoe_tui.engine.policy.traces import DECODE, read_trace


def _decode_steps(path):
    return [
        (s.token, [(layer, sorted(ids)) for layer, ids in s.layers])
        for s in read_trace(path).steps
        if s.phase == DECODE
    ]


def test_recorded_trace_routes_back_to_the_same_steps_and_tokens(checkpoints, tmp_path, capsys):
    from ssdmoe_tui.cli import main

    model = checkpoints("qwen3_moe")
    own, replayed = tmp_path / "own.jsonl", tmp_path / "replayed.jsonl"
    base = ["generate", "--model", str(model), "--prompt", "one two three four five",
            "--raw", "--max-tokens", "6", "--json"]  # fmt: skip
    assert main([*base, "--trace", str(own)]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*base, "--routing-trace", str(own), "--trace", str(replayed)]) == 0
    second = json.loads(capsys.readouterr().out)

    steps = _decode_steps(own)
    assert steps and steps[0][0] == 0  # the last prompt token is decode step 0
    assert _decode_steps(replayed) == steps
    assert second["token_ids"] == first["token_ids"]


def test_ignore_eos_records_past_the_end_of_the_reply(tmp_path, capsys):
    """The trained demo ends its reply early (greedy: 22 tokens here); `--ignore-eos`
    keeps going to --max-tokens with the same first tokens, and the trace holds every
    step (issue 24 item 3: routing traces thousands of tokens long)."""
    from ssdmoe_tui.cli import main
    from ssdmoe_tui.models.demo import ensure_demo_model

    demo = ensure_demo_model(tmp_path / "demo")
    base = ["generate", "--model", str(demo), "How do I quit vim?", "--json"]
    assert main([*base, "--max-tokens", "200"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert short["finish_reason"] == "stop" and short["ignore_eos"] is False
    n = len(short["token_ids"])
    assert n < 200
    trace = tmp_path / "long.jsonl"
    assert main([*base, "--max-tokens", str(n + 40), "--ignore-eos", "--trace", str(trace)]) == 0
    long = json.loads(capsys.readouterr().out)
    assert long["finish_reason"] == "length" and long["ignore_eos"] is True
    assert len(long["token_ids"]) == n + 40
    assert long["token_ids"][:n] == short["token_ids"]  # the EOS included, then more
    recorded = read_trace(trace)
    assert recorded.meta.extra["ignore_eos"] is True
    assert recorded.decode_steps() == n + 40
    # `trace replay --decode-tokens` replays the head of the same recording
    out = tmp_path / "head.json"
    argv = ["trace", "replay", str(trace), "--policy", "lru,belady", "--budget", "4"]
    assert main([*argv, "--decode-tokens", str(n), "--json", str(out)]) == 0
    head = json.loads(out.read_text())
    assert head["decode_steps"] == n
    assert all(r["lookups"] == n * 4 * recorded.meta.k for r in head["results"])
    assert main([*argv, "--decode-tokens", "0"]) == 1
    assert "--decode-tokens must be >= 1, got 0" in capsys.readouterr().err
