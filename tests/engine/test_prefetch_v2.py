"""Decode read-ahead v2 (engine/experts/prefetch.py): a few guesses into cold slots only,
a per-layer governor, greedy tokens unchanged; and the per-layer decode timeline."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import ssdmoe_tui
from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.experts.prefetch import COLD_ENV, LIMIT_ENV, OVERLAP_ENV, PrefetchGovernor
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.model.timeline import FIELDS, Timeline, summarize
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.errors import BadValueError
from tests.helpers.exact import MAX_TOKENS, PROMPT, reference_tokens

DEMO = Path(ssdmoe_tui.__file__).parent / "models" / "demo_trained"


def _share(path, share: float) -> str:
    """A budget of `share` of the checkpoint's experts, in slots."""
    index = build_index(path)
    return str(
        int(slot_memory_bytes(index, mx.float32) * index.num_experts * index.num_layers * share)
    )


def test_governor_switches_a_layer_off_and_probes_it_again() -> None:
    gov = PrefetchGovernor(3, window=4, min_precision=0.5, reprobe_tokens=2)
    gov.settle(1, 2, 2)
    gov.settle(1, 2, 1)  # 3 of 4 used: stays on
    assert gov.allowed(1)
    gov.settle(1, 2, 0)
    gov.settle(1, 2, 1)  # 1 of 4: off for 2 tokens
    assert not gov.allowed(1) and gov.allowed(2)
    gov.step()
    assert not gov.allowed(1)
    gov.step()
    assert gov.allowed(1)  # probed again
    assert gov.figures()["switched_off"] == [0, 1, 0]
    assert gov.figures()["precision"][1] == pytest.approx(4 / 8)
    gov.enabled = False
    assert not gov.allowed(2)


def test_governor_settings_from_env(monkeypatch) -> None:
    monkeypatch.setenv(LIMIT_ENV, "3")
    monkeypatch.setenv(COLD_ENV, "0")
    gov = PrefetchGovernor.from_env(4)
    assert (gov.limit, gov.cold_tokens) == (3, 0)
    assert gov.overlap  # the default
    monkeypatch.setenv(OVERLAP_ENV, "off")
    assert not PrefetchGovernor.from_env(4).overlap
    monkeypatch.setenv(OVERLAP_ENV, "maybe")
    with pytest.raises(BadValueError, match=f"{OVERLAP_ENV}='maybe': expected on or off"):
        PrefetchGovernor.from_env(4)
    monkeypatch.setenv(OVERLAP_ENV, "on")
    monkeypatch.setenv(LIMIT_ENV, "0")
    with pytest.raises(BadValueError, match=LIMIT_ENV):
        PrefetchGovernor.from_env(4)


def test_guesses_take_free_or_cold_slots_and_never_a_warm_one(checkpoints) -> None:
    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache=_share(path, 0.5))
    cache = sm.cache
    e = cache.index.num_experts
    cache.governor = gov = PrefetchGovernor(cache.index.num_layers, limit=2, cold_tokens=1)
    cache.clear()
    # Fill every slot, layer 0 first: a token asks for `per` experts of each layer.
    per = cache.capacity // cache.index.num_layers
    for layer in range(cache.index.num_layers):
        cache.ensure(layer, np.arange(per, dtype=np.int64))
    cache.step()
    cache.step()  # everything is now cold (not asked for in the last token)...
    warm = [(0, int(x)) for x in range(per)]
    cache.ensure(0, np.arange(per, dtype=np.int64))  # ...but layer 0's experts
    assert not cache._free
    before = set(cache._slot_of)
    guess = np.arange(e - 3, e, dtype=np.int64)  # three of layer 1 not resident
    assert cache.prefetch_cold(1, guess, pinned=set()) == 2  # the limit
    cache.wait_prefetch()
    gone = before - set(cache._slot_of)
    assert len(gone) == 2 and not gone & set(warm)
    assert all(cache.resident(1, int(x)) for x in guess[:2])
    # The layer then uses one: a hit read ahead (counted as a miss), and the governor knows.
    c0 = cache.counters.snapshot()
    cache.ensure(1, guess[:1])
    assert cache.counters.prefetch_used - c0.prefetch_used == 1
    assert cache.counters.bytes_read == c0.bytes_read  # nothing read on demand
    assert (gov.issued[1], gov.used[1]) == (2, 1)
    # Only warm slots left outside the free list: no guess is read.
    cache.step()
    for layer in range(cache.index.num_layers):
        cache.ensure(layer, np.array([cache._key_of[s][1] for s in range(cache.capacity)
                                      if cache._key_of[s][0] == layer], dtype=np.int64))  # fmt: skip
    assert cache.prefetch_cold(2, np.array([e - 1]), pinned=set()) == 0
    sm.close()


