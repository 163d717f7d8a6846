#!/usr/bin/env python3
"""Does a verify chunk compute one-token decode's logits, plain and with exact verify
(engine/spec/exact.py), and what does exact verify cost? (issue 43 item 3)

    python scripts/exact_verify_probe.py --json OUT.json                   # the demo model
    python scripts/exact_verify_probe.py --arch qwen3_5_moe --dtype bfloat16 --json OUT.json

Two parts, one process:

1. logits: greedy-decode T tokens one at a time, keeping each position's logits; then
   walk the same positions again and, every STRIDE positions, feed the next k tokens
   (k = 2..5) as one chunk in each variant, compare its k rows with decode's, and give
   the chunk back (trim, or the recurrent state put back). Per (variant, k): the largest
   |chunk - decode| over the rows, the rows whose argmax differs (flips) and the top-2
   margin at each flip, and the median seconds of a chunk pass (built and evaluated).
   Variants: `plain` (the verify pass as it runs), `f32` (qwisp's recipe: the chunk's
   attention and conv1d in float32, no row splitting), `sdpa` (only the attention kernel
   split per query row: enough where the device's matmuls are row-invariant, and much
   cheaper than `mixers`), and the exact parts alone and together (`mixers`: token
   mixers token by token; `dense`: Linear / QuantizedLinear row by row; `norms`: RMSNorm
   row by row; `exact` = all three, what `--exact-verify` runs; `exact+experts`: the MoE
   blocks row by row too, each row its own expert call, should a device's gather_qmm
   depend on its batch). `decode_repeat` is decode against itself (0.0 unless the device
   is nondeterministic): the floor every variant is read against.
2. speed (`--speed-rounds` > 0): `bench --speculate`'s ABBA rounds (bench/speculate.py)
   with each configuration plain and exact side by side: ngram on the prompt and oracle:1,
   each at auto and depth 4; `ratio` is spec over plain tok/s, `same_tokens` whether
   greedy tokens equal plain greedy. `--speed-parts sdpa` (any parts) times another recipe.

What to read: `verdict` (one line: is plain verify decode here, and the cheapest variant
that is), `logits.<variant>.<k>.flips` (0 means the chunk's argmax was decode's at
every row compared) and `max_abs_diff` (0.0: bit-identical); `speed.rows` of both
verifies' `ratio`, `same_tokens`. On the CPU in float32 every variant but `f32` reads
0.0 (MLX's CPU kernels do not depend on the row count, but for Nemotron-H's Mamba mixer,
7e-06, and 0.438 in bfloat16); on MLX-CUDA plain read up to 0.28 on 2026-12-04.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

VARIANTS = {
    "plain": None,
    "f32": {"f32"},
    "sdpa": {"sdpa"},
    "mixers": {"mixers"},
    "dense": {"dense"},
    "norms": {"norms"},
    "mixers+dense": {"mixers", "dense"},
    "exact": {"mixers", "dense", "norms"},
    "exact+experts": {"mixers", "dense", "norms", "experts"},
}


def _model_path(args: argparse.Namespace, tmp: Path) -> Path:
    if args.model:
        return Path(args.model)
    if args.arch:
        from tests.helpers.checkpoints import build

        return build(args.arch, tmp / args.arch)
    from ssdmoe_tui.commands.common import resolve_model_path

    return Path(resolve_model_path(""))


def _prompt(sm, args: argparse.Namespace) -> list[int]:  # noqa: ANN001
    if args.prompt_file:
        from ssdmoe_tui.prompting.chat_format import prompt_tokens

        text = Path(args.prompt_file).read_text()
        return prompt_tokens(sm.tokenizer, [{"role": "user", "content": text}])
    if args.arch:  # a random checkpoint's tokenizer: a repeating prompt, as the tests use
        return [5, 6, 7, 8, 9, 10, 11, 12] * 6
    from ssdmoe_tui.bench.bench import fixed_prompt

    return fixed_prompt(sm.tokenizer, args.prompt_tokens)


def _rewinder(cache: list, n: int):  # noqa: ANN202
    from ssdmoe_tui.engine.run.prefill_stop import ChunkUndo
    from ssdmoe_tui.engine.spec.verify import TRIM, UNDO, rewind_mode

    mode = rewind_mode(cache, n)
    if mode == TRIM:
        return lambda: [c.trim(n) for c in cache]
    if mode == UNDO:
        return ChunkUndo(cache).restore
    raise SystemExit("this model's cache cannot give a chunk back (a window that evicts)")


def logits_part(sm, prompt: list[int], args: argparse.Namespace) -> dict:  # noqa: ANN001
    """Part 1 (see the module's docstring)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from ssdmoe_tui.engine.spec.exact import ExactVerify

    model, T, ks = sm.model, args.positions, list(range(2, args.max_k + 1))
    exacts = {n: (None if p is None else ExactVerify(model, p)) for n, p in VARIANTS.items()}
    counts = exacts["exact"].counts

    def prefill() -> tuple[list, int]:
        cache = make_prompt_cache(model)
        last = mx.argmax(model(mx.array(prompt)[None], cache=cache)[0, -1])
        mx.eval(last, [c.state for c in cache])
        return cache, int(last.item())

    def step(cache: list, tok: int) -> mx.array:
        out = model(mx.array([[tok]], dtype=mx.uint32), cache=cache)[0, -1].astype(mx.float32)
        mx.eval(out)
        return out

    # phase 1: greedy tokens and each position's decode logits. Position i's logits are
    # those after feeding toks[i]; toks[0] is the prompt's greedy next token.
    cache, first = prefill()
    toks = [first]
    dec: list[mx.array] = []
    for _ in range(T + args.max_k):
        dec.append(step(cache, toks[-1]))
        toks.append(int(mx.argmax(dec[-1])))
    # phase 2: the same walk; chunks at every STRIDE-th position, given back
    cache, _ = prefill()
    res: dict = {n: {k: {"rows": 0, "flips": 0, "max_abs_diff": 0.0, "flip_margins": [],
                         "pass_s": []} for k in ks} for n in exacts}  # fmt: skip
    res["decode_repeat"] = {1: {"rows": 0, "flips": 0, "max_abs_diff": 0.0, "flip_margins": [],
                                "pass_s": []}}  # fmt: skip
    for i in range(T):
        if i % args.stride == 0:
            for k in ks:
                want = mx.stack(dec[i : i + k])
                for name, ex in exacts.items():
                    undo = _rewinder(cache, k)
                    x = mx.array(toks[i : i + k], dtype=mx.uint32)[None]
                    t0 = time.perf_counter()
                    if ex is None:
                        got = model(x, cache=cache)[0]
                    else:
                        with ex.rows():
                            got = model(x, cache=cache)[0]
                    got = got.astype(mx.float32)
                    mx.eval(got, [c.state for c in cache])
                    dt = time.perf_counter() - t0
                    undo()
                    _score(res[name][k], got, want, dt)
        again = step(cache, toks[i])  # the walk itself: decode against decode
        _score(res["decode_repeat"][1], again[None], dec[i][None], 0.0)
    out = {}
    for name, by_k in res.items():
        out[name] = {}
        for k, r in by_k.items():
            m = r.pop("flip_margins")
            p = r.pop("pass_s")
            r["flip_margins_max"] = round(max(m), 5) if m else None
            r["flip_margins"] = [round(v, 5) for v in m[:20]]
            r["pass_ms"] = round(statistics.median(p) * 1e3, 3) if p else None
            r["max_abs_diff"] = round(r["max_abs_diff"], 6)
            out[name][str(k)] = r
    for name in VARIANTS:  # the pass's cost against plain, per k
        for k in ks:
            a, b = out[name][str(k)]["pass_ms"], out["plain"][str(k)]["pass_ms"]
            out[name][str(k)]["pass_vs_plain"] = round(a / b, 3) if a and b else None
    return {"positions": T, "stride": args.stride, "modules_split": counts, "variants": out,
            "logit_std": round(float(mx.std(mx.stack(dec)).item()), 4)}  # fmt: skip


def _score(r: dict, got, want, dt: float) -> None:  # noqa: ANN001
    import mlx.core as mx

    r["rows"] += got.shape[0]
    r["max_abs_diff"] = max(r["max_abs_diff"], float(mx.max(mx.abs(got - want)).item()))
    ga, wa = mx.argmax(got, axis=-1).tolist(), mx.argmax(want, axis=-1).tolist()
    for j, (a, b) in enumerate(zip(ga, wa, strict=True)):
        if a != b:
            r["flips"] += 1
            top = mx.sort(want[j])[-2:].tolist()
            r["flip_margins"].append(top[1] - top[0])
    if dt:
        r["pass_s"].append(dt)


def verdict(variants: dict) -> str:
    """One line: whether plain verify is decode's here, and the cheapest variant that is
    (bit-identical logits at every row compared), with its chunk cost against plain's."""

    def same(name: str) -> bool:
        return all(r["flips"] == 0 and r["max_abs_diff"] == 0.0 for r in variants[name].values())

    def cost(name: str) -> str:
        c = [r.get("pass_vs_plain") for r in variants[name].values() if r.get("pass_vs_plain")]
        return f" (a chunk {min(c):.2f}-{max(c):.2f}x plain's)" if c else ""

    if not all(r["max_abs_diff"] == 0.0 for r in variants["decode_repeat"].values()):
        return "decode is not deterministic on this device: nothing can equal it"
    head = "plain verify IS decode here" if same("plain") else "plain verify is NOT decode here"
    for name in ("sdpa", "mixers", "mixers+dense", "exact", "exact+experts"):
        if same(name):
            return f"{head}; the cheapest exact variant: {name}{cost(name)}"
    return f"{head}; no variant equals decode (exact+experts neither): read the figures"


def speed_part(runner, prompt: list[int], args: argparse.Namespace, log) -> dict:  # noqa: ANN001
    """Part 2: bench/speculate.py's rounds, plain and exact verify side by side."""
    from ssdmoe_tui.bench.speculate import run_speculate
    from ssdmoe_tui.engine.spec.exact import ExactVerify
    from ssdmoe_tui.engine.spec.loop import memory
    from ssdmoe_tui.options import Speculation

    if args.speed_parts:  # the exact rows split these parts instead of the flag's
        memory(runner).exact = ExactVerify(runner.sm.model, set(args.speed_parts.split(",")))
    out = {}
    for name, specs, depths in (
        ("ngram", [Speculation("ngram")], [None, 4]),
        ("oracle", [Speculation("oracle", None, 1.0)], [None, 4]),
    ):
        if name not in args.speed_modes.split(","):
            continue
        out[name] = run_speculate(
            runner, prompt, args.decode_tokens, specs, depths, args.speed_rounds, log, exact=True
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", default="", help="a model folder (default: the embedded demo)")
    ap.add_argument(
        "--arch",
        default=None,
        help="a small random checkpoint of this family instead (tests/helpers)",
    )
    ap.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: the device's)")
    ap.add_argument("--expert-cache", default="auto")
    ap.add_argument("--prompt-file", default=None)
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--positions", type=int, default=48,
                    help="decode positions walked (0: the speed part only)")  # fmt: skip
    ap.add_argument("--stride", type=int, default=4, help="a chunk every STRIDE positions")
    ap.add_argument("--max-k", type=int, default=5)
    ap.add_argument("--speed-rounds", type=int, default=3, help="0: the logits part only")
    ap.add_argument("--decode-tokens", type=int, default=200)
    ap.add_argument("--speed-modes", default="ngram,oracle", help="drafters the speed part runs")
    ap.add_argument(
        "--speed-parts",
        default=None,
        help="the exact rows split these parts (e.g. sdpa) instead of --exact-verify's "
        "mixers,dense,norms: what a cheaper recipe would cost, once the logits part shows "
        "it exact on this device",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import mlx.core as mx

    from ssdmoe_tui.engine.experts.device_memory import is_cuda
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result: dict = {"device": str(mx.default_device()), "cuda": is_cuda(),
                    "mlx": mx.__version__, "load": os.getloadavg()[0]}  # fmt: skip

    def save() -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        path = _model_path(args, Path(tmp))
        sm = load_streamed(path, expert_cache=args.expert_cache, dtype=args.dtype)
        result.update(model=str(path), arch=args.arch or sm.config.get("model_type"),
                      dtype=str(args.dtype or "device default"))  # fmt: skip
        prompt = _prompt(sm, args)
        result["prompt_tokens"] = len(prompt)
        if args.positions > 0:
            t0 = time.perf_counter()
            result["logits"] = logits_part(sm, prompt, args)
            result["logits"]["seconds"] = round(time.perf_counter() - t0, 1)
            result["verdict"] = verdict(result["logits"]["variants"])
            save()
            for name, by_k in result["logits"]["variants"].items():
                log(f"{name:>14}: " + "  ".join(
                    f"k{k} flips {r['flips']}/{r['rows']} max {r['max_abs_diff']:.3g}"
                    + (f" {r['pass_vs_plain']}x" if r.get("pass_vs_plain") else "")
                    for k, r in by_k.items()))  # fmt: skip
            log(f"verdict: {result['verdict']}")
        if args.speed_rounds > 0:
            from ssdmoe_tui.engine.spec.exact import device_parts

            result["speed_parts"] = args.speed_parts or ",".join(sorted(device_parts()))
            result["speed"] = speed_part(Runner(sm), prompt, args, log)
            for name, res in result["speed"].items():
                for r in res["rows"]:
                    log(f"{name:>7} {r['speculate']:<9} {r['depth']!s:<4} "
                        f"{'exact' if r['exact_verify'] else 'plain'}: ratio {r['ratio']} "
                        f"(cpu {r['cpu_ratio']}) accept {r['acceptance']} "
                        f"same {r['same_tokens']}")  # fmt: skip
        result["load_after"] = os.getloadavg()[0]
        save()
        sm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
