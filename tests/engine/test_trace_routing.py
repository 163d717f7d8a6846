"""Trace-driven routing in the real engine (`--routing-trace`): the engine computes every
layer but routes by a recorded trace, and its decode hit rate equals `trace replay`'s."""

from __future__ import annotations

import json

import pytest

from ssdmoe_tui.bench.trace_replay import replay
from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.policy import trace_routing
from ssdmoe_tui.engine.policy.traces import read_trace
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.errors import BadValueError
from tests.helpers.fixture_paths import TRACES
from tests.helpers.traces import GPTOSS, QWEN, cut_trace, shaped_checkpoint


def _shaped(tmp_path_factory, name: str, layers: int, k: int):
    return shaped_checkpoint(tmp_path_factory.mktemp(name) / "ckpt", layers, k)


LAYERS, STEPS = 12, 64  # the traces cut to their first layers and decode steps (test time)


def _cut(src, dst):
    """The trace's first LAYERS layers and STEPS decode steps."""
    return cut_trace(src, dst, LAYERS, STEPS)


@pytest.fixture(scope="module")
def qwen_cut(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-cut")
    return _shaped(tmp_path_factory, "qwen12", LAYERS, 6), _cut(QWEN, d / "qwen-cut.jsonl")


@pytest.fixture(scope="module")
def gptoss_cut(tmp_path_factory):
    d = tmp_path_factory.mktemp("gptoss-cut")
    return _shaped(tmp_path_factory, "gptoss12", LAYERS, 2), _cut(GPTOSS, d / "gptoss-cut.jsonl")


def _engine_decode_hit(
    path,
    trace_path,
    slots: int,
    policy: str = "auto",
    prefetch: bool = False,
    prompt_tokens: int = 16,
) -> tuple[float, dict]:
    from ssdmoe_tui.engine.experts.index import load_index

    index, _ = load_index(path)
    import mlx.core as mx

    budget = slots * slot_memory_bytes(index, mx.float32)
    sm = load_streamed(path, expert_cache=str(budget), policy=policy, prefetch=prefetch)
    try:
        assert sm.cache.capacity == slots
        routing = trace_routing.attach(sm, trace_path)
        sm.tokenizer.eos_token_ids = set()
        runner = Runner(sm, prefill_step_size=64)
        runner.k = routing.k
        steps = len(routing.decode)
        res = runner.generate(list(range(3, 3 + prompt_tokens)), max_tokens=steps)
        st = res.stats
        assert st.k_per_token == [routing.k] * steps
        assert routing.wraps == 0 and routing.position == steps - 1
        c = sm.cache.counters
        summary = {**routing.summary(), "issued": c.prefetch_issued, "used": c.prefetch_used}
        return st.decode_hits / (st.decode_hits + st.decode_misses), summary
    finally:
        sm.close()


@pytest.mark.parametrize(
    ("per_layer", "policy"), [(12, "cycle-lfu"), (24, "lru"), (9, "layer-lfu"), (12, "reuse")]
)
def test_engine_decode_hit_rate_equals_trace_replay_qwen(qwen_cut, per_layer, policy) -> None:
    path, trace = qwen_cut
    slots = per_layer * LAYERS
    got, summary = _engine_decode_hit(path, trace, slots, policy)
    want = replay(read_trace(trace), policy, slots, warmup=1).hit_rate
    assert 0.2 < want < 0.95
    assert abs(100 * got - 100 * want) <= 0.5, (got, want)
    assert summary["routing"] == "trace:qwen-cut.jsonl" and summary["routing_k"] == 6


def test_one_token_prefill_chunk_is_prefill(qwen_cut) -> None:
    """A two-token prompt is prefilled as a one-token chunk before the last token: it
    routes to the prefill union, not to decode step 0 (which shifted every decode step
    by one, and the hit rate away from the replay's)."""
    path, trace = qwen_cut
    slots = 12 * LAYERS
    got, _ = _engine_decode_hit(path, trace, slots, prompt_tokens=2)
    want = replay(read_trace(trace), "cycle-lfu", slots, warmup=1).hit_rate
    assert abs(100 * got - 100 * want) <= 0.5, (got, want)


def test_engine_decode_hit_rate_equals_trace_replay_gptoss(gptoss_cut) -> None:
    path, trace = gptoss_cut
    slots = 4 * LAYERS  # 2xK per layer; the prefill union (up to ~60 ids) exceeds it: grouped
    got, _ = _engine_decode_hit(path, trace, slots)
    want = replay(read_trace(trace), "cycle-lfu", slots, warmup=1).hit_rate
    assert abs(100 * got - 100 * want) <= 0.5, (got, want)


def test_engine_prefetch_equals_trace_replay_prefetch(qwen_cut) -> None:
    """Co-occurrence prefetch (the next block's router cannot foresee a trace): the
    engine reads what the simulator says, and the hit rate still agrees."""
    path, trace = qwen_cut
    slots = 12 * LAYERS
    got, summary = _engine_decode_hit(path, trace, slots, prefetch=True)
    t = read_trace(trace)
    want = replay(t, "cycle-lfu", slots, warmup=1, prefetch=True)
    every = replay(t, "cycle-lfu", slots, prefetch=True)
    assert abs(100 * got - 100 * want.hit_rate) <= 0.5, (got, want.hit_rate)
    assert (summary["issued"], summary["used"]) == (every.prefetch_issued, every.prefetch_used)
    assert every.prefetch_used > 0.3 * every.prefetch_issued  # chance: 6/128


def _attach_refused(model, trace, match: str) -> None:  # noqa: ANN001
    """Attaching `trace` to `model` is one BadValueError matching `match`."""
    sm = load_streamed(model, expert_cache="1G")
    try:
        with pytest.raises(BadValueError, match=match):
            trace_routing.attach(sm, trace)
    finally:
        sm.close()


def test_mismatched_shape_is_one_line(checkpoints) -> None:
    _attach_refused(checkpoints("qwen3_moe"), QWEN, r"48 MoE layers x 128 experts.*--layers 48")


def test_decode_step_missing_layers_is_one_line(qwen_cut, tmp_path) -> None:
    """A trace cut inside a decode step: the missing layers are named, not silently routed
    by the model's own router."""
    path, trace = qwen_cut
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(trace.read_text().splitlines(keepends=True)[:-1]))
    _attach_refused(path, cut, r"routes 11 of 12 MoE layers \(layer 11 missing")


