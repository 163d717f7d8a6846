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
