"""The `device` slot placement's mirror (engine/experts/mirror.py), forced on the CPU with
SSDMOE_SLOT_MIRROR=on: the layers compute from the mirror, so their tokens equal mlx-lm's
only if every row a read fills (misses, read-ahead guesses) reaches the mirror before a
kernel uses it; small caches refill every slot many times over."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from ssdmoe_tui.engine.experts.cache import BANK_BYTES_ENV, slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.experts.mirror import MIRROR_ENV, SlotMirror, mirrors
from ssdmoe_tui.engine.experts.reader import buffer_address
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.errors import SsdmoeError
from tests.helpers.exact import MAX_TOKENS, PROMPT, reference_tokens


@pytest.fixture(autouse=True)
def _mirror_on(monkeypatch) -> None:
    monkeypatch.setenv(MIRROR_ENV, "on")


def _budget(path, share: float) -> str:
    index = build_index(path)
    return str(
        int(slot_memory_bytes(index, mx.float32) * index.num_experts * index.num_layers * share)
    )


def _addresses(cache) -> list[int]:
    return [buffer_address(memoryview(a)) for bank in cache.mirror.banks for a in bank.values()]


def _generate(sm, max_tokens: int = MAX_TOKENS):
    prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    return prompt, Runner(sm).generate(prompt, max_tokens=max_tokens)


def test_mirror_is_chosen_by_placement_and_a_bad_value_is_one_line(checkpoints, monkeypatch):
    assert mirrors("auto", "device")
    assert not any(mirrors("auto", p) for p in ("host", "managed", "none"))
    assert mirrors("on", "none") and not mirrors("off", "device")
    monkeypatch.setenv(MIRROR_ENV, "sometimes")
    with pytest.raises(SsdmoeError) as err:
        load_streamed(checkpoints("qwen3_moe"), expert_cache="1")
    assert str(err.value) == f"{MIRROR_ENV}='sometimes': use one of auto, on, off"


@pytest.mark.parametrize(
    ("pipeline", "banks"), [("off", None), ("full", None), ("compact", None), ("full", "20K")]
)
def test_tokens_equal_mlx_lm_computed_from_the_mirror(checkpoints, monkeypatch, pipeline, banks):
    """A fifth of the experts: every token misses and refills slots. Serial and pipelined
    layers (hits computed from the mirror while the misses are read, the misses after
    their copy), one bank and several; the mirror's buffers never move (each copy updates
    it in place, no bank is copied whole)."""
    monkeypatch.setenv(PIPELINE_ENV, pipeline)
    if banks:
        monkeypatch.setenv(BANK_BYTES_ENV, banks)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=_budget(path, 0.2))
    try:
        cache = sm.cache
        assert cache.bank_arrays(0)["up_proj"][0] is cache.mirror.banks[0]["up_proj.weight"]
        before = _addresses(cache)
        prompt, res = _generate(sm)
        assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
        assert res.stats.decode_misses >= len(res.tokens) - 1  # misses every token
        assert cache.mirror.rows > 2 * cache.capacity  # slots refilled, and copied again
        assert cache.mirror.pending == 0
        assert (sm.times.pipelined_calls > 0) == (pipeline != "off")
        assert (cache.num_banks > 2) == bool(banks)
        assert _addresses(cache) == before
    finally:
        sm.close()


def test_every_expert_held_freezes_on_tables_into_the_mirror(checkpoints) -> None:
    """A budget holding every expert: each layer freezes after its first visit, on a
    device lookup table into the mirror (no views of its rows, which would pin the
    mirror's buffer), and the tokens stay mlx-lm's."""
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    try:
        before = _addresses(sm.cache)
        prompt, res = _generate(sm)
        assert sm.cache.all_frozen
        assert all(sm.cache.layer_arrays(la) is None for la in range(sm.index.num_layers))
        assert res.tokens == reference_tokens(path, None, mx.float32, prompt)
        assert _addresses(sm.cache) == before
    finally:
        sm.close()


def test_a_stale_mirror_changes_the_tokens(checkpoints, monkeypatch) -> None:
    """The control: with the copies left out the layers compute from stale rows (what a
    missing copy would do), and the tokens are not mlx-lm's."""
    monkeypatch.setattr(SlotMirror, "sync", lambda self: 0)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=_budget(path, 0.2))
    try:
        prompt, res = _generate(sm, max_tokens=8)
        assert res.tokens != reference_tokens(path, None, mx.float32, prompt)[:8]
    finally:
        sm.close()


