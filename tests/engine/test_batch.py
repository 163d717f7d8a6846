"""Batched decode (engine/run/batch.py): each sequence's tokens in a batch equal its tokens
alone, for every architecture, with sequences joining and leaving at different steps."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_sampler

from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec
from ssdmoe_tui.engine.run.runner import Done, PrefillProgress, Runner, TokenEvent
from ssdmoe_tui.engine.run.sampling import SeededSampler

ARCHS = ["qwen3_moe", "qwen3_5_moe", "nemotron_h", "mixtral"]
TEXTS = [
    "Tell me about mixtures of experts, please.",
    "Hi",
    "Why is the sky blue? Explain in detail, with the physics of scattering.",
    "Write a poem about disks, streams of weights and caches.",
    "ok",
]
MAX_TOKENS = [14, 6, 18, 11, 9]  # different lengths: rows leave at different steps


def prompts(sm) -> list[list[int]]:
    tok = sm.tokenizer
    return [
        tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        for t in TEXTS
    ]


def run_batch(runner, specs, max_batch):
    # token-capped joins: a time budget makes how many steps a join takes (so which rows
    # meet) depend on the machine's speed; test_a_join_is_chunked_to_a_time_budget has it
    batch = BatchRunner(runner, max_batch=max_batch, join_budget_s=None)
    for spec in specs:
        batch.add(spec)
    results, events = {}, {}
    for uid, ev in batch.drain():
        events.setdefault(uid, []).append(ev)
        if isinstance(ev, Done):
            results[uid] = ev.result
    return batch, results, events


@pytest.mark.parametrize("budget", ["1", "1G"])
@pytest.mark.parametrize("arch", ARCHS)
def test_batch_tokens_equal_alone(checkpoints, arch, budget):
    """Min cache (every layer syncs, reads the union of the rows' experts, evicts) and a
    cache holding every expert (no layer syncs: the step pipelines, rows join beside a
    queued step and leave from it); max_batch 3 of 5 sequences: two wait, join as others
    leave, and rows leave at different steps, so batch caches are merged, extended,
    filtered and split."""
    sm = load_streamed(checkpoints(arch), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)
    alone = [runner.generate(p, max_tokens=n) for p, n in zip(ps, MAX_TOKENS, strict=True)]
    specs = [
        SeqSpec(i, p, max_tokens=n) for i, (p, n) in enumerate(zip(ps, MAX_TOKENS, strict=True))
    ]
    batch, results, events = run_batch(runner, specs, max_batch=3)
    for i, a in enumerate(alone):
        assert results[i].tokens == a.tokens, f"sequence {i}"
        assert results[i].text == a.text
        assert results[i].finish_reason == a.finish_reason
        assert results[i].stats.k_per_token == a.stats.k_per_token
        # Its KV cache is its own again, covering exactly its tokens.
        offsets = [c.offset for c in results[i].cache if hasattr(c, "keys")]
        assert offsets and all(o == len(results[i].covered_tokens) for o in offsets)
        kinds = [type(e) for e in events[i]]
        assert kinds[0] is PrefillProgress and kinds[-1] is Done
        assert kinds.count(TokenEvent) == len(a.tokens)
    fig = batch.figures
    assert fig.max_rows == 3
    assert fig.row_tokens == sum(len(a.tokens) for a in alone) - len(alone)  # first tokens: prefill
    assert fig.row_tokens > fig.steps  # rows really shared steps
    assert fig.rounds == fig.steps  # one K group: one pass a step
    if budget == "1G":  # every layer frozen: no union looked up on the host
        assert sm.cache.all_frozen and fig.union_calls == 0
        return
    assert fig.union_calls > 0 and fig.union_experts / fig.union_calls >= sm.trained_k
    if arch != "nemotron_h":  # its random router picks the same experts for every token
        assert fig.union_experts / fig.union_calls > sm.trained_k  # rows' unions looked up
    # Per-sequence shares add up to the batch's decode bytes.
    share = sum(r.stats.decode_requested_bytes for r in results.values())
    assert abs(share - fig.requested_bytes) <= len(results)


def _count_filters(monkeypatch) -> list[list[int]]:
    """The batch KV caches' filters from here on, each its kept rows (still filtering)."""
    from ssdmoe_tui.engine.run.batch_cache import HostPaddedKVCache

    filters: list[list[int]] = []
    real = HostPaddedKVCache.filter
    monkeypatch.setattr(
        HostPaddedKVCache, "filter", lambda c, keep: (filters.append(list(keep)), real(c, keep))[1]
    )
    return filters


@pytest.mark.parametrize("budget", ["1", "1G"])
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_ending_in_one_step_leave_together(checkpoints, monkeypatch, arch, budget):
    """Three of five rows stopped in one step leave their group together: the batch
    cache filtered once a layer, not once a row; the KV layers' paddings, kept on the
    host (batch_cache.py), equal the device's after it; the two left decode on to
    their tokens alone, and each row's own cache covers exactly its tokens (1G: every
    layer frozen, rows leave a queued step), for every architecture's caches (recurrent
    state too)."""
    from mlx_lm.models.cache import BatchKVCache

    from ssdmoe_tui.engine.run.batch_cache import HostPaddedKVCache

    sm = load_streamed(checkpoints(arch), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)
    stop = [False]
    specs = [
        SeqSpec(
            i, p, max_tokens=40 if i < 3 else n, should_stop=(lambda: stop[0]) if i < 3 else None
        )
        for i, (p, n) in enumerate(zip(ps, MAX_TOKENS, strict=True))
    ]
    filters = _count_filters(monkeypatch)
    batch = BatchRunner(runner, max_batch=5, join_budget_s=None)
    for spec in specs:
        batch.add(spec)
    results, events = {}, {}
    for _ in range(200):
        if batch.idle:
            break
        if batch.rows == 5 and not stop[0]:
            stop[0] = True
            filters.clear()
            step_events = batch.step()
            kv = [c for c in next(iter(batch._groups.values())).cache
                  if isinstance(c, BatchKVCache)]  # fmt: skip
            assert kv and all(type(c) is HostPaddedKVCache for c in kv)
            assert len(filters) == len(kv)  # once a layer for the three
            assert all(len(keep) == 2 for keep in filters)
            assert all(c.pads == c.left_padding.tolist() for c in kv)
            assert [uid for uid, ev in step_events if isinstance(ev, Done)] == [0, 1, 2]
        else:
            step_events = batch.step()
        for uid, ev in step_events:
            events.setdefault(uid, []).append(ev)
            if isinstance(ev, Done):
                results[uid] = ev.result
    assert stop[0] and batch.idle and sorted(results) == [0, 1, 2, 3, 4]
    for i in (3, 4):
        assert results[i].tokens == runner.generate(ps[i], max_tokens=MAX_TOKENS[i]).tokens
    for i in range(5):
        offsets = [c.offset for c in results[i].cache if hasattr(c, "keys")]
        assert offsets and all(o == len(results[i].covered_tokens) for o in offsets)
    assert all(results[i].finish_reason == "cancelled" for i in range(3))
    sm.close()


@pytest.mark.parametrize("family", ["gpt_oss", "gemma4_text"])
def test_sliding_window_rows_leave_without_a_read(checkpoints, monkeypatch, family):
    """Families with sliding-window layers (RotatingKVCache; the tiny configs' windows of
    16 and 8 tokens, shorter than the prompts, so the batch's windows are full, trimmed
    and rotating): each sequence's tokens in a batch equal its tokens alone, the
    window layers batch as `HostPaddedRotatingKVCache`, and no row leaving reads the
    device (mlx-lm's extract, which evaluates and reads the paddings, never runs)."""
    from mlx_lm.models.cache import BatchRotatingKVCache

    from ssdmoe_tui.engine.run.batch_cache import HostPaddedRotatingKVCache

    sm = load_streamed(checkpoints(family), expert_cache="1")
    runner = Runner(sm)
    ps = prompts(sm)
    alone = [runner.generate(p, max_tokens=n) for p, n in zip(ps, MAX_TOKENS, strict=True)]
    merged, reads = [], []
    real_merge = HostPaddedRotatingKVCache.merge.__func__
    real_extract = BatchRotatingKVCache.extract
    monkeypatch.setattr(
        HostPaddedRotatingKVCache,
        "merge",
        classmethod(lambda cls, caches: merged.append(real_merge(cls, caches)) or merged[-1]),
    )
    monkeypatch.setattr(
        BatchRotatingKVCache, "extract", lambda c, i: reads.append(i) or real_extract(c, i)
    )
    specs = [
        SeqSpec(i, p, max_tokens=n) for i, (p, n) in enumerate(zip(ps, MAX_TOKENS, strict=True))
    ]
    _, results, _ = run_batch(runner, specs, max_batch=3)
    for i, a in enumerate(alone):
        assert results[i].tokens == a.tokens, f"sequence {i}"
        offsets = [c.offset for c in results[i].cache if hasattr(c, "keys")]
        assert offsets and all(o == len(results[i].covered_tokens) for o in offsets)
    assert merged and all(c.pads is not None for c in merged)
    assert any(c.rotated for c in merged)
    for c in merged:  # the host's lists are the device's, after every join and leave
        assert c.pads == c.left_padding.tolist() and c.offs == c.offset.tolist()
    assert reads == []
    sm.close()


@pytest.mark.parametrize("budget", ["1", "1G"])
def test_host_copies_of_the_steps_tokens_read_the_same(checkpoints, monkeypatch, budget):
    """`SSDMOE_BATCH_HOST_COPY`: each step's tokens and routing masses copied on the CPU
    stream (`on`) or into 2-value device arrays (`pairs`: 3 rows, so one odd piece) and
    read from there give every row the tokens, text and masses of the step's own arrays,
    rows leaving from a queued step too (1G: every layer frozen, the step pipelines)."""
    from ssdmoe_tui.engine.run.batch import HOST_COPY_ENV
    from ssdmoe_tui.errors import SsdmoeError

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache=budget)
    sm.measure_routing_mass(True)
    runner = Runner(sm)
    specs = [
        SeqSpec(i, p, max_tokens=n)
        for i, (p, n) in enumerate(zip(prompts(sm), MAX_TOKENS, strict=True))
    ]
    got = {}
    for mode, way in (("off", "direct"), ("on", "cpu"), ("pairs", "pairs")):
        monkeypatch.setenv(HOST_COPY_ENV, mode)
        batch, results, _ = run_batch(runner, specs, max_batch=3)
        assert batch._host_read == way
        got[mode] = {i: (r.tokens, r.text, r.stats.mass_log.values()) for i, r in results.items()}
    assert got["on"] == got["off"] == got["pairs"]
    assert all(len(masses) > 1 for _, _, masses in got["on"].values())
    monkeypatch.setenv(HOST_COPY_ENV, "sometimes")  # a bad value: one line naming it
    with pytest.raises(SsdmoeError) as err:
        BatchRunner(runner)
    assert str(err.value) == f"{HOST_COPY_ENV}='sometimes': use one of auto, on, off, pairs"
    sm.close()


