"""Warm resume: the expert cache's working set is saved with a conversation's KV
checkpoint and read back in the background on resume (real engine, demo model, real
files). Counted, not timed: after the warm-up the cache holds the saved experts, and
the first reply after the restart hits the cache more often than without it, with the
same greedy tokens."""

from __future__ import annotations

import json
import os
import queue
import stat
import time

import numpy as np
import pytest

from ssdmoe_tui.engine.experts.warm import WarmUp
from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.service import EngineService
from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.prompting.message import Message
from ssdmoe_tui.sessions.app_sessions import AppSessions
from ssdmoe_tui.sessions.expert_set import FILE, load_working_set, save_working_set
from ssdmoe_tui.sessions.kv_hooks import session_hooks
from ssdmoe_tui.sessions.store import SessionStore
from tests.helpers.engine_events import next_of

TIMEOUT = 120
FIRST = " ".join(["experts stream from the disk into slots of memory as tokens need them"] * 6)


class Engine:
    """An EngineService with the app's session hooks, and its events."""

    def __init__(self, model, cache: str) -> None:
        self.events: queue.Queue = queue.Queue()
        self.notices: list[str] = []
        self.svc = EngineService(self.events.put, kv_hooks=session_hooks)
        self.svc.start()
        self.svc.submit(P.LoadModel(path=str(model), expert_cache=cache))
        loaded = self.wait(P.ModelLoaded)
        self.info, self.tok = loaded.info, loaded.tokenizer

    @property
    def cache(self):
        return self.svc._runner.sm.cache

    def wait(self, kind):
        return next_of(self.events, kind, self.notices, TIMEOUT)

    def reply(self, sessions: AppSessions, conv_id: str, chat: list[Message]) -> P.GenerationDone:
        prompt = sessions.prompt(conv_id, chat, self.tok, self.info)
        assert prompt
        self.svc.submit(
            P.Generate(
                "r",
                prompt_tokens=tuple(prompt),
                sampling=SamplingOptions(max_tokens=12),
                session_id=conv_id,
            )
        )
        done = self.wait(P.GenerationDone)
        deadline = time.monotonic() + TIMEOUT
        while self.svc.busy and time.monotonic() < deadline:  # the saves run after it
            time.sleep(0.01)
        assert not self.svc.busy and done.finish_reason in ("stop", "length")
        return done

    def close(self) -> None:
        self.svc.shutdown()


def small_cache(model) -> str:
    """Room for three tokens' experts: the first reply's misses matter."""
    probe = Engine(model, "1")  # raised to the minimum (K x layers), with one notice
    budget = probe.info.expert_cache_budget
    probe.close()
    return str(3 * budget)


@pytest.mark.parametrize("mirror", ["auto", "on"])
def test_working_set_saved_then_warmed_after_a_restart(demo_model, monkeypatch, mirror):
    """`on`: the layers compute from a slot mirror (engine/experts/mirror.py), so the
    warm-up's rows, read on its own thread, must reach the mirror before the reply."""
    monkeypatch.setenv("SSDMOE_SLOT_MIRROR", mirror)
    cache = small_cache(demo_model)
    sessions = AppSessions(SessionStore())
    a = Engine(demo_model, cache)
    conv_id = sessions.open(None)[0]
    chat = [Message("user", FIRST)]
    done = a.reply(sessions, conv_id, chat)
    chat.append(Message("assistant", done.text))
    sessions.record(conv_id, chat, done, a.info.name)
    saved = a.cache.working_set()
    capacity = a.cache.capacity
    a.close()

    path = SessionStore().folder(conv_id) / FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    doc = json.loads(path.read_text())
    assert doc["fingerprint"] == a.info.fingerprint
    assert [(layer, tuple(ids)) for layer, ids in doc["layers"]] == [
        (layer, tuple(ids)) for layer, ids in saved
    ]
    assert 0 < sum(len(ids) for _, ids in saved) <= capacity
    assert not list(path.parent.glob(".experts.json.*"))  # atomic: no temp left

    turn2 = [*chat, Message("user", "and then what happens to the slots?")]

    # The restart with warm resume: the engine reads the saved experts back.
    b = Engine(demo_model, cache)
    got = sessions.working_set(conv_id, b.info)
    assert got.warning == "" and got.working_set is not None
    b.svc.submit(P.WarmExperts(got.working_set))
    warmed = b.wait(P.ExpertsWarmed)
    n = sum(len(ids) for _, ids in saved)
    assert (warmed.requested, warmed.read, warmed.no_room, warmed.cancelled) == (n, n, 0, False)
    assert warmed.bytes_read >= n * b.info.expert_bytes
    assert all(b.cache.resident(layer, e) for layer, ids in saved for e in ids)
    # ranked as saved: the most recently used are the last the policy would evict
    assert [(la, list(ids)) for la, ids in b.cache.working_set()] == [
        (la, list(ids)) for la, ids in saved
    ]
    warm = b.reply(sessions, conv_id, turn2)
    assert (b.cache.mirror is not None) == (mirror == "on")
    b.close()

    # The same restart without it.
    c = Engine(demo_model, cache)
    cold = c.reply(sessions, conv_id, turn2)
    c.close()

    assert warm.token_ids == cold.token_ids  # exact either way
    assert warm.stats["kv_hit_rate"] > 0.5 and cold.stats["kv_hit_rate"] > 0.5
    assert warm.stats["expert_cache_hits"] > cold.stats["expert_cache_hits"], (
        warm.stats,
        cold.stats,
    )
    assert warm.stats["expert_cache_hit_rate"] > cold.stats["expert_cache_hit_rate"]