@pytest.mark.parametrize("share", [0.2, 0.4])
def test_demo_guesses_are_read_and_used_and_tokens_do_not_change(monkeypatch, share) -> None:
    """The trained demo's own routing is predictable from the previous layer: guesses
    are read and used, and the greedy tokens are plain mlx-lm's, as without read-ahead."""
    monkeypatch.setenv(COLD_ENV, "1")
    budget = _share(DEMO, share)
    runs = {}
    for pf in (False, True):
        sm = load_streamed(DEMO, expert_cache=budget, prefetch=pf)
        sm.times.timeline = Timeline()
        prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
        runs[pf] = (sm, Runner(sm).generate(prompt, max_tokens=MAX_TOKENS))
    sm, on = runs[True]
    c = sm.cache.counters
    assert c.prefetch_issued > 0 and c.prefetch_used > 0
    assert max(sm.cache.governor.issued) <= 2 * MAX_TOKENS  # at most `limit` a layer a token
    assert on.tokens == runs[False][1].tokens == reference_tokens(DEMO, None, mx.float32, prompt)
    rows = sm.times.timeline.array()
    assert rows.shape[1] == 2 + len(FIELDS) and len(rows) > 0
    s = summarize(rows)
    assert [d["layer"] for d in s["layers"]] == list(range(sm.index.num_layers))
    assert s["layers"][0]["pred_precision"] is None  # nothing predicts layer 0
    assert all(d["pred_precision"] > 0.3 for d in s["layers"][1:])  # chance: K/E = 1/8
    for _, (m, _) in runs.items():
        m.close()


def test_bench_timeline_writes_per_layer_medians(tmp_path, capsys, monkeypatch) -> None:
    from ssdmoe_tui.cli import main

    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(tmp_path / "locks"))
    out = tmp_path / "tl.json"
    rc = main(["bench", "--timeline", "--model", str(DEMO), "--prefetch", "both",
               "--expert-cache", _share(DEMO, 0.3), "--rounds", "1", "--prompt-tokens", "16",
               "--decode-tokens", "6", "--json", str(out)])  # fmt: skip
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res["modes"]) == {"off", "on"}
    assert all(m["same_tokens"] for m in res["modes"].values())
    assert res["modes"]["off"]["prefetch_issued"] == 0 == res["modes"]["off"]["prefetch_dropped"]
    assert res["modes"]["on"]["prefetch_dropped"] >= 0  # guesses never read (the overlap)
    layers = res["modes"]["on"]["timeline"]["layers"]
    assert len(layers) == 4 and {"sync_ms", "read_ms", "pf_issued_mean"} <= set(layers[0])
    assert res["sync_probe"]["bare_sync_ms"] >= 0
    text = capsys.readouterr().out
    assert "sync probe: bare" in text and "read-ahead on:" in text and "on / off" in text


def _slot_rows(cache, slot: int) -> list[bytes]:
    bank, row = divmod(int(slot), cache.bank_slots)
    return [np.array(a[row]).tobytes() for a in cache.banks[bank].values()]


def _guess_reader_calls(monkeypatch, before) -> None:
    """The guesses' reader (the cache opens it at its first guess) runs `before()` ahead
    of each of its reads: a real reader, its bytes held back (a gate, a delay)."""
    from ssdmoe_tui.engine.experts import reader as reader_mod

    real_open = reader_mod.open_reader

    def held_open(*args, **kwargs):
        rd = real_open(*args, **kwargs)
        real = rd.read_batch

        def read_batch(*a, **k):
            before()
            return real(*a, **k)

        rd.read_batch = read_batch
        return rd

    monkeypatch.setattr(reader_mod, "open_reader", held_open)


def _fill_cold(cache) -> int:
    """Every slot taken, the same number of experts a layer (returned), all of them cold:
    not asked for in the last token."""
    per = cache.capacity // cache.index.num_layers
    for layer in range(cache.index.num_layers):
        cache.ensure(layer, np.arange(per, dtype=np.int64))
    cache.step()
    cache.step()
    return per


def _governed(path, direct: bool = False):
    """A half-budget engine with read-ahead's governor (two guesses a layer, slots cold
    after a token), emptied; and one holding every expert, whose slots the test's are
    compared with."""
    sm = load_streamed(path, expert_cache=_share(path, 0.5), direct_io=direct)
    ref = load_streamed(path, expert_cache="1G")
    sm.cache.governor = PrefetchGovernor(sm.cache.index.num_layers, limit=2, cold_tokens=1)
    sm.cache.clear()
    return sm, ref


