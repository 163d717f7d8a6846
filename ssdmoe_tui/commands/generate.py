"""`ssdmoe generate`: one prompt, streamed to stdout (or one JSON object with --json)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from ssdmoe_tui.commands.common import (
    add_distributed_argument,
    add_model_arguments,
    add_prefill_step_argument,
    add_sampling_arguments,
    add_speculate_arguments,
    arg_type,
    distributed_run,
    engine_options,
    read_prompt,
    sampling_options,
)
from ssdmoe_tui.terminal_text import visible


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate a reply to one prompt")
    add_model_arguments(p)
    p.add_argument(
        "text", nargs="?", default=None, metavar="PROMPT", help="the prompt (or --prompt)"
    )
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="the prompt ('-' reads stdin; without a prompt, piped stdin is read); give it "
        "several times for several sequences (see --batch)",
    )
    p.add_argument("--system", default=None, help="system prompt (chat template only)")
    add_sampling_arguments(p)
    p.add_argument(
        "--raw", action="store_true", help="tokenize the prompt as given (no chat template)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    add_prefill_step_argument(p)
    p.add_argument(
        "--trace", default=None, help="record (token, layer, experts) routing to this file"
    )
    p.add_argument(
        "--ignore-eos", action="store_true",
        help="keep generating past end-of-sequence until --max-tokens (long --trace "
        "recordings; the text after it is the model's continuation, not a reply)",
    )  # fmt: skip
    p.add_argument(
        "--batch", type=arg_type(_batch_size), default=None, metavar="N",
        help="decode N sequences together (the prompts given, repeated to N; sequence i "
        "samples with seed + i): each one's text and figures, and the batch's",
    )  # fmt: skip
    add_speculate_arguments(p)
    add_distributed_argument(p)
    p.set_defaults(func=distributed_run(_run))


def _batch_size(text: str) -> int:
    from ssdmoe_tui.options import parse_positive

    return parse_positive(text, "--batch")


def prompt_argument(args: argparse.Namespace) -> list[str]:
    """The prompts as given: `ssdmoe generate "text"`, `--prompt text` (repeatable),
    `--prompt -`, or piped stdin when none is given. One line when there is none, or
    both forms."""
    import sys

    from ssdmoe_tui.errors import BadValueError

    if args.text is not None and args.prompt:
        raise BadValueError("give the prompt once: as an argument or with --prompt, not both")
    if args.text is not None:
        return [args.text]
    if args.prompt:
        return list(args.prompt)
    if not sys.stdin.isatty():
        return ["-"]
    raise BadValueError('no prompt: ssdmoe generate "your prompt" (or pipe it in on stdin)')


def _run(args: argparse.Namespace, dist) -> int:
    """`dist`: this rank of an expert-parallel launch (only rank 0 talks to the user)."""
    from ssdmoe_tui.commands.common import speculation
    from ssdmoe_tui.engine.run.open import load_engine, memory_need, plan_engine
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.models.lock import acquire_model_lock
    from ssdmoe_tui.models.resolve import cli_progress

    spec = speculation(args)  # a bad value is one line before anything loads
    texts = [read_prompt(t) for t in prompt_argument(args)]
    batched = args.batch is not None or len(texts) > 1
    if spec.on and (batched or dist is not None):
        raise BadValueError("--speculate: not with --batch, several --prompt or --distributed")
    if batched and (dist is not None or args.trace):
        raise BadValueError("--batch / several --prompt: not with --distributed or --trace")

    quiet = dist is not None and not dist.is_root

    def say(msg: str) -> None:
        if not (args.json or quiet):
            print(msg, file=sys.stderr, flush=True)

    def notice(msg: str) -> None:
        if not quiet:
            print(f"ssdmoe: note: {msg}", file=sys.stderr, flush=True)

    plan = plan_engine(
        engine_options(args), say=say, download=None if (args.json or quiet) else cli_progress()
    )
    lock = None  # held until exit: one loaded model per machine (one rank per machine)
    if dist is None or dist.first_on_host():
        lock = acquire_model_lock(str(plan.path), need_bytes=memory_need(plan))
    try:
        runner = load_engine(plan, notice=notice, distributed=dist)
        if args.ignore_eos:
            runner.sm.tokenizer.eos_token_ids = set()  # as the bench: exactly --max-tokens
        runner.sm.measure_routing_mass()  # the stats it prints carry the router mass
        if spec.mode == "mtp":
            from ssdmoe_tui.engine.spec.mtp import check_mtp

            check_mtp(runner.sm.config, runner.sm.path)
        try:
            if batched:
                return _generate_batch(args, runner, texts, plan.path)
            return _generate(args, runner, texts[0], plan.path, dist)
        finally:
            runner.close()
    finally:
        if lock is not None:
            lock.release()


def _generate(args, runner, prompt_text: str, path, dist=None) -> int:
    import mlx.core as mx

    sm = runner.sm
    prompt = _prompt_ids(args, sm, prompt_text)
    if args.seed is not None:
        mx.random.seed(args.seed)
    quiet = dist is not None and not dist.is_root
    # every rank sees the same routing: rank 0 records it
    trace = (
        _RouteTrace(args.trace, runner, path, ignore_eos=args.ignore_eos)
        if args.trace and not quiet
        else None
    )
    meter = dist.meter(sm) if dist is not None else None
    try:
        result = _stream(args, runner, prompt, dist, meter, trace, quiet)
    finally:
        if trace is not None:
            trace.writer.close()
    stats = runner.stats_dict(result.stats)
    if dist is not None:
        stats["distributed"] = dist.run_stats(sm, meter, len(result.tokens) - 1)
        if quiet:
            return 0
    if args.json:
        _print_json(runner, path, prompt, result, stats, args.ignore_eos)
    else:
        sys.stdout.write("\n")
        _print_summary(runner, result, stats, dist)
    return 0


class _RouteTrace:
    """`--trace`: every layer's routed experts, by token and phase (engine/policy/traces.py)."""

    def __init__(self, trace_path, runner, path, *, ignore_eos: bool = False) -> None:  # noqa: ANN001
        from ssdmoe_tui.engine.policy.traces import DECODE, PREFILL, TraceWriter

        sm = runner.sm
        self.writer = TraceWriter(
            trace_path,
            {
                "model": str(path),
                "model_type": sm.model_type,
                "k": runner.k,
                "num_layers": sm.index.num_layers,
                "num_experts": sm.index.num_experts,
                "ignore_eos": ignore_eos,
            },
        )
        self.token, self.phase, self.decode = 0, PREFILL, DECODE
        sm.cache.on_route = lambda layer, experts: self.writer.add(
            self.token, layer, [int(e) for e in experts], phase=self.phase
        )