def test_a_slot_refilled_with_another_expert_is_copied_again(checkpoints) -> None:
    """Evict an expert and read another into its slot: the mirror's row follows."""
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1")
    try:
        cache = sm.cache
        name = "down_proj.weight"
        slot = int(cache.ensure(0, np.array([0]))[0])
        bank, row = divmod(slot, cache.bank_slots)

        def rows() -> tuple[np.ndarray, np.ndarray]:
            host = np.array(cache.banks[bank][name][row])
            return host, np.array(cache.mirror.banks[bank][name][row])

        first, seen = rows()
        assert first.any() and (seen == first).all()
        others = [(la, x) for la in range(cache.index.num_layers)
                  for x in range(cache.index.num_experts) if (la, x) != (0, 0)]  # fmt: skip
        for la, x in others:  # other experts until (0, 0) is evicted: its slot is taken
            cache.ensure(la, np.array([x]))
            if not cache.resident(0, 0):
                break
        assert cache._key_of[slot] not in (None, (0, 0))
        host, seen = rows()
        assert not (host == first).all() and (seen == host).all()
    finally:
        sm.close()


def test_read_ahead_guesses_reach_the_mirror(monkeypatch) -> None:
    """Decode read-ahead v2 reads guesses in the background; a guess later used is
    computed from the mirror, so it must be copied when the layer looks it up."""
    from pathlib import Path

    import ssdmoe_tui
    from ssdmoe_tui.engine.experts.prefetch import COLD_ENV

    demo = Path(ssdmoe_tui.__file__).parent / "models" / "demo_trained"  # predictable routing
    monkeypatch.setenv(COLD_ENV, "1")
    monkeypatch.setenv(PIPELINE_ENV, "full")
    sm = load_streamed(demo, expert_cache=_budget(demo, 0.3), prefetch=True)
    try:
        before = _addresses(sm.cache)
        prompt, res = _generate(sm)
        c = sm.cache.counters
        assert c.prefetch_issued > 0 and c.prefetch_used > 0
        assert res.tokens == reference_tokens(demo, None, mx.float32, prompt)
        assert _addresses(sm.cache) == before
    finally:
        sm.close()


def test_a_batch_computed_from_the_mirror_equals_its_rows_alone(checkpoints) -> None:
    """Rows of several sequences look up the union of their experts: the smallest cache
    refills slots every step, and each row's tokens are its tokens alone."""
    from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec
    from ssdmoe_tui.engine.run.runner import Done

    sm = load_streamed(checkpoints("qwen3_5_moe"), expert_cache="1")
    try:
        runner = Runner(sm)
        texts = ["Tell me about mixtures of experts, please.", "Hi", "Why is the sky blue?"]
        lengths = [12, 6, 9]
        ps = [
            sm.tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True
            )
            for t in texts
        ]
        alone = [runner.generate(p, max_tokens=n).tokens for p, n in zip(ps, lengths, strict=True)]
        batch = BatchRunner(runner, max_batch=3, join_budget_s=None)
        for i, (p, n) in enumerate(zip(ps, lengths, strict=True)):
            batch.add(SeqSpec(i, p, max_tokens=n))
        got = {uid: ev.result.tokens for uid, ev in batch.drain() if isinstance(ev, Done)}
        assert [got[i] for i in range(3)] == alone
        assert batch.figures.row_tokens > batch.figures.steps  # rows really shared steps
        assert sm.cache.mirror.rows > 0
    finally:
        sm.close()


def test_trace_routed_run_matches_the_run_without_a_mirror(tmp_path_factory, monkeypatch):
    """Trace-driven routing with its co-occurrence read-ahead: the same tokens and the same
    hits with the mirror as computing from the slots themselves."""
    from ssdmoe_tui.engine.policy import trace_routing
    from tests.helpers.traces import QWEN, cut_trace, shaped_checkpoint

    layers = 4
    path = shaped_checkpoint(tmp_path_factory.mktemp("mirror-trace") / "ckpt", layers, 6)
    trace = cut_trace(QWEN, tmp_path_factory.mktemp("mirror-cut") / "cut.jsonl", layers, 24)
    index = build_index(path)
    budget = str(16 * layers * slot_memory_bytes(index, mx.float32))
    runs = {}
    for mode in ("off", "on"):
        monkeypatch.setenv(MIRROR_ENV, mode)
        sm = load_streamed(path, expert_cache=budget, prefetch=True)
        try:
            assert (sm.cache.mirror is not None) == (mode == "on")
            routing = trace_routing.attach(sm, trace)
            sm.tokenizer.eos_token_ids = set()
            runner = Runner(sm, prefill_step_size=64)
            runner.k = routing.k
            res = runner.generate(list(range(3, 19)), max_tokens=len(routing.decode))
            c = sm.cache.counters
            runs[mode] = (res.tokens, c.hits, c.misses, c.prefetch_issued)
        finally:
            sm.close()
    assert runs["on"] == runs["off"]
    assert runs["on"][2] > 0 and runs["on"][3] > 0