@pytest.mark.parametrize("direct", [False, True])
def test_a_layer_reads_its_misses_beside_its_guesses_still_landing(
    checkpoints, monkeypatch, direct
):
    """With `overlap` the layer's lookup does not wait for the guesses read ahead for it:
    it takes no victim among their slots, hands them back as landing, and its own misses
    are read (by the cache's reader) while the guesses' reader is still busy; `complete`
    then waits for the guesses, whose slots hold the experts' bytes. Guesses are read one
    at a time, most likely first: one not started when the lookup comes is never read
    (its slot free again, not counted as read ahead). The guesses' reader reads the
    cache's own handles, or, reading direct, its own."""
    import threading

    gate, in_guess = threading.Event(), threading.Event()

    def held() -> None:  # the guesses' reader waits until the gate opens
        in_guess.set()
        assert gate.wait(60)

    _guess_reader_calls(monkeypatch, held)
    sm, ref = _governed(checkpoints("qwen3_moe"), direct)
    try:
        cache = sm.cache
        e = cache.index.num_experts
        per = _fill_cold(cache)
        guess = np.array([e - 1, e - 2], dtype=np.int64)
        c0 = cache.counters.snapshot()
        assert cache.prefetch_cold(1, guess, pinned=set()) == 2
        landing = cache.slots_of(1, guess)[:1]  # the first, started; the second waits
        assert in_guess.wait(60)  # its read has started, and waits at the gate
        assert (cache._guess_io[1] is cache._fds) is not direct
        # Layer 1 asks for one guess and the experts it misses: each takes a victim.
        misses = np.arange(per, e - 2)
        assert len(misses) > 2 and not cache._free
        ask = np.concatenate([[e - 1], misses]).astype(np.int64)
        pending = cache.lookup(1, ask)
        assert pending.landing.tolist() == landing.tolist()
        assert pending.slots[0] == landing[0]  # the guess, still landing
        assert not cache.resident(1, e - 2)  # the other, never read
        c = cache.counters
        assert (c.prefetch_issued - c0.prefetch_issued, c.prefetch_dropped) == (1, 1)
        assert (cache.governor.issued[1], cache.governor.used[1]) == (1, 1)
        assert pending.read_experts.tolist() == misses.tolist()
        assert not set(pending.read_slots) & set(landing)
        assert set(pending.waiting) == set(pending.read_slots) | set(landing)
        done = threading.Thread(target=cache.complete, args=(pending,), daemon=True)
        done.start()
        deadline = 60.0
        while cache.counters.demand_read_s == 0 and deadline > 0:  # the misses, read
            done.join(0.05)  # while the guesses wait at the gate
            deadline -= 0.05
        assert cache.counters.demand_read_s > 0 and done.is_alive()
        gate.set()
        done.join(60)
        assert not done.is_alive()
        assert cache.counters.prefetch_used == 1 and cache._inflight is None
        for ex, slot in zip(ask, pending.slots, strict=True):  # every byte where it belongs
            want = ref.cache.ensure(1, np.array([ex]))[0]
            assert _slot_rows(cache, slot) == _slot_rows(ref.cache, want), int(ex)
        # With overlap off the cache's own reader reads the guess and the lookup waits
        # for it first, as read-ahead v2 did.
        cache.governor.overlap = False
        cache.step()
        cache.step()
        assert cache.prefetch_cold(2, guess, pinned=set()) == 2
        assert cache._inflight is not None and cache._inflight.keys is None
        pending = cache.lookup(2, guess[:1])
        assert pending.landing is None and cache._inflight is None
        assert cache.counters.prefetch_overlaps == 1  # layer 1's lookup only
    finally:
        gate.set()
        sm.close()
        ref.close()


@pytest.mark.parametrize("pipeline", ["off", "full", "compact"])
def test_guesses_landing_beside_the_misses_do_not_change_tokens(monkeypatch, pipeline) -> None:
    """The demo with read-ahead overlapping the layers' reads (the default), the serial
    and both pipelined layers (the hits computed while misses and guesses land): greedy
    tokens are plain mlx-lm's."""
    import time

    from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV

    # the guesses land 20 ms late, so compute that did not wait would read stale rows
    _guess_reader_calls(monkeypatch, lambda: time.sleep(0.02))
    monkeypatch.setenv(COLD_ENV, "1")
    monkeypatch.setenv(PIPELINE_ENV, pipeline)
    sm = load_streamed(DEMO, expert_cache=_share(DEMO, 0.3), prefetch=True)
    try:
        assert sm.cache.governor.overlap
        prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
        out = Runner(sm).generate(prompt, max_tokens=MAX_TOKENS)
        c = sm.cache.counters
        assert c.prefetch_used > 0 and c.prefetch_overlaps > 0
        assert out.tokens == reference_tokens(DEMO, None, mx.float32, prompt)
    finally:
        sm.close()