def _stream(args, runner, prompt: list[int], dist, meter, trace: _RouteTrace | None, quiet: bool):  # noqa: ANN001, ANN202
    """Run the prompt, writing the text as it comes (unless --json); the GenerationResult."""
    from ssdmoe_tui.commands.common import speculation
    from ssdmoe_tui.engine.run.runner import Done, PrefillProgress, TokenEvent
    from ssdmoe_tui.engine.run.sampling import sampler_for

    result = None
    sampling = sampling_options(args)
    sampler = sampler_for(sampling)
    for ev in runner.stream(
        prompt,
        max_tokens=sampling.max_tokens,
        sampler=dist.wrap_sampler(sampler) if dist is not None else sampler,
        speculate=speculation(args),
    ):
        if isinstance(ev, PrefillProgress) and trace is not None and ev.done >= ev.total - 1:
            # The last prompt token runs alone, as the first decode step: record it
            # as decode step 0, which is how trace routing reads a trace back.
            trace.phase = trace.decode
        if isinstance(ev, TokenEvent) and meter is not None:
            meter.on_token(ev.stats.generated_tokens)
        if isinstance(ev, TokenEvent) and not quiet:
            if trace is not None:
                trace.token += 1
                trace.phase = trace.decode
            if not args.json and ev.text:
                sys.stdout.write(_for_stdout(ev.text))
                sys.stdout.flush()
        elif isinstance(ev, Done):
            result = ev.result
    return result


def _for_stdout(text: str) -> str:
    """The model's text as written: exact into a pipe or a file, its control characters
    escaped on a terminal (an ESC the model wrote must not drive the user's terminal)."""
    return visible(text) if sys.stdout.isatty() else text


def _print_json(runner, path, prompt: list[int], result, stats: dict, ignore_eos: bool) -> None:  # noqa: ANN001
    """`--json`: the ids, the text and the run's figures, one object on stdout."""
    print(
        json.dumps(
            {
                "model": str(path),
                "prompt_token_ids": list(prompt),
                "token_ids": result.tokens,
                "text": result.text,
                "finish_reason": result.finish_reason,
                "ignore_eos": ignore_eos,
                "k": runner.k,
                "prefill_k": runner.prefill_k or runner.k,
                "k_per_token": result.stats.k_per_token,
                "stats": stats,
            }
        )
    )