def test_generate_json_labels_trace_routing(qwen_cut, capsys) -> None:
    from ssdmoe_tui.cli import main

    path, trace = qwen_cut
    rc = main(["generate", "--model", str(path), "--prompt", "hello there", "--raw",
               "--max-tokens", "4", "--json", "--routing-trace", str(trace)])  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    st = doc["stats"]
    assert st["routing"] == "trace:qwen-cut.jsonl" and doc["k"] == 6
    assert st["expert_cache_slots"] > 0 and st["policy"] == "cycle-lfu"


def test_generate_text_labels_trace_routing_and_rejects_other_ks(qwen_cut, capsys) -> None:
    """The plain stats line says the tokens are trace-routed (and wrapped); a --k or
    --prefill-k other than the trace's K is one line."""
    from ssdmoe_tui.cli import main

    path, trace = qwen_cut
    base = ["generate", "--model", str(path), "--prompt", "hi", "--raw",
            "--routing-trace", str(trace)]  # fmt: skip
    assert main([*base, "--max-tokens", str(STEPS + 3)]) == 0
    err = capsys.readouterr().err
    assert "routed by trace:qwen-cut.jsonl, wrapped 1x: not the model's own tokens" in err
    for flag in ("--k", "--prefill-k"):
        assert main([*base, "--max-tokens", "2", flag, "4"]) != 0
        err = capsys.readouterr().err.strip()
        assert err.endswith(
            f"{flag} 4 differs from the routing trace's K=6 (K comes from the trace)"
        )
        assert "Traceback" not in err
    bench = ["bench", "--model", str(path), "--routing-trace", str(trace), "--k", "4,6"]
    assert main(bench) != 0
    err = capsys.readouterr().err.strip()
    assert err.endswith("--k 4,6 differs from the routing trace's K=6 (K comes from the trace)")


