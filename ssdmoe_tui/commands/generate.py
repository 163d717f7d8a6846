"""`ssdmoe generate`: one prompt, streamed to stdout (or one JSON object with --json)."""

from __future__ import annotations

import argparse
import json
import sys

from ssdmoe_tui.commands.common import (
    add_distributed_argument,
    add_model_arguments,
    resolve_model_path,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate a reply to one prompt")
    add_model_arguments(p)
    p.add_argument("--prompt", required=True, help="the prompt ('-' reads stdin)")
    p.add_argument("--system", default=None, help="system prompt (chat template only)")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--raw", action="store_true", help="tokenize the prompt as given (no chat template)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--prefill-step",
        type=int,
        default=None,
        help="prefill chunk in tokens (default: from memory, at most 2048)",
    )
    p.add_argument(
        "--trace", default=None, help="record (token, layer, experts) routing to this file"
    )
    add_distributed_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.distributed:
        return _run(args, None)
    from ssdmoe_tui.engine.distributed import check_args, start

    check_args(args)
    dist = start()
    with dist.guard():
        return _run(args, dist)


def _run(args: argparse.Namespace, dist) -> int:
    import mlx.core as mx
    from mlx_lm.sample_utils import make_sampler

    from ssdmoe_tui.engine.loader import load_streamed
    from ssdmoe_tui.engine.runner import Runner
    from ssdmoe_tui.errors import BadValueError

    prompt_text = sys.stdin.read() if args.prompt == "-" else args.prompt
    from ssdmoe_tui.models.lock import acquire_model_lock

    quiet = dist is not None and not dist.is_root  # only rank 0 talks to the user
    path = resolve_model_path(args.model, quiet=args.json or quiet)
    lock = None  # held until exit: one loaded model per machine (one rank per machine)
    if dist is None or dist.first_on_host():
        lock = acquire_model_lock(str(path))
    sm = load_streamed(
        path,
        expert_cache=args.expert_cache,
        k=args.k,
        dtype=args.dtype,
        reader=args.reader,
        direct_io=args.direct_io,
        prefetch=args.prefetch,
        experts=args.experts,
        distributed=dist,
    )
    runner = Runner(sm, prefill_step_size=args.prefill_step)
    if args.k is not None:
        runner.k = args.k
    if args.prefill_k is not None:
        if not 1 <= args.prefill_k <= sm.index.num_experts:
            raise BadValueError(
                f"--prefill-k {args.prefill_k} is outside 1..{sm.index.num_experts}"
            )
        runner.prefill_k = args.prefill_k
    tok = sm.tokenizer
    if args.raw or not getattr(tok, "chat_template", None):
        prompt = list(tok.encode(prompt_text))
    else:
        msgs = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": prompt_text}
        ]
        prompt = list(tok.apply_chat_template(msgs, add_generation_prompt=True))
    if not prompt:
        raise BadValueError("the prompt is empty")
    if args.seed is not None:
        mx.random.seed(args.seed)
    writer = None
    if args.trace:
        from ssdmoe_tui.engine.traces import TraceWriter

        writer = TraceWriter(
            args.trace,
            {
                "model": str(path),
                "model_type": sm.model_type,
                "k": runner.k,
                "num_layers": sm.index.num_layers,
                "num_experts": sm.index.num_experts,
            },
        )
        from ssdmoe_tui.engine.traces import DECODE, PREFILL

        counter = {"token": 0, "phase": PREFILL}
        sm.cache.on_route = lambda layer, experts: writer.add(
            counter["token"], layer, [int(e) for e in experts], phase=counter["phase"]
        )

    meter = dist.meter(sm) if dist is not None else None

    def on_token(tok_id: int, piece: str, stats) -> None:
        if meter is not None:
            meter.on_token(stats.generated_tokens)
        if quiet:
            return
        if writer is not None:
            counter["token"] += 1
            counter["phase"] = DECODE
        if not args.json and piece:
            sys.stdout.write(piece)
            sys.stdout.flush()

    sampler = make_sampler(args.temp, top_p=args.top_p)
    result = runner.generate(
        prompt,
        max_tokens=args.max_tokens,
        sampler=dist.wrap_sampler(sampler) if dist is not None else sampler,
        on_token=on_token,
    )
    if writer is not None:
        writer.close()
    if lock is not None:
        lock.release()
    dist_stats = None
    if dist is not None:
        dist_stats = dist.run_stats(sm, meter, len(result.tokens) - 1)
        if quiet:
            return 0
    stats = result.stats.as_dict()
    stats["reader"] = sm.cache.reader.name
    stats["slot_placement"] = sm.cache.placement.placement
    stats["expert_source"] = sm.expert_source
    stats["expert_cache_budget_bytes"] = sm.cache.budget_bytes
    stats["dtype"] = str(sm.dtype).removeprefix("mlx.core.")
    c = sm.cache.counters
    if args.prefetch:
        stats["prefetch"] = {
            "issued": c.prefetch_issued,
            "used": c.prefetch_used,
            "precision": round(c.prefetch_used / c.prefetch_issued, 4)
            if c.prefetch_issued
            else 0.0,
            "recall": round(c.prefetch_used / c.misses, 4) if c.misses else 0.0,
            "wait_s": round(c.prefetch_wait_s, 4),
        }
    if dist_stats is not None:
        stats["distributed"] = dist_stats
    if args.json:
        print(
            json.dumps(
                {
                    "model": str(path),
                    "prompt_token_ids": list(prompt),
                    "token_ids": result.tokens,
                    "text": result.text,
                    "finish_reason": result.finish_reason,
                    "k": runner.k,
                    "prefill_k": runner.prefill_k or runner.k,
                    "k_per_token": result.stats.k_per_token,
                    "stats": stats,
                }
            )
        )
    else:
        sys.stdout.write("\n")
        s = result.stats
        print(
            f"[{s.prompt_tokens} prompt tok, {s.prefill_tok_s:.1f} tok/s prefill | {s.generated_tokens} tok, "
            f"{s.decode_tok_s:.1f} tok/s | {s.ssd_mib_per_token():.2f} MiB/tok from SSD | "
            f"expert cache hit {s.hit_rate:.1%} | K={runner.k}]",
            file=sys.stderr,
        )
        if dist_stats is not None:
            from ssdmoe_tui.engine.distributed import summary_line

            print(summary_line(dist_stats), file=sys.stderr)
    return 0