def test_a_lookup_waits_where_its_guesses_would_leave_it_no_victim(checkpoints) -> None:
    """The experts asked for and the guesses still landing together exceed the cache:
    the lookup waits for the guesses (which may then be evicted) instead of running out
    of victims (a review's case: 12 slots, a lookup of all 12)."""
    path = checkpoints("qwen3_moe")
    index = build_index(path)
    e = index.num_experts
    sm = load_streamed(path, expert_cache=str(slot_memory_bytes(index, mx.float32) * (e - 4)))
    try:
        cache = sm.cache
        cap = cache.capacity
        assert cap == e - 4
        cache.governor = PrefetchGovernor(cache.index.num_layers, limit=2, cold_tokens=1)
        cache.clear()
        cache.ensure(0, np.arange(cap - 2, dtype=np.int64))  # two slots left free
        cache.step()
        cache.step()
        assert cache.prefetch_cold(1, np.array([e - 1, e - 2]), pinned=set()) == 2
        ask = np.arange(cap, dtype=np.int64)  # the whole cache, the guesses not among them
        cache.ensure(1, ask)
        assert cache.counters.prefetch_overlaps == 0 and cache._inflight is None
        assert all(cache.resident(1, int(x)) for x in ask)
    finally:
        sm.close()


def test_a_guess_that_fails_to_read_is_forgotten(checkpoints, tmp_path) -> None:
    """A shard cut short while a guess is read from it: the layer's `complete` raises the
    ReadError naming the file (the guesses' reader reads the cache's own handles), the
    guessed slots are free again and nothing counts them as read ahead; once the file is
    whole again the layer's experts are read right on demand."""
    import os
    from concurrent import futures

    from ssdmoe_tui.engine.experts.reader import ReadError

    sm, ref = _governed(checkpoints("qwen3_moe"))
    try:
        cache = sm.cache
        e = cache.index.num_experts
        shard = str(sm.path / cache.index.layers[1].components[0].shard)
        handles = sorted(set(cache._fds[1].tolist()))
        saved = [os.dup(h) for h in handles]
        empty = tmp_path / "empty"
        empty.write_bytes(b"")
        fd = os.open(empty, os.O_RDONLY)
        try:
            for h in handles:  # layer 1's shards now read as empty files
                os.dup2(fd, h)
            guess = np.array([e - 2, e - 3], dtype=np.int64)
            assert cache.prefetch_cold(1, guess, pinned=set()) == 2
            # the first guess's read started and failed, which ended the guesses' read
            futures.wait([cache._inflight.future], timeout=60)
            pending = cache.lookup(1, np.array([e - 2]))  # a hit, "still landing"
            assert pending.landing is not None and not len(pending.read_experts)
            with pytest.raises(ReadError, match="short read") as err:
                cache.complete(pending)
            assert os.path.basename(shard) in str(err.value)
        finally:
            os.close(fd)
            for h, d in zip(handles, saved, strict=True):  # whole again
                os.dup2(d, h)
                os.close(d)
        assert cache._inflight is None
        assert not any(cache.resident(1, int(x)) for x in guess)
        assert not {(1, int(x)) for x in guess} & cache._prefetched
        for x in (e - 2, 0):  # read again, by the cache's own reader
            got = cache.ensure(1, np.array([x]))[0]
            want = ref.cache.ensure(1, np.array([x]))[0]
            assert _slot_rows(cache, got) == _slot_rows(ref.cache, want)
    finally:
        sm.close()
        ref.close()


