"""`ssdmoe bench --speculate`: decode with and without speculation side by side, on one
engine, the runs alternating round by round so both see the same machine.

Each round runs the prompt once without speculation (greedy) and each (drafter, depth)
configuration once, in a Williams order (bench/order.py: over a cycle of rounds each run sits
at every place of a round and after every other run equally often; with one configuration
it is ABBA); a configuration's ratio is its decode tok/s over that round's plain run, the
row gives medians over the rounds. The oracle (`oracle[:P]`) drafts from
the first plain run's tokens, each draft token wrong with probability 1 - P
(engine/spec/drafts.py), aligned by context: where a reply leaves that run's tokens (on
MLX-CUDA a verify chunk flips near-ties) it drafts from any earlier run's reply it still
equals, else from the longest suffix match, else nothing; a row's `oracle_diverged_at`
says where each run left the first plain run. Every row says whether its tokens equal
the plain run's (greedy output must not change on CPU). With `--routing-trace` every run starts at the trace's
first step, so every run routes alike and the oracle's tokens stay the right ones.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ssdmoe_tui.bench.order import round_order
from ssdmoe_tui.options import Speculation

Log = Callable[[str], None]


@dataclass
class Run:
    tokens: list[int]
    decode_tok_s: float
    cpu_ms_per_token: float
    bytes_per_token: float
    spec: dict | None


def _restart_routing(sm) -> None:  # noqa: ANN001
    """A trace-driven engine starts the next run at the trace's first step."""
    from ssdmoe_tui.engine.policy.traces import PREFILL

    routing = sm.cache.routing
    if routing is not None:
        routing.position, routing.phase, routing.wraps, routing.chunk = -1, PREFILL, 0, None


def one_run(runner, prompt: list[int], n: int, spec: Speculation | None,
            reference: list[int], also: list[list[int]] | None = None) -> Run:  # noqa: ANN001  # fmt: skip
    """One greedy run of `n` tokens; figures over the decode (after the first token)."""
    from ssdmoe_tui.engine.run.runner import Done, Snapshot, TokenEvent

    sm = runner.sm
    _restart_routing(sm)
    first: tuple[Snapshot, float] | None = None
    last: tuple[Snapshot, float] | None = None
    result = None
    stream = runner.stream(
        prompt, max_tokens=n, speculate=spec, draft_reference=reference, draft_also=also or ()
    )
    for ev in stream:
        if isinstance(ev, TokenEvent):
            if ev.stats.generated_tokens == 1:
                first = (Snapshot.take(sm), time.process_time())
            if ev.stats.generated_tokens == n:
                last = (Snapshot.take(sm), time.process_time())
        elif isinstance(ev, Done):
            result = ev.result
    assert result is not None and first is not None and last is not None
    steps = max(n - 1, 1)
    d = last[0] - first[0]
    st = result.stats
    spec_fig = None
    if st.spec is not None:
        spec_fig = st.spec.as_dict(st.decode_requested_bytes, st.decode_s)
        from ssdmoe_tui.engine.spec.loop import acceptance_key

        rate = runner.spec_memory.acceptance[acceptance_key(spec)].rate
        spec_fig["governor_acceptance"] = round(rate, 4)
    return Run(
        result.tokens,
        steps / d.t if d.t > 0 else 0.0,
        (last[1] - first[1]) * 1e3 / steps,
        d.bytes_read / steps,
        spec_fig,
    )


def _label(spec: Speculation) -> str:
    return f"oracle:{spec.p:g}" if spec.mode == "oracle" else spec.mode


def run_speculate(
    runner,  # noqa: ANN001 - an open engine.run.runner.Runner
    prompt: list[int],
    decode_tokens: int,
    specs: list[Speculation],
    depths: list[int | None],
    rounds: int,
    log: Log,
    on_round: Callable[[dict], None] | None = None,
    exact: bool = False,
) -> dict:
    """Rounds of [plain, every (spec, depth)] on `runner`; a result dict with `rows`
    (`on_round` gets the result so far after each run: a timeout keeps it). `exact`:
    each configuration also with `--exact-verify`, next to it in every round."""
    sm = runner.sm
    sm.tokenizer.eos_token_ids = set()  # exactly decode_tokens tokens
    log("warm-up and reference: one plain greedy run")
    reference = one_run(runner, prompt, decode_tokens, None, []).tokens
    configs = [replace(s, depth=d) for s in specs for d in depths]
    if exact:
        configs = [x for c in configs for x in (c, replace(c, exact=True))]
    plain: list[Run] = []
    runs: dict[int, list[Run]] = {i: [] for i in range(len(configs))}
    also: list[list[int]] = []  # every other reply seen: the oracle drafts from them too

    def seen(run: Run) -> Run:
        if run.tokens != reference and run.tokens not in also:
            also.append(run.tokens)
        return run

    for r in range(rounds):
        # a balanced order, so no configuration always runs in the same place of a round
        # or after the same one (measured: plain first in every round gave a never-drafting
        # loop 0.92x wall at 1.02x CPU time against plain on the CPU demo; ABBA over four
        # runs gave `none`, plain's own code, 1.22x on the H100)
        items = [-1, *range(len(configs))]
        for i in (items[k] for k in round_order(len(items), r)):
            if i < 0:
                plain.append(seen(one_run(runner, prompt, decode_tokens, None, reference)))
                log(f"round {r + 1}/{rounds}: plain {plain[-1].decode_tok_s:.1f} tok/s")
                continue
            c = configs[i]
            runs[i].append(seen(one_run(runner, prompt, decode_tokens, c, reference, also)))
            log(f"  {c}: {runs[i][-1].decode_tok_s:.1f} tok/s")
            if on_round is not None:  # after every run: a timeout keeps what ran
                on_round(_result(runner, prompt, decode_tokens, rounds, configs, plain, runs,
                                 reference))  # fmt: skip
    return _result(runner, prompt, decode_tokens, rounds, configs, plain, runs, reference)


