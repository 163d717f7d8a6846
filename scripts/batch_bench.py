"""Batched decode, B = 1, 2, 4, 8: aggregate and per-stream tok/s, MiB/token per sequence,
model routing and trace-driven routing (issue 20; docs/benchmarks.md "Batched decode").

Builds (once) a qwen3_moe checkpoint with the Qwen3-30B-A3B trace's 128 experts, cuts the
real Qwen3-30B-A3B routing trace (tests/fixtures/traces, K=6) to its layers, and runs
`ssdmoe bench --batch` twice: the model's own router (random weights: close to uniform
routing) and the trace (each row starts at another offset of it, len(trace) * i / B). One
bench process per routing; every B on a fresh engine.

CPU (this VM; small widths, 12 layers):

    python scripts/batch_bench.py --out /tmp/bb --layers 12 --hidden 256 --cache 24M

H200 (the Qwen3-30B-A3B shape: the real config, all 48 layers; 4 GiB cache; wrap it in
scripts/gpu_batch_bench.sh for the 8 GiB host-memory cap):

    python3 scripts/batch_bench.py --out /root/bb --config \\
        tests/fixtures/models/qwen3-30b-a3b/config.json --cache 4G --decode-tokens 64 \\
        --check

`--join-tokens 1024` then lets a 1,024-token prompt join each B's rows (issue 43: its
stall of them, JSON `join_probe`). `--check` reruns every row alone afterwards and counts tokens that differ (GPU kernels may
change with the number of rows; on the CPU they do not).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = (
    ROOT / "tests/fixtures/traces/bigmoeonedge-route-trace/2026-07-15-route-trace/qwen.route.csv"
)


def build(out: Path, args) -> Path:  # noqa: ANN001
    """The checkpoint: the real config (GPU) or a small qwen3_moe with the trace's experts."""
    if (out / "config.json").exists():
        return out
    if args.config:
        cmd = [sys.executable, "-m", "ssdmoe_tui.cli", "demo-model", "--config", args.config,
               "--out", str(out), "--shard-size", "4G",
               "--tokenizer", str(Path(args.config).parent)]  # fmt: skip
        if args.layers:
            cmd += ["--layers", str(args.layers)]
        subprocess.run(cmd, check=True, cwd=ROOT)
        return out
    sys.path.insert(0, str(ROOT))
    from ssdmoe_tui.models.demo import write_checkpoint
    from tests.helpers.checkpoints import QWEN3_MOE

    cfg = dict(QWEN3_MOE, num_hidden_layers=args.layers or 12, num_experts=128,
               num_experts_per_tok=8, hidden_size=args.hidden, head_dim=32,
               num_attention_heads=max(args.hidden // 64, 2), num_key_value_heads=2,
               moe_intermediate_size=args.hidden // 2, vocab_size=2048)  # fmt: skip
    return write_checkpoint(cfg, out, seed=1, group_size=32, max_shard_bytes=64 << 20)


def cut_trace(dst: Path, layers: int) -> Path:
    """The trace's first `layers` MoE layers, every step (moe-routing-jsonl)."""
    sys.path.insert(0, str(ROOT))
    from tests.helpers.traces import cut_trace as cut

    return cut(TRACE, dst, layers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument(
        "--model", type=Path, default=None, help="checkpoint folder (default OUT/model)"
    )
    ap.add_argument("--config", default=None, help="a real config.json (the GPU shape)")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=256, help="without --config: hidden size")
    ap.add_argument("--cache", default="24M")
    ap.add_argument("--batch", default="1,2,4,8")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--prefill-step", type=int, default=512)
    ap.add_argument("--routing", default="model,trace", help="model, trace, or both")
    ap.add_argument("--check", action="store_true", help="rerun each row alone (tokens equal?)")
    ap.add_argument("--join-tokens", type=int, default=0,
                    help="then an N-token prompt joins the B rows: the longest token gap "
                    "of a decoding row while it prefills (bench --batch-join)")  # fmt: skip
    ap.add_argument("--build-only", action="store_true", help="build the checkpoint and stop")
    args = ap.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    model = build(args.model or args.out / "model", args)
    if args.build_only:
        return 0
    cfg = json.loads((model / "config.json").read_text())
    layers = cfg.get("num_hidden_layers")
    trace = cut_trace(args.out / f"qwen-trace-{layers}.jsonl", layers)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for routing in args.routing.split(","):
        out = args.out / f"batch-{routing}.json"
        cmd = [sys.executable, "-m", "ssdmoe_tui.cli", "bench", "--model", str(model),
               "--expert-cache", args.cache, "--prompt-tokens", str(args.prompt_tokens),
               "--decode-tokens", str(args.decode_tokens), "--prefill-step",
               str(args.prefill_step), "--baseline", "skip", "--disk-mib", "16",
               "--batch", args.batch, "--json", str(out), "--markdown"]  # fmt: skip
        if routing == "trace":
            cmd += ["--routing-trace", str(trace)]
        else:
            cmd += ["--k", "6"]  # the trace's K, so both routings compare at one K
        if args.check:
            cmd.append("--batch-check")
        if args.join_tokens:
            cmd += ["--batch-join", str(args.join_tokens)]
        print("+", " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
        if rc != 0:
            print(f"bench ({routing}) exit {rc}", file=sys.stderr)
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