def test_guesses_read_as_before_where_their_reader_gets_no_handles(checkpoints) -> None:
    """Reading direct, the guesses' reader opens the shards again; in a process out of
    file handles it cannot, and the guesses are read by the cache's reader with the
    lookup waiting for them, as before the overlap: no error, the same bytes."""
    import os
    import resource

    sm, ref = _governed(checkpoints("qwen3_moe"), direct=True)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        cache = sm.cache
        e = cache.index.num_experts
        guess = np.array([e - 2, e - 3], dtype=np.int64)
        lowest_free = os.dup(0)
        os.close(lowest_free)
        resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))  # no new handle
        try:
            assert cache.prefetch_cold(1, guess, pinned=set()) == 2
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert cache._guess_io is False and cache._inflight.keys is None
        pending = cache.lookup(1, guess[:1])
        assert pending.landing is None and cache._inflight is None
        cache.complete(pending)
        want = ref.cache.ensure(1, guess[:1])[0]
        assert _slot_rows(cache, pending.slots[0]) == _slot_rows(ref.cache, want)
    finally:
        sm.close()
        ref.close()


def test_guesses_not_started_when_their_layer_asks_are_never_read(checkpoints) -> None:
    """The prefetch thread still busy (held here) when the layer's lookup comes: none of
    its guesses is read, their slots serve the layer's own misses, which are read on
    demand with the right bytes."""
    import threading

    sm, ref = _governed(checkpoints("qwen3_moe"))
    busy = threading.Event()
    try:
        cache = sm.cache
        e = cache.index.num_experts
        assert cache.prefetch_cold(0, np.array([0]), pinned=set()) == 1  # the thread made
        cache.wait_prefetch()
        cache._pool.submit(busy.wait, 60)  # the prefetch thread, busy until released
        guess = np.array([e - 2, e - 3], dtype=np.int64)
        assert cache.prefetch_cold(1, guess, pinned=set()) == 2
        c0 = cache.counters.snapshot()
        pending = cache.lookup(1, guess[:1])  # not waiting for the busy thread
        assert pending.landing is None and cache._inflight is None
        assert cache.counters.prefetch_dropped == 2 and not cache.resident(1, e - 3)
        assert pending.read_experts.tolist() == [e - 2]  # a miss now, read on demand
        cache.complete(pending)
        c = cache.counters
        assert c.read_calls - c0.read_calls == 1  # the miss only: no guess was read
        assert c.bytes_read - c0.bytes_read == cache.index.expert_bytes
        assert c.prefetch_wait_s == c0.prefetch_wait_s
        busy.set()
        cache._pool.submit(lambda: None).result(60)  # the thread ran what it was asked
        assert cache.counters.bytes_read - c0.bytes_read == cache.index.expert_bytes
        want = ref.cache.ensure(1, guess[:1])[0]
        assert _slot_rows(cache, pending.slots[0]) == _slot_rows(ref.cache, want)
    finally:
        busy.set()
        sm.close()
        ref.close()


def test_a_guess_never_read_gives_its_slot_back_to_the_cold_expert_it_took(checkpoints):
    """Guesses take cold experts' slots; one never read leaves those bytes untouched, so
    the cold expert is resident again in its slot, as cold as it was."""
    import threading

    sm, ref = _governed(checkpoints("qwen3_moe"))
    busy = threading.Event()
    try:
        cache = sm.cache
        e = cache.index.num_experts
        _fill_cold(cache)
        cache.ensure(1, np.array([0]))  # warm
        cache.prefetch_cold(2, np.array([e - 1]), pinned=set())  # the prefetch thread
        cache.ensure(2, np.array([e - 1]))
        cache._pool.submit(busy.wait, 60)  # ...busy until released
        before = dict(cache._slot_of)
        last_use = cache._last_use.copy()
        guess = np.array([e - 2, e - 3], dtype=np.int64)
        assert cache.prefetch_cold(1, guess, pinned=set()) == 2
        taken = cache.slots_of(1, guess)
        old = [k for k, v in before.items() if v in set(taken.tolist())]
        assert len(old) == 2 and not any(cache.resident(*k) for k in old)
        pending = cache.lookup(1, np.array([0]))  # a hit: no victim, the guesses dropped
        assert pending.landing is None and cache.counters.prefetch_dropped == 2
        cache.complete(pending)
        for k in old:  # back, in the same slot, as cold, its bytes never overwritten
            s_ = before[k]
            assert cache._slot_of[k] == s_ and cache._key_of[s_] == k
            assert cache._last_use[s_] == last_use[s_]
            want = ref.cache.ensure(k[0], np.array([k[1]]))[0]
            assert _slot_rows(cache, s_) == _slot_rows(ref.cache, want)
        assert not any(cache.resident(1, int(x)) for x in guess)
        assert cache._layer_count == [
            sum(1 for k in cache._slot_of if k[0] == layer)
            for layer in range(cache.index.num_layers)
        ]
    finally:
        busy.set()
        sm.close()
        ref.close()