def test_host_copies_split_into_pairs():
    """`pairs` gives arrays of at most 8 bytes (MLX-CUDA's small pool), in order."""
    from ssdmoe_tui.engine.run.batch import host_copies

    a = mx.arange(7, dtype=mx.uint32) * 3
    parts = host_copies(a, "pairs")
    assert [p.nbytes for p in parts] == [8, 8, 8, 4]
    assert [v for p in parts for v in p.tolist()] == a.tolist()
    assert host_copies(a, "direct") == [a]


def test_host_read_way_auto_is_pairs_on_cuda_only(monkeypatch):
    """`auto` (the default) reads pairs under MLX-CUDA (measured faster there) and the
    step's own arrays elsewhere (one memory: nothing to gain from copies)."""
    import ssdmoe_tui.engine.run.batch as batch_mod

    monkeypatch.delenv(batch_mod.HOST_COPY_ENV, raising=False)
    assert batch_mod.host_read_way() == ("pairs" if batch_mod.is_cuda() else "direct")
    monkeypatch.setattr(batch_mod, "is_cuda", lambda: True)
    assert batch_mod.host_read_way() == "pairs"
    monkeypatch.setenv(batch_mod.HOST_COPY_ENV, "off")  # asked for: kept
    assert batch_mod.host_read_way() == "direct"
    monkeypatch.setattr(batch_mod, "is_cuda", lambda: False)
    monkeypatch.setenv(batch_mod.HOST_COPY_ENV, "auto")
    assert batch_mod.host_read_way() == "direct"


