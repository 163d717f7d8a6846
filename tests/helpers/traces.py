"""Real routing traces cut to a small model's layers (and, for tests, to a few decode
steps), written in the documented moe-routing-jsonl layout so that reader runs too.
Used by the trace-routing tests and by scripts/batch_bench.py."""

from __future__ import annotations

import json
from pathlib import Path

from ssdmoe_tui.engine.policy.traces import DECODE, read_trace
from ssdmoe_tui.models.demo import write_checkpoint
from tests.helpers.checkpoints import QWEN3_MOE
from tests.helpers.fixture_paths import TRACES

ROUTES = TRACES / "bigmoeonedge-route-trace" / "2026-07-15-route-trace"
QWEN, GPTOSS = ROUTES / "qwen.route.csv", ROUTES / "gptoss.route.csv"


def shaped_checkpoint(out: Path, layers: int, k: int) -> Path:
    """A tiny qwen3_moe checkpoint in `out` with a trace's MoE layers, 128 experts and K
    (what trace-driven routing needs to route it)."""
    cfg = dict(QWEN3_MOE, num_hidden_layers=layers, num_experts=128, num_experts_per_tok=k)
    cfg.update(hidden_size=64, head_dim=16, moe_intermediate_size=32, vocab_size=256)
    return write_checkpoint(cfg, out, seed=1, group_size=32, max_shard_bytes=8 << 20)


def cut_trace(src: Path, dst: Path, layers: int, decode_steps: int | None = None) -> Path:
    """`src`'s first `layers` MoE layers and first `decode_steps` decode steps (every step
    when None) in `dst`; `src` itself when that would keep all of it."""
    trace = read_trace(src)
    meta = trace.meta
    if layers >= meta.num_layers and decode_steps is None:
        return src
    lines = [{"format": "moe-routing-jsonl", "model": meta.model, "k": meta.k,
              "num_layers": layers, "num_experts": meta.num_experts}]  # fmt: skip
    decode = 0
    for step in trace.steps:
        if step.phase == DECODE:
            if decode == decode_steps:
                break
            decode += 1
        phase = "decode" if step.phase == DECODE else "prefill"
        # a prompt recorded token by token stays so (trace_routing.py routes by it)
        rows = (
            [(step.token + i, part) for i, part in enumerate(step.parts)]
            if step.parts is not None and len(step.parts) > 1
            else [(step.token, step.layers)]
        )
        for token, cells in rows:
            for layer, ids in cells:
                if layer < layers:
                    lines.append(
                        {"token": token, "layer": layer, "experts": list(ids), "phase": phase}
                    )
    dst.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return dst