def _result(runner, prompt, decode_tokens, rounds, configs, plain, runs, reference) -> dict:  # noqa: ANN001
    """The result dict over the rounds run so far."""
    rows = []
    for i, c in enumerate(configs):
        mine = runs[i]
        if not mine:
            continue
        pairs = list(zip(mine, plain, strict=False))  # run r of a config beside plain run r
        ratios = [m.decode_tok_s / p.decode_tok_s for m, p in pairs if p.decode_tok_s > 0]
        cpu = [p.cpu_ms_per_token / m.cpu_ms_per_token for m, p in pairs if m.cpu_ms_per_token > 0]
        depth_counts: dict[str, int] = {}
        for m in mine:
            for d, n in (m.spec or {}).get("depths", {}).items():
                depth_counts[d] = depth_counts.get(d, 0) + n
        last = mine[-1].spec or {}
        rows.append({
            "speculate": _label(c),
            "depth": "auto" if c.depth is None else c.depth,
            "exact_verify": c.exact,
            "plain_tok_s": round(statistics.median(p.decode_tok_s for p in plain), 3),
            "spec_tok_s": round(statistics.median(m.decode_tok_s for m in mine), 3),
            "ratio": round(statistics.median(ratios), 4) if ratios else None,
            "cpu_ratio": round(statistics.median(cpu), 4) if cpu else None,
            "acceptance": last.get("acceptance"),
            "tokens_per_pass": last.get("tokens_per_pass"),
            "plain_mib_per_token": round(statistics.median(p.bytes_per_token for p in plain) / 2**20, 4),
            "spec_mib_per_token": round(statistics.median(m.bytes_per_token for m in mine) / 2**20, 4),
            "ms_per_token": last.get("ms_per_token"),
            "depths": depth_counts,
            "same_tokens": all(m.tokens == reference for m in mine),
            "probes": sum((m.spec or {}).get("probes", 0) for m in mine),
            **_oracle_figures(mine),
        })  # fmt: skip
    _mark_governor(rows)
    return {
        "mode": "speculate",
        "rounds": len(plain),
        "rounds_asked": rounds,
        "decode_tokens": decode_tokens,
        "prompt_tokens": len(prompt),
        "conditions": runner.conditions(),
        "plain_same_tokens": all(p.tokens == reference for p in plain),
        "rows": rows,
    }


def _oracle_figures(mine: list[Run]) -> dict:
    """An oracle row's alignment over its runs: where each left the first plain run's
    tokens (None: never), and its proposals re-anchored by a suffix match or left empty."""
    figs = [m.spec["oracle"] for m in mine if m.spec and "oracle" in m.spec]
    if not figs:
        return {}
    return {
        "oracle_diverged_at": [f["diverged_at"] for f in figs],
        "oracle_references": figs[-1]["references"],
        "oracle_reanchored": sum(f["reanchored"] for f in figs),
        "oracle_unanchored": sum(f["unanchored"] for f in figs),
    }


def _mark_governor(rows: list[dict]) -> None:
    """`governor_choice` on each fixed-depth row whose depth the governor (the same
    drafter's auto row) used most."""
    auto = {(r["speculate"], r["exact_verify"]): r for r in rows if r["depth"] == "auto"}
    for r in rows:
        a = auto.get((r["speculate"], r["exact_verify"]))
        r["governor_choice"] = False
        if a is None or r["depth"] == "auto" or not a["depths"]:
            continue
        top = max(a["depths"].items(), key=lambda kv: kv[1])[0]
        r["governor_choice"] = str(r["depth"]) == top


def table(result: dict) -> str:
    """Rows with and without speculation side by side; '*' marks the depth the governor
    used most for that drafter."""
    head = (f"{'speculate':<12} {'depth':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} "
            f"{'cpu':>5} {'accept':>6} {'tok/pass':>8} {'MiB/tok':>13} {'same':>4}  governor depths")  # fmt: skip
    lines = [head, "-" * len(head)]
    for r in result["rows"]:
        mark = "*" if r.get("governor_choice") else " "
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%}"
        tpp = "-" if r["tokens_per_pass"] is None else f"{r['tokens_per_pass']:.2f}"
        mib = f"{r['plain_mib_per_token']:.1f}->{r['spec_mib_per_token']:.1f}"
        depths = (
            ",".join(f"{d}:{n}" for d, n in sorted(r["depths"].items()))
            if r["depth"] == "auto"
            else ""
        )
        lines.append(
            f"{r['speculate'] + (' exact' if r.get('exact_verify') else ''):<12} {str(r['depth']) + mark:>5} {r['plain_tok_s']:>11.1f} "
            f"{r['spec_tok_s']:>10.1f} {r['ratio'] or 0:>6.2f} {r['cpu_ratio'] or 0:>5.2f} {acc:>6} "
            f"{tpp:>8} {mib:>13} {'yes' if r['same_tokens'] else 'NO':>4}  {depths}"
        )  # fmt: skip
    return "\n".join(lines)