@pytest.mark.parametrize("budget", ["1", "1G"])
def test_batch_invariant_mode_rows_equal_alone(checkpoints, budget):
    """`invariant=True`: each row its own pass in the B = 1 shapes (its tokens equal alone
    on any device), sharing the step's sync and the expert cache."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)[:3]
    alone = [runner.generate(p, max_tokens=n).tokens for p, n in zip(ps, MAX_TOKENS, strict=False)]
    batch = BatchRunner(runner, max_batch=3, invariant=True, join_budget_s=None)
    for i, p in enumerate(ps):
        batch.add(SeqSpec(i, p, max_tokens=MAX_TOKENS[i]))
    results = {uid: ev.result for uid, ev in batch.drain() if isinstance(ev, Done)}
    assert [results[i].tokens for i in range(3)] == alone
    fig = batch.figures
    assert fig.max_rows == 3 and fig.steps > fig.rounds  # a pass per row, a sync per step
    assert fig.row_tokens == sum(len(a) for a in alone) - len(alone)


def test_batch_all_resident_and_k_groups(checkpoints):
    """A budget holding every expert (no host sync per layer) and rows at different K:
    each K group runs its own pass, each row computes exactly its K."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    runner = Runner(sm)
    ps = prompts(sm)[:4]
    ks = [2, 4, 2, None]  # None: the runner's live K (the trained 4)
    alone = []
    for p, k, n in zip(ps, ks, MAX_TOKENS, strict=False):
        runner.set_k(k or sm.trained_k)
        alone.append(runner.generate(p, max_tokens=n))
    runner.set_k(sm.trained_k)
    specs = [
        SeqSpec(i, p, max_tokens=n, k=k)
        for i, (p, k, n) in enumerate(zip(ps, ks, MAX_TOKENS, strict=False))
    ]
    _, results, _ = run_batch(runner, specs, max_batch=4)
    for i, a in enumerate(alone):
        assert results[i].tokens == a.tokens, f"sequence {i} (K={ks[i]})"
        assert set(results[i].stats.k_per_token) == {ks[i] or sm.trained_k}