def _print_summary(runner, result, stats: dict, dist) -> None:  # noqa: ANN001
    """The run's one-line summary (and the distributed one) on stderr."""
    s = result.stats
    print(
        f"[{s.prompt_tokens} prompt tok, {s.prefill_tok_s:.1f} tok/s prefill | {s.generated_tokens} tok, "
        f"{s.decode_tok_s:.1f} tok/s | {s.ssd_mib_per_token():.2f} MiB/tok from SSD | "
        f"expert cache hit {s.hit_rate:.1%} | K={runner.k}{_routed(stats)}]",
        file=sys.stderr,
    )
    sp = stats.get("speculation")
    if sp:
        acc = "-" if sp["acceptance"] is None else f"{sp['acceptance']:.0%}"
        print(
            f"[speculation {sp['mode']}: {sp['accepted']}/{sp['drafted']} drafts accepted ({acc}) "
            f"| {sp['tokens_per_pass']} tok/pass | {sp['bytes_per_token'] / 2**20:.2f} MiB and "
            f"{sp['ms_per_token']:.1f} ms per token]",
            file=sys.stderr,
        )
    if dist is not None:
        from ssdmoe_tui.engine.distributed.stats import summary_line

        print(summary_line(stats["distributed"]), file=sys.stderr)


def _prompt_ids(args, sm, text: str) -> list[int]:
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.prompting.chat_format import prompt_tokens

    msgs = [{"role": "system", "content": args.system}] if args.system and not args.raw else []
    msgs.append({"role": "user", "content": text})
    prompt = prompt_tokens(sm.tokenizer, msgs, raw=args.raw)
    if not prompt:
        raise BadValueError("the prompt is empty")
    return prompt


def _generate_batch(args, runner, texts: list[str], path) -> int:
    """N sequences through the batched decoder (engine/run/batch.py)."""
    from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec
    from ssdmoe_tui.engine.run.runner import Done
    from ssdmoe_tui.engine.run.sampling import sampler_for

    sm = runner.sm
    n = max(args.batch or len(texts), len(texts))
    prompts = [_prompt_ids(args, sm, texts[i % len(texts)]) for i in range(n)]
    batch = BatchRunner(runner, max_batch=args.batch or n)
    sampling = sampling_options(args)
    for i, prompt in enumerate(prompts):
        row = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + i)
        sampler = sampler_for(row, own_key=True)
        batch.add(SeqSpec(i, prompt, max_tokens=row.max_tokens, sampler=sampler))
    t0 = time.perf_counter()
    results = {}
    for uid, ev in batch.drain():
        if isinstance(ev, Done):
            results[uid] = ev.result
            if not args.json:
                sys.stdout.write(f"--- sequence {uid}\n{_for_stdout(ev.result.text)}\n")
                sys.stdout.flush()
    wall = time.perf_counter() - t0
    figures = batch.figures.as_dict(0, 0)
    figures["wall_s"] = round(wall, 3)
    if args.json:
        seqs = [
            {
                "prompt_token_ids": prompts[i],
                "token_ids": r.tokens,
                "text": r.text,
                "finish_reason": r.finish_reason,
                "k_per_token": r.stats.k_per_token,
                "stats": runner.stats_dict(r.stats),
            }
            for i, r in sorted(results.items())
        ]
        print(json.dumps({"model": str(path), "k": runner.k, "sequences": seqs, "batch": figures}))
        return 0
    for i, r in sorted(results.items()):
        s = r.stats
        print(
            f"[sequence {i}: {s.prompt_tokens} prompt tok, {s.prefill_tok_s:.1f} tok/s prefill | "
            f"{s.generated_tokens} tok, {s.decode_tok_s:.1f} tok/s | "
            f"{s.requested_mib_per_token():.2f} MiB/tok asked | {r.finish_reason}]",
            file=sys.stderr,
        )
    print(
        f"[batch: {n} sequences, up to {figures['max_rows']} together, mean "
        f"{figures['mean_rows']} per step | aggregate {figures['aggregate_decode_tok_s']} tok/s | "
        f"{figures['requested_mib_per_token_per_sequence']} MiB/tok/sequence asked | union "
        f"{figures['union_experts_per_layer']} experts/layer | join stall <= "
        f"{figures['max_join_stall_s'] * 1e3:.0f} ms | K={runner.k}]",
        file=sys.stderr,
    )
    return 0


def _routed(stats: dict) -> str:
    """The stats line's trace-routing label: the tokens are not the model's own."""
    if stats.get("routing", "model") == "model":
        return ""
    wraps = stats.get("routing_wraps", 0)
    wrapped = f", wrapped {wraps}x" if wraps else ""
    return f" | routed by {stats['routing']}{wrapped}: not the model's own tokens"