@pytest.mark.parametrize("stage", ["on", "off"])
def test_a_long_prefill_chunk_reads_ahead_into_the_mirror(checkpoints, monkeypatch, stage):
    """A long chunk reads the next layer's predicted union while a layer computes
    (prefill read-ahead): those rows reach the mirror at the next layer's lookup; staged
    or not, the chunk's tokens stay mlx-lm's."""
    from mlx_lm import load, stream_generate

    from ssdmoe_tui.engine.model.loader import cast_model
    from ssdmoe_tui.engine.model.streamed import LONG_CHUNK_ROWS, READAHEAD_ENV, STAGE_ENV

    monkeypatch.setenv(READAHEAD_ENV, "on")
    monkeypatch.setenv(STAGE_ENV, stage)
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=_budget(path, 0.5))
    try:
        prompt = [5 + (i * 7) % 500 for i in range(LONG_CHUNK_ROWS // sm.trained_k + 8)]
        res = Runner(sm, prefill_step_size=len(prompt)).generate(prompt, max_tokens=6)
        assert sm.times.readahead_calls > 0 and sm.cache.counters.prefetch_used > 0
        assert (sm.times.staged_calls > 0) == (stage == "on")
    finally:
        sm.close()
    model, tok = load(str(path))
    cast_model(model, mx.float32)
    ref = stream_generate(model, tok, mx.array(prompt), max_tokens=6, prefill_step_size=len(prompt))
    assert res.tokens == [r.token for r in ref]


@pytest.mark.parametrize(("step_rows", "waits"), [(None, 0), (3, 3)])
def test_a_large_sync_copies_in_steps_each_waited_for(monkeypatch, step_rows, waits) -> None:
    """Many rows marked at once (the catch-up after a long prompt staged ahead, a warm
    resume) are copied at most `SYNC_STEP_BYTES` at a time, each step waited for before
    the next gathers its rows (their temporaries never all held at once); a decode
    step's few rows never wait. Every row reaches the mirror, in place."""
    import ssdmoe_tui.engine.experts.mirror as mirror_mod
    from ssdmoe_tui.engine.experts.slack import slot_array

    rng = np.random.default_rng(5)
    banks = []
    for _ in range(2):  # two banks of 8 slots, two components each
        bank = {}
        for name, shape in (("w", (4, 6)), ("s", (4,))):
            a = slot_array(8, shape, mx.float32)
            a[...] = mx.array(rng.standard_normal((8, *shape)).astype(np.float32))
            mx.eval(a)
            bank[name] = a
        banks.append(bank)
    mirror = SlotMirror(banks, bank_slots=8)
    before = [buffer_address(memoryview(a)) for b in mirror.banks for a in b.values()]
    if step_rows is not None:
        monkeypatch.setattr(mirror_mod, "SYNC_STEP_BYTES", step_rows * mirror.row_bytes)
    evals = []
    real_eval = mx.eval
    monkeypatch.setattr(mirror_mod.mx, "eval", lambda *a: (evals.append(1), real_eval(*a)))
    mirror.mark(np.array([0, 1, 2, 3, 4, 9, 10, 11, 12, 15]))  # bank 0: 5 rows, bank 1: 5
    assert mirror.sync() == 10
    monkeypatch.setattr(mirror_mod.mx, "eval", real_eval)
    # 5 rows a bank in steps of 3: (3, 2) and (3, 2), a wait before each step but the first
    assert len(evals) == waits
    for b, host in enumerate(banks):
        for name, a in host.items():
            rows = [r - 8 * b for r in (0, 1, 2, 3, 4, 9, 10, 11, 12, 15) if r // 8 == b]
            got = np.array(mirror.banks[b][name][mx.array(rows)])
            assert np.array_equal(got, np.array(a[mx.array(rows)]))
    assert [buffer_address(memoryview(a)) for b in mirror.banks for a in b.values()] == before