@pytest.mark.parametrize("budget", ["1", "1G"])
def test_a_live_k_change_moves_the_rows_that_follow_it_together(checkpoints, monkeypatch, budget):
    """The runner's K changed while rows decode: the rows that follow it (`k` None) leave
    their group together (no filter of the batch cache: none stay) and decode on at the
    new K; a row with its own K stays; every row ends with a cache covering its tokens."""

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)[:4]
    specs = [SeqSpec(i, p, max_tokens=16, k=2 if i == 3 else None) for i, p in enumerate(ps)]
    batch = BatchRunner(runner, max_batch=4, join_budget_s=None)
    for spec in specs:
        batch.add(spec)
    filters = _count_filters(monkeypatch)
    results, switched, checked = {}, False, False
    for _ in range(200):
        if batch.idle:
            break
        if batch.rows == 4 and not switched:
            for _ in range(3):
                batch.step()
            filters.clear()
            runner.set_k(2)
            switched = True
        for uid, ev in batch.step():
            if isinstance(ev, Done):
                results[uid] = ev.result
        if switched and not checked:
            assert filters == []  # the three left their group at once: nothing filtered
            checked = True
    runner.set_k(sm.trained_k)
    assert switched and sorted(results) == [0, 1, 2, 3]
    ks = [results[i].stats.k_per_token for i in range(3)]
    assert all(set(k[: k.index(2)]) == {sm.trained_k} and set(k[k.index(2) :]) == {2} for k in ks)
    assert set(results[3].stats.k_per_token) == {2}
    for r in results.values():
        offsets = [c.offset for c in r.cache if hasattr(c, "keys")]
        assert offsets and all(o == len(r.covered_tokens) for o in offsets)
    sm.close()


@pytest.mark.parametrize("budget", ["1", "1G"])
def test_cancel_frees_the_row_and_others_go_on(checkpoints, budget):
    sm = load_streamed(checkpoints("qwen3_5_moe"), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)[:3]
    alone = [runner.generate(p, max_tokens=16).tokens for p in ps]
    stop = {"flag": False}
    specs = [SeqSpec(i, p, max_tokens=16) for i, p in enumerate(ps)]
    specs[1].should_stop = lambda: stop["flag"]
    batch = BatchRunner(runner, max_batch=3, join_budget_s=None)
    for s in specs:
        batch.add(s)
    results = {}
    seen = 0
    for uid, ev in batch.drain():
        if uid == 1 and isinstance(ev, TokenEvent):
            seen += 1
            if seen == 5:
                stop["flag"] = True
        if isinstance(ev, Done):
            results[uid] = ev.result
            if uid == 1:
                assert batch.rows == 2  # its row is gone before the next decode step
    assert results[1].finish_reason == "cancelled"
    assert results[1].tokens == alone[1][:5]
    if budget == "1":
        assert results[1].covered_tokens == ps[1] + alone[1][:4]  # the last token was never fed
    else:  # pipelined: the step queued on its last token fed it (its output is dropped)
        assert results[1].covered_tokens == ps[1] + alone[1][:5]
    offsets = [c.offset for c in results[1].cache if hasattr(c, "keys")]
    assert offsets and all(o == len(results[1].covered_tokens) for o in offsets)
    assert results[0].tokens == alone[0] and results[2].tokens == alone[2]


def test_seeded_sampling_and_penalties_are_per_sequence(checkpoints):
    """A seeded sequence draws from its own key: the same tokens alone (global seed, as
    the service does) and in a batch beside other sampled sequences; a row with logits
    processors (a repetition penalty) sees its own tokens only."""
    from mlx_lm.sample_utils import make_logits_processors

    sm = load_streamed(checkpoints("mixtral"), expert_cache="1G")
    runner = Runner(sm)
    ps = prompts(sm)[:4]
    alone = []
    for i, p in enumerate(ps[:3]):
        mx.random.seed(100 + i)
        sampler = make_sampler(0.9, top_p=0.95, min_p=0.01, top_k=50 if i else 0)
        alone.append(runner.generate(p, max_tokens=12, sampler=sampler).tokens)
    penalty = {"repetition_penalty": 5.0, "repetition_context_size": 64}
    alone.append(
        runner.generate(
            ps[3], max_tokens=12, logits_processors=make_logits_processors(**penalty)
        ).tokens
    )
    specs = [
        SeqSpec(
            i, p, max_tokens=12, sampler=SeededSampler(0.9, 0.95, 100 + i, 0.01, 50 if i else 0)
        )
        for i, p in enumerate(ps[:3])
    ]
    specs.append(
        SeqSpec(3, ps[3], max_tokens=12, logits_processors=make_logits_processors(**penalty))
    )
    _, results, _ = run_batch(runner, specs, max_batch=4)
    assert [results[i].tokens for i in range(4)] == alone
    assert len({tuple(a) for a in alone}) == 4
    plain = runner.generate(ps[3], max_tokens=12).tokens
    assert plain != alone[3], "the penalty should change this greedy reply"


def _service_run(path, kv_budget: int):
    """Three Generates submitted at once to EngineService(max_batch=3)."""
    import queue

    from ssdmoe_tui.engine.run import protocol as P
    from ssdmoe_tui.engine.run.service import EngineService
    from ssdmoe_tui.options import SamplingOptions
    from ssdmoe_tui.prompting.chat_format import prompt_tokens

    events: queue.Queue = queue.Queue()
    svc = EngineService(events.put, max_batch=3)
    svc.use_model_lock = False
    svc.kv_budget_bytes = kv_budget
    svc.start()
    try:
        svc.submit(P.LoadModel(path=str(path), expert_cache="1G"))
        tok = None
        while tok is None:
            ev = events.get(timeout=60)
            if isinstance(ev, P.ModelLoaded):
                tok = ev.tokenizer
        for i, text in enumerate(TEXTS[:3]):
            ids = prompt_tokens(tok, [{"role": "user", "content": text}])
            svc.submit(
                P.Generate(
                    f"r{i}", prompt_tokens=tuple(ids), sampling=SamplingOptions(max_tokens=24)
                )
            )
        done = {}
        while len(done) < 3:
            ev = events.get(timeout=120)
            if isinstance(ev, P.GenerationDone):
                done[ev.request_id] = ev
        return done, dict(svc.batch_figures or {})
    finally:
        svc.shutdown()