def test_bad_working_sets_are_ignored_with_one_line(demo_model, tmp_path):
    e = Engine(demo_model, small_cache(demo_model))
    info = e.info
    try:
        save_working_set(tmp_path, [(0, [1, 2]), (1, [3])], info)
        assert load_working_set(tmp_path, info).working_set == ((0, (1, 2)), (1, (3,)))
        assert stat.S_IMODE((tmp_path / FILE).stat().st_mode) == 0o600
        doc = json.loads((tmp_path / FILE).read_text())
        cases = {
            "corrupt (not JSON)": b'{"format": "ssdmoe-exp',
            "out of range": {**doc, "layers": [[0, [info.num_experts]]]},
            "layer 99": {**doc, "layers": [[99, [0]]]},
            "another model": {**doc, "fingerprint": "other"},
            "an expert twice": {**doc, "layers": [[0, [1, 1]]]},
            "not an ssdmoe": {"format": "x"},
            "corrupt (a layer": {**doc, "layers": [[0, 1]]},
            "version True": {**doc, "version": True},  # issue 34: was taken as 1
            "version 1.0": {**doc, "version": 1.0},
        }
        for why, content in cases.items():
            data = content if isinstance(content, bytes) else json.dumps(content).encode()
            (tmp_path / FILE).write_bytes(data)
            got = load_working_set(tmp_path, info)
            assert got.working_set is None, why
            assert got.warning.startswith("expert working set ignored: experts.json: "), why
            assert why in got.warning and "\n" not in got.warning, got.warning
        os.truncate(tmp_path / FILE, 17 << 20)
        assert "-byte limit" in load_working_set(tmp_path, info).warning
        (tmp_path / FILE).unlink()
        # Issue 34 (4): a FIFO blocked the loader, a link to /dev/zero ran out of memory.
        for why, make in {
            "FIFO": lambda p: os.mkfifo(p),
            "character device": lambda p: os.symlink("/dev/zero", p),
            "symbolic link loop": lambda p: os.symlink(p.name, p),
        }.items():
            make(tmp_path / FILE)
            got = load_working_set(tmp_path, info)
            assert got.working_set is None and why in got.warning, got.warning
            assert got.warning.startswith("expert working set ignored: experts.json: ")
            (tmp_path / FILE).unlink()
        assert load_working_set(tmp_path, info).warning == ""  # none saved: silent

        # The engine checks again: ids out of range cost one notice, the rest is warmed.
        e.svc.submit(P.WarmExperts(((0, (1, info.num_experts, 2)), (info.num_layers, (0,)))))
        warmed = e.wait(P.ExpertsWarmed)
        assert warmed.requested == 2 and e.cache.resident(0, 1) and e.cache.resident(0, 2)
        assert [n for n in e.notices if "out of range" in n] == [
            f"expert warm-up: 2 ids out of range for {demo_model.name} ignored"
        ]
    finally:
        e.close()


def test_a_stopped_warm_up_gives_back_what_it_did_not_read(demo_model, monkeypatch):
    """Stopped at once (any command does it): the experts read are resident, the slots
    of those not read are free again, and the cache then works as usual."""
    import ssdmoe_tui.engine.experts.warm as warm

    monkeypatch.setattr(warm, "CHUNK_BYTES", 1)  # one expert per reader call
    e = Engine(demo_model, small_cache(demo_model))
    try:
        cache = e.cache
        ws = [(layer, list(range(cache.index.num_experts))) for layer in range(2)]
        free_before = len(cache._free)
        job = WarmUp(cache)
        job.start(ws, per_round=4)
        f = job.stop()
        claimed = min(free_before, sum(len(ids) for _, ids in ws))
        assert f.no_room == sum(len(ids) for _, ids in ws) - claimed
        resident = [(layer, x) for layer, ids in ws for x in ids if cache.resident(layer, x)]
        assert len(resident) == f.read and f.cancelled == (f.read < claimed)
        assert len(cache._free) == free_before - f.read
        # Round order: the first experts of every layer first.
        first = {x for layer, x in resident if layer == 0}
        assert first <= set(range(max(4, -(-f.read // 2) + 4)))
        got = cache.ensure(0, np.array([0, 1, 2, 3], dtype=np.int64))
        assert len(set(got.tolist())) == 4
    finally:
        e.close()