def test_other_experts_is_one_line_without_a_layers_only_fix(checkpoints) -> None:
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    olmoe = TRACES / "olmoe-1b-7b-vllm-layer0" / "moe_routes.jsonl"
    try:
        with pytest.raises(
            BadValueError, match=r"1 MoE layers x 64 experts.*config with 64 experts"
        ):
            trace_routing.attach(sm, olmoe)
    finally:
        sm.close()


def test_cli_replay_prefetch_reports_issued_used_wasted(qwen_cut, capsys) -> None:
    from ssdmoe_tui.cli import main

    _, trace = qwen_cut
    assert main(["trace", "replay", str(trace), "--policy", "cycle-lfu", "--budget", "12",
                 "--prefetch"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "prefetch (co-occurrence" in out and "wasted" in out and "precision 0." in out


def test_budget_holding_every_expert_needs_no_sync_under_trace_routing(qwen_cut) -> None:
    """The frozen (device-lookup) path serves trace-routed runs too: no router sync."""
    path, trace = qwen_cut
    sm = load_streamed(path, expert_cache="1G")
    try:
        assert sm.cache.holds_everything
        routing = trace_routing.attach(sm, trace)
        sm.tokenizer.eos_token_ids = set()
        runner = Runner(sm, prefill_step_size=64, k=routing.k)
        res = runner.generate(list(range(3, 19)), max_tokens=8)
        assert sm.cache.all_frozen and res.stats.k_per_token == [6] * 8
        synced = sm.times.router_sync_s
        runner.generate(list(range(3, 19)), max_tokens=8)
        assert sm.times.router_sync_s == synced  # later turns: no layer syncs
        assert res.stats.decode_misses == 0 and res.stats.decode_hits == 6 * LAYERS * 7
    finally:
        sm.close()


def test_bench_timeline_on_a_trace_toggles_cooccurrence_read_ahead(qwen_cut, tmp_path) -> None:
    """`bench --timeline` on a trace-driven engine: the off rounds read nothing ahead, the
    on rounds read co-occurrence guesses (read-ahead v1, as the replay simulates)."""
    import mlx.core as mx

    from ssdmoe_tui.cli import main
    from ssdmoe_tui.engine.experts.index import load_index

    path, trace = qwen_cut
    budget = 400 * slot_memory_bytes(load_index(path)[0], mx.float32)
    out = tmp_path / "tl.json"
    rc = main(["bench", "--timeline", "--model", str(path), "--routing-trace", str(trace),
               "--prefetch", "both", "--expert-cache", str(budget), "--rounds", "1",
               "--prompt-tokens", "8", "--decode-tokens", "8", "--json", str(out)])  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    assert res["modes"]["off"]["prefetch_issued"] == 0 < res["modes"]["on"]["prefetch_issued"]
    assert len(res["modes"]["on"]["timeline"]["layers"]) == LAYERS


P = 28  # the Qwen3-30B trace's prompt: 28 prefill tokens


def _chunk_lookups(path, trace, turns: list[tuple[int, int]]) -> tuple[list[list], object]:
    """The cache's lookups (layer, ids) of each turn's prefill and first token; a turn is
    (prompt tokens, chunk size), each after the first continuing the last one's cache
    (its prompt and first token reused, as a warm resume); every expert fits, so no
    lookup is grouped."""
    sm = load_streamed(path, expert_cache="1G")
    try:
        routing = trace_routing.attach(sm, trace)
        lookups: list[tuple[int, tuple[int, ...]]] = []
        sm.cache.on_route = lambda layer, ids: lookups.append((layer, tuple(ids.tolist())))
        sm.tokenizer.eos_token_ids = set()
        out, res = [], None
        for length, step in turns:
            runner = Runner(sm, prefill_step_size=step, k=routing.k)
            if res is None:
                prompt, cache, reused = list(range(3, 3 + length)), None, 0
            else:  # the cache holds the last prompt; its token is fed with this one
                prompt, cache = res.covered_tokens + res.tokens[res.covered_generated :], res.cache
                reused = len(res.covered_tokens)
                prompt += [7 + i for i in range(length - len(prompt))]
            res = runner.generate(prompt, max_tokens=1, cache=cache, reused_tokens=reused)
            out.append(list(lookups))
            lookups.clear()
        return out, routing
    finally:
        sm.close()


def _expected(routing, start: int, prefill: int, step: int) -> list[tuple[int, tuple]]:
    """The lookups of prompt positions start..prefill-1 in chunks of `step`: a chunk
    shorter than both the trace's prompt and the prefill reads its tokens' own routing
    (position t as trace prompt token t mod P), any other the trace prompt's union."""
    cells, want = routing.prefill_tokens, []
    for s in range(start, prefill, step):
        n = min(step, prefill - s)
        for layer in range(LAYERS):
            if n < min(P, prefill):
                ids = [e for t in range(s, s + n) for e in cells[t % P][layer].tolist()]
                want.append((layer, tuple(dict.fromkeys(ids))))
            else:
                want.append((layer, tuple(routing.prefill[layer].tolist())))
    return want


@pytest.mark.parametrize(
    ("prompt_tokens", "step", "token_chunks"),
    [
        (40, 4, 10),  # a long prompt in short chunks (a join): token by token
        (20, 4, 5),  # a short prompt in short chunks: token by token too
        (20, 64, 0),  # the trace's prompt: one chunk, the union (as the replay)
        (40, 64, 0),  # a long prompt in one chunk: the union
        (70, 64, 1),  # a long chunk (union), then its 5-token remainder token by token
    ],
)
def test_a_chunk_shorter_than_both_prompts_reads_its_own_tokens_routing(
    qwen_cut, prompt_tokens, step, token_chunks
) -> None:
    """A chunk shorter than both the trace's prompt (28 prefill tokens) and its own
    prompt's prefill (a batch's join) reads the union of its own tokens' routing, prompt
    position t as the trace's prefill token t mod 28 (the union of all 28 a chunk read
    0.7 s on the H100 for a one-token chunk: the join never ended, 2026-12-07); a prompt
    of one chunk, and a chunk at least as long as the trace's, read the union, as `trace
    replay` reads the trace's prompt. Then the first token's step: decode step 0."""
    path, trace = qwen_cut
    (lookups,), routing = _chunk_lookups(path, trace, [(prompt_tokens, step)])
    assert len(routing.prefill_tokens) == P
    assert all(len(c[la]) == 6 for c in routing.prefill_tokens for la in range(LAYERS))
    want = _expected(routing, 0, prompt_tokens - 1, step)
    assert lookups[: len(want)] == want
    first = [(la, tuple(routing.decode[0][la].tolist())) for la in range(LAYERS)]
    assert lookups[len(want) :] == first
    assert routing.token_chunks == token_chunks


def test_a_resumed_turns_new_tokens_route_from_their_prompt_positions(qwen_cut) -> None:
    """A warm resume prefills only the new tokens: their chunks sit at their positions
    in the whole prompt (40 reused, then 12 new in chunks of 4: trace tokens 12-23)."""
    path, trace = qwen_cut
    (_, lookups), routing = _chunk_lookups(path, trace, [(40, 64), (53, 4)])
    want = _expected(routing, 40, 52, 4)  # positions 40-51; the 53rd is the first token's
    assert lookups[: len(want)] == want and routing.token_chunks == 3


def test_a_token_by_token_chunk_routes_each_token_to_its_own_experts() -> None:
    """The router's top-K under the chunk's mask is each token's recorded ids; on the
    layer the trace routes for its last prompt token only (llama.cpp skips it for the
    others), every token routes to that token's ids."""
    import mlx.core as mx
    import mlx.nn as nn

    t = read_trace(QWEN)
    routing = trace_routing.TraceRouting(t, "q", 48, 128)
    parts = [dict(p) for p in next(s for s in t.steps if s.parts).parts]
    assert len(parts) == P and [47 in p for p in parts] == [False] * 27 + [True]
    gates = [trace_routing.TraceGate(nn.Linear(16, 128, bias=False), routing, la) for la in (0, 47)]
    routing.prefill_chunk, routing.prefill_span = True, (26, 1000)
    x = mx.random.normal((1, 5, 16))
    tops = [mx.argpartition(-g(x), kth=5, axis=-1)[..., :6] for g in gates]  # layer 0 first
    for i, tok in enumerate((26, 27, 0, 1, 2)):
        assert sorted(tops[0][0, i].tolist()) == sorted(parts[tok][0])
        assert sorted(tops[1][0, i].tolist()) == sorted(parts[27][47])
    assert routing.token_chunks == 1


def test_prompt_rows_are_tokens_by_runs_not_by_values(tmp_path) -> None:
    """A trace whose prompt repeats a token value (vocabulary ids) keeps each run of
    rows as its own token."""
    rows = [{"format": "moe-routing-jsonl", "num_layers": 1, "num_experts": 8, "k": 2}]
    for tok, ids in ((5, [0, 1]), (7, [2, 3]), (5, [4, 5]), (9, [6, 7])):
        rows.append({"token": tok, "layer": 0, "experts": ids, "phase": "prefill"})
    rows.append({"token": 10, "layer": 0, "experts": [1, 2], "phase": "decode"})
    f = tmp_path / "t.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    step = read_trace(f).steps[0]
    assert step.layers == [(0, tuple(range(8)))]
    assert step.parts == [[(0, (0, 1))], [(0, (2, 3))], [(0, (4, 5))], [(0, (6, 7))]]


def test_a_join_that_pauses_for_the_rows_routes_as_one_that_does_not(qwen_cut) -> None:
    """Rows decoding at a joining chunk's MoE layer boundaries (BatchRunner._pause) and
    the chunk around them each keep their own trace pass (TraceRouting.suspend / resume):
    the joiner's tokens and the rows' equal a batch whose chunks run whole (one-token
    chunks in both, routed token by token; the rows decode through the whole join)."""
    from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec
    from ssdmoe_tui.engine.run.runner import Done, TokenEvent

    path, trace = qwen_cut
    got = {}
    for budget in (None, 1e-9):  # None: no time budget, so no pause; 1e-9: one at each layer
        sm = load_streamed(path, expert_cache="1")
        try:
            routing = trace_routing.attach(sm, trace)
            sm.tokenizer.eos_token_ids = set()
            # one-token chunks either way: only the pauses differ
            batch = BatchRunner(Runner(sm, k=routing.k), max_batch=3, join_chunk=1,
                                join_budget_s=budget)  # fmt: skip
            batch.add(SeqSpec(0, list(range(3, 11)), max_tokens=10**6, trace_offset=0))
            batch.add(SeqSpec(1, list(range(20, 26)), max_tokens=10**6, trace_offset=20))
            batch.add(SeqSpec(2, list(range(40, 64)), max_tokens=4, trace_offset=7))
            tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
            for _ in range(2000):
                events = batch.step()
                for uid, ev in events:
                    if isinstance(ev, TokenEvent):
                        tokens[uid].append(ev.token)
                if any(uid == 2 and isinstance(ev, Done) for uid, ev in events):
                    break
            assert len(tokens[2]) == 4 and routing.token_chunks > 0
            got[budget] = tokens, batch.figures.join_pauses
        finally:
            sm.close()
    (plain, none), (paused, pauses) = got[None], got[1e-9]
    assert paused[2] == plain[2]
    for uid in (0, 1):
        n = min(len(plain[uid]), len(paused[uid]))
        assert n >= 8 and paused[uid][:n] == plain[uid][:n]
    assert none == 0 and pauses >= LAYERS