def test_service_batches_and_the_kv_budget_counts_every_sequence(checkpoints):
    """Room in the KV budget: the three requests decode together. A budget that holds one
    sequence's cache only: each waits for the one before it to end (still answered, same
    tokens)."""
    path = checkpoints("qwen3_moe")
    roomy, fig = _service_run(path, 2 << 30)
    assert fig["max_rows"] == 3
    tight, fig1 = _service_run(path, 40_000)  # about one short sequence's KV (4 layers)
    assert fig1["max_rows"] == 1
    for rid in roomy:
        assert tight[rid].token_ids == roomy[rid].token_ids and len(roomy[rid].token_ids) == 24
        assert roomy[rid].stats["batch"]["max_rows"] >= 1


@pytest.mark.parametrize("budget", ["1", "1G"])
def test_a_join_stalls_the_decoding_rows_one_bounded_chunk(checkpoints, budget):
    """A long prompt joining rows that decode prefills in chunks of at most `join_chunk`
    tokens, a decode step of the others between two (the stall is bounded); alone (no
    row decoding) it is one chunk. Its tokens and the others' equal their runs alone."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)[:2]
    long = ps[1] + ps[0] * 4  # ~100 tokens
    alone = [
        runner.generate(ps[0], max_tokens=24).tokens,
        runner.generate(long, max_tokens=6).tokens,
    ]
    batch = BatchRunner(runner, max_batch=2, join_chunk=16)
    batch.add(SeqSpec(0, ps[0], max_tokens=24))
    batch.add(SeqSpec(1, long, max_tokens=6))
    done_at, results, tokens_0_between = [], {}, []
    for uid, ev in batch.drain():
        if uid == 1 and isinstance(ev, PrefillProgress):
            done_at.append(ev.done)
            tokens_0_between.append(len(results.get("t0", [])))
        if uid == 0 and isinstance(ev, TokenEvent):
            results.setdefault("t0", []).append(ev.token)
        if isinstance(ev, Done):
            results[uid] = ev.result
    chunks = [b - a for a, b in zip(done_at, done_at[1:], strict=False) if b > a]
    assert len(long) > 64 and chunks and max(chunks[:-1]) <= 16  # the last: the first token
    assert len(chunks) >= (len(long) - 1) // 16
    assert tokens_0_between[-1] > tokens_0_between[1]  # row 0 decoded between the chunks
    assert [results[0].tokens, results[1].tokens] == alone
    assert batch.figures.max_stall_s > 0


@pytest.mark.parametrize("budget_s", [1e-6, 30.0])
def test_a_join_is_chunked_to_a_time_budget(checkpoints, budget_s):
    """While rows decode, a joining prompt's chunks are sized to `join_budget_s` from the
    measured times (engine/run/join_chunks.py): a budget no chunk fits gives a one-token
    chunk after the first (8 tokens, nothing measured yet), then chunks that grow again
    (to twice the fixed part's stall), so the join does not take a chunk a token; a
    budget every chunk fits grows them by `GROWTH` a chunk. Chunk sizes never change a
    token: every row equals its run alone."""
    from ssdmoe_tui.engine.run.join_chunks import FIRST_JOIN_CHUNK, GROWTH

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1")
    runner = Runner(sm)
    ps = prompts(sm)[:2]
    long = ps[1] + ps[0] * 4  # ~100 tokens
    alone = [
        runner.generate(ps[0], max_tokens=160).tokens,  # decodes through the whole join
        runner.generate(long, max_tokens=6).tokens,
    ]
    batch = BatchRunner(runner, max_batch=2, join_chunk=None, join_budget_s=budget_s)
    batch.add(SeqSpec(0, ps[0], max_tokens=160))
    batch.add(SeqSpec(1, long, max_tokens=6))
    done_at, results = [], {}
    for uid, ev in batch.drain():
        if uid == 1 and isinstance(ev, PrefillProgress) and 0 not in results:
            done_at.append(ev.done)  # the joiner's progress while row 0 decodes
        if isinstance(ev, Done):
            results[uid] = ev.result
    chunks = [b - a for a, b in zip(done_at, done_at[1:], strict=False) if b > a]
    assert chunks[0] == FIRST_JOIN_CHUNK
    assert sum(chunks) == len(long)  # all of it beside row 0 (the last: its first token)
    if budget_s < 1:
        # one-token chunks would be ~115; a few tokens a chunk here (the stall of two
        # one-token chunks)
        assert chunks[1] == 1 and max(chunks[2:]) > 1
        assert len(chunks) <= len(long) // 2
    else:
        second = int(GROWTH * FIRST_JOIN_CHUNK)
        assert chunks[1:3] == [second, int(GROWTH * second)]
    assert [results[0].tokens, results[1].tokens] == alone


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
@pytest.mark.parametrize("budget", ["1", "1G"])
def test_the_rows_decode_inside_a_joining_chunk_at_its_layer_boundaries(checkpoints, arch, budget):
    """Where the rows have waited the join's budget at a MoE layer boundary of a joining
    chunk, their decode step runs there (BatchRunner._pause, the chunk's own state set
    aside: Runner.outside_prefill), its events handed to `emit` before the step returns
    (with what the step had before them, so each row's tokens stay in order), and the
    chunk goes on: a budget every layer exceeds pauses at each, and still every row's
    tokens and the joiner's equal their runs alone (a streamed cache of one slot, and
    every expert held; a hybrid model's recurrent layers too). A row stopped meanwhile
    leaves at the next pause, not after the chunk."""
    sm = load_streamed(checkpoints(arch), expert_cache=budget)
    runner = Runner(sm)
    ps = prompts(sm)[:3]
    long = ps[2] + ps[0] * 3  # ~100 tokens
    alone = [runner.generate(p, max_tokens=n).tokens for p, n in ((ps[0], 40), (ps[1], 40))]
    alone.append(runner.generate(long, max_tokens=5).tokens)
    batch = BatchRunner(runner, max_batch=3, join_chunk=64, join_budget_s=1e-9)
    emitted: list[list] = []  # what each pause handed on, before its step returned
    batch.emit = lambda events: emitted.append(list(events))
    progress: list[int] = []  # the joiner's prefilled tokens, as its chunks end
    stop_at = {"pauses": None}

    def row_1_stops() -> bool:  # asked between steps and at each pause
        return stop_at["pauses"] is not None and batch.figures.join_pauses >= stop_at["pauses"]

    specs = [SeqSpec(0, ps[0], max_tokens=40), SeqSpec(1, ps[1], max_tokens=40,
             should_stop=row_1_stops), SeqSpec(2, long, max_tokens=5)]  # fmt: skip
    for spec in specs:
        batch.add(spec)
    tokens: dict[int, list[int]] = {0: [], 1: [], 2: []}
    results, by_emit, left_in_chunk = {}, 0, None
    for _ in range(400):
        if batch.idle:
            break
        returned = batch.step()
        for events in [*emitted, returned]:
            for uid, ev in events:
                if isinstance(ev, TokenEvent):
                    tokens[uid].append(ev.token)
                    by_emit += uid != 2 and events is not returned
                if uid == 2 and isinstance(ev, PrefillProgress) and ev.done < ev.total:
                    progress.append(ev.done)
                    if len(progress) == 3:  # row 1 is stopped two pauses into the next chunk
                        stop_at["pauses"] = batch.figures.join_pauses + 2
                if isinstance(ev, Done):
                    results[uid] = ev.result
                    if uid == 1 and events is not returned:
                        left_in_chunk = len(progress)
        emitted.clear()
    assert batch.idle
    layers = sm.index.num_layers
    assert [results[0].tokens, results[2].tokens] == [alone[0], alone[2]]
    assert tokens[0] == alone[0] and tokens[2] == alone[2]  # in order, each once
    # row 1 stopped at the first pause after it was asked, in the joiner's next chunk
    assert results[1].finish_reason == "cancelled" and left_in_chunk == 3
    assert tokens[1] == alone[1][: len(tokens[1])] and 0 < len(tokens[1]) < 40
    # the joiner's chunks beside the rows paused at (nearly) every MoE layer, and the
    # rows' tokens of those pauses reached `emit` before their step returned
    assert batch.figures.join_pauses >= layers and by_emit >= layers


def test_join_sizer_converges_to_the_budget():
    """t(n) = a + b n: the size converges to (budget - a) / b; where the fixed part a
    exceeds the budget, to the n that stalls twice a one-token chunk (2 (a + b): n =
    (a + 2b) / b), so a join still ends (where one token fits, the budget stands): the
    H100's streamed case (a one-token chunk 0.7 s) prefills 1,024 tokens in 18 chunks,
    not 1,024 one-token ones, and 4,096 at the token cap."""
    from ssdmoe_tui.engine.run.join_chunks import FIXED_STALL, JoinSizer

    for a, b, want in ((0.05, 0.002, 100), (0.4, 0.002, 200), (0.0, 0.006, 41)):
        s = JoinSizer(budget_s=0.25, cap=512)
        for _ in range(40):
            n = s.size()
            s.measure(n, a + b * n)
        assert abs(s.size() - want) <= 2, (a, b, s.size())
    a, b = 0.7, 0.0005
    s, sizes = JoinSizer(budget_s=0.25, cap=128), []
    while sum(sizes) < 4096 and len(sizes) < 200:
        sizes.append(s.size())
        s.measure(sizes[-1], a + b * sizes[-1])
    assert sum(sizes[:18]) >= 1024  # the 1k join's 18 chunks
    assert set(sizes[12:]) == {128}  # at the cap it stays there (chunks of one size:
    # the last line fitted, not the plain ratio, which would shrink them again)
    assert max(a + b * n for n in sizes) <= FIXED_STALL * (a + b)
    s = JoinSizer(budget_s=0.25)  # one token fits (0.2 s), if only just: the budget
    for _ in range(40):  # stands, not twice a one-token chunk (0.4 s)
        n = s.size()
        s.measure(n, 0.1 + 0.1 * n)
    assert s.size() == 1
    s = JoinSizer(budget_s=0.25)
    s.measure(8, 0.7)  # one size seen: its time is all fixed part as far as known
    assert s.size() == 2
    s.measure(2, 0.69)
    assert s.size() == 3  # growth from the last chunk, at most GROWTH x (one token more)


def test_join_sizer_is_not_held_by_a_bad_line():
    """A line fitted to noisy first chunks (a review's case: b 250x too steep) or to costs
    that then change does not hold the size: chunks of one size that fit the target try
    the next size, and a chunk far over the target is sized from its own time."""
    from ssdmoe_tui.engine.run.join_chunks import JoinSizer

    s = JoinSizer(budget_s=0.25, cap=128)
    for n, t in [(8, 1.33), (1, 0.49), (2, 0.50), (2, 0.50), (2, 0.56), (2, 0.51), (2, 0.55),
                 (2, 1.02), (2, 0.63)]:  # fmt: skip
        s.measure(n, t)  # what the sizer asked for, measured with noise
    sizes = []
    for _ in range(30):  # then the true costs: a = 0.7 s, b = 0.5 ms
        sizes.append(s.size())
        s.measure(sizes[-1], 0.7 + 0.0005 * sizes[-1])
    assert sizes[0] > 2 and sizes[-1] == 128
    s = JoinSizer(budget_s=0.25, cap=128)  # converged at 100 tokens, then 10x the compute
    for _ in range(30):
        n = s.size()
        s.measure(n, 0.05 + 0.002 * n)
    assert s.size() == 100
    s.measure(100, 0.05 + 0.02 * 100)
    assert s.size() <= 13
    for _ in range(20):
        n = s.size()
        s.measure(n, 0.05 + 0.02 * n)
    assert 9 <= s.size() <= 11  # (0.25 - 0.05) / 0.02
    s = JoinSizer(budget_s=0.25, cap=128)  # a line flat but for rounding: b ~ 4e-18
    s.measure(8, 0.1)
    s.measure(12, math.nextafter(0.1, 1.0))
    assert s.size() == 18  # growth-bound, not (target - a) / b
    s = JoinSizer(budget_s=1e-6)  # no chunk fits: twice a one-token chunk's stall,
    s.measure(s.size(), 0.012)  # (a + 2b) / b = 8 tokens
    for _ in range(30):
        n = s.size()
        s.measure(n, 0.003 + 0.0005 * n)
    assert 7 <= s.size() <= 9
    for bad in (0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="join_budget_s"):
            BatchRunner(None, join_budget_s=bad)  # type: ignore[arg-type]


def test_join_sizer_grows_past_one_token_when_the_fit_has_no_fixed_part():
    """A fit on a loaded machine can clamp the fixed part to a = 0 (the 2026-12-07 clean
    clone's failure: the first 8-token chunk slow, the one-token chunks fast). The target
    twice the fixed part was then 0, every chunk one token, and once the 8-token chunk
    left the fit's window the one-size line was never refitted: the join went a token a
    chunk until the row it joined had ended. Twice a one-token chunk's stall is at least
    two tokens, so the chunks have two sizes again and the line is refitted."""
    from ssdmoe_tui.engine.run.join_chunks import FIT_CHUNKS, JoinSizer

    s = JoinSizer(budget_s=1e-6)
    assert s.size() == 8
    s.measure(8, 0.40)  # the first chunk under load: 8 tokens 10x one token's time
    sizes = []
    for _ in range(3 * FIT_CHUNKS):  # then the true costs: a = 2 ms, b = 3 ms
        sizes.append(s.size())
        s.measure(sizes[-1], 0.002 + 0.003 * sizes[-1])
    assert s.fit()[0] == pytest.approx(0.002, abs=1e-9)  # refitted on two sizes or more
    assert min(sizes[FIT_CHUNKS:]) >= 2 and sizes[-1] == 2  # (a + 2b) / b = 2.67
    s = JoinSizer(budget_s=1e-6)  # costs with no fixed part at all: two tokens a chunk
    for _ in range(3 * FIT_CHUNKS):
        n = s.size()
        s.measure(n, 0.003 * n)
    assert s.size() == 2


def test_the_step_split_and_batchgenerator_over_the_engines_model(checkpoints):
    """What scripts/batch_vs_mlx.py's `--host-split --bg-streamed` rest on: the batch
    step's build / queue / sync figures cover its steps, mlx-lm's `BatchGenerator` runs
    over the engine's own frozen model (timed, as over mlx-lm's: its forward calls,
    queueing and sync, the rest its read and loop) and its rows' greedy
    tokens are the engine's batch's and those of `BatchGenerator` over mlx-lm's model."""
    from ssdmoe_tui.bench.batch import row_prompts
    from ssdmoe_tui.bench.batch_compare import ResidentBatch, TimedModel, engine_batch

    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    ps = row_prompts(prompts(sm)[0], 3)
    engine_batch(runner, ps, 4)  # the warm-up: every layer read, frozen
    assert sm.cache.all_frozen
    sm.model = TimedModel(sm.model)
    ours = engine_batch(runner, ps, 24)
    split = ours.host_split()
    assert ours.window_steps >= 6 and all(split[k] > 0 for k in ("step", "model", "build"))
    assert split["model"] <= split["build"] and split["queue"] >= 0 and split["sync"] >= 0
    # the tokens handed out after the sync (reading them a part of it, and the row that
    # ended in the window's last step leaving another), the rest the loop's
    assert 0 < split["to_host"] and 0 < split["leave"] and split["other"] >= 0
    assert split["to_host"] + split["leave"] <= split["deliver"] + 1e-3  # each rounded
    parts = sum(split[k] for k in ("build", "queue", "sync", "deliver", "other"))
    assert parts == pytest.approx(split["step"], abs=1e-3)
    # (its rows detokenized every step too, as mlx_lm.server's loop does: --bg-detok);
    # BatchGenerator's queue and sync timed through mlx.core's functions, put back after
    eval_before = (mx.eval, mx.async_eval)
    over = ResidentBatch.over(sm.model, sm.tokenizer).batch(ps, 24, detok=True)
    assert (mx.eval, mx.async_eval) == eval_before
    bg = over.host_split()
    assert bg["model"] == bg["build"] > 0 and bg["queue"] > 0 and bg["sync"] > 0
    assert bg["deliver"] is None and bg["other"] > 0  # its read and loop
    assert sum(bg[k] for k in ("build", "queue", "sync", "other")) == pytest.approx(
        bg["step"], abs=1e-3
    )
    theirs = ResidentBatch(path, sm.dtype).batch(ps, 24)
    assert over.tokens == ours.tokens == theirs.tokens


def test_the_spy_summary_places_samples_at_the_loops_lines(tmp_path) -> None:
    """scripts/batch_spy_summary.py, run as y.sh runs it, on a py-spy raw profile: each
    side's samples at its deepest loop line with the innermost named native frame (bare
    addresses skipped), shares of the side; a missing file is one line, exit 2."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    eng = "main (x.py:1);engine_batch (ssdmoe_tui/bench/batch_compare.py:190);step (ssdmoe_tui/engine/run/batch.py:329)"
    bg = "main (x.py:2);batch (ssdmoe_tui/bench/batch_compare.py:250);next (mlx_lm/generate.py:1500);_step (mlx_lm/generate.py:1434)"
    raw = tmp_path / "spy.txt"
    raw.write_text(
        f"{eng};_deliver (ssdmoe_tui/engine/run/batch.py:610);cuStreamSynchronize (libcuda.so.1);0x7f00 (libc.so.6) 30\n"
        f"{eng};_decode (ssdmoe_tui/engine/run/batch.py:518);mlx::core::eval_impl (libmlx.so) 10\n"
        f"{bg};mlx::core::eval_impl (libmlx.so) 5\n"
        "main (x.py:3);other (y.py:4) 99\n",
        encoding="utf-8",
    )  # fmt: skip
    script = str(root / "scripts" / "batch_spy_summary.py")
    out = subprocess.run([sys.executable, script, str(raw)], capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    assert "75.0%     30  _deliver (ssdmoe_tui/engine/run/batch.py:610) | cuStreamSync" in out
    assert "25.0%     10  _decode (ssdmoe_tui/engine/run/batch.py:518) | mlx::core::eval_" in out
    assert "100.0%      5  _step (mlx_lm/generate.py:1434) | mlx::core::eval_impl" in out
    assert "other (y.py" not in out
    bad = subprocess.run([sys.executable, script, str(tmp_path / "none.txt")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "none.txt" in bad.stderr


def test_the_tolist_probe_times_each_way_and_size(tmp_path) -> None:
    """scripts/cuda_tolist_probe.py, run small on the CPU as z2.sh runs it on a GPU: a
    read time for each way (idle, unconsumed, direct, host input, the CPU-stream copy,
    pairs) and B, in the JSON it
    writes and the line it prints, and the queued work's own time."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "tolist.json"
    args = ["--rounds", "3", "--size", "128", "--busy-ms", "2", "--vocab", "500",
            "--batch", "1,8", "--json", str(out)]  # fmt: skip
    run = subprocess.run([sys.executable, str(root / "scripts" / "cuda_tolist_probe.py"), *args],
                         capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    res = json.loads(out.read_text(encoding="utf-8"))
    assert json.loads(run.stdout.splitlines()[0]) == res
    assert res["rounds"] == 3 and res["busy_matmuls"] >= 1 and res["busy_ms"] > 0
    ways = {"idle", "unconsumed", "direct", "host_input", "cpu_copy", "pairs"}
    assert set(res["read_us"]) == ways
    for per in res["read_us"].values():
        assert set(per) == {"1", "8"}
        assert all(0 < v["median"] <= v["p90"] for v in per.values())
    assert "| 8 | " in run.stdout
