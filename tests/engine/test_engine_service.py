"""The engine thread: commands in, events out, a live K change, cancellation, errors."""

from __future__ import annotations

import threading
import time

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.service import EngineService
from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.prompting.chat_format import prompt_tokens
from tests.helpers.engine_events import Events, start


def chat_ids(tokenizer, text: str) -> tuple[int, ...]:
    """A user message as the engine takes it: token ids (the caller templates)."""
    return tuple(prompt_tokens(tokenizer, [{"role": "user", "content": text}]))


def test_generate_streams_tokens_and_stats(checkpoints):
    svc, ev = start(checkpoints("qwen3_moe"))
    try:
        ids = chat_ids(ev.tokenizer, "hello")
        svc.submit(P.Generate("r1", prompt_tokens=ids, sampling=SamplingOptions(max_tokens=40)))
        done, seen = ev.until(P.GenerationDone)
        toks = [e for e in seen if isinstance(e, P.Tokens)]
        assert len(toks) >= 1
        assert sum(len(t.token_ids) for t in toks) == len(done.token_ids)
        assert done.finish_reason in ("stop", "length")
        assert ev.threads == {"ssdmoe-engine"}
        sample, _ = ev.until(P.StatsSample)
        assert sample.generated_tokens == len(done.token_ids)
        assert sample.k == 4
        assert done.stats["expert_cache_misses"] > 0
    finally:
        svc.shutdown()


def test_k_change_applies_from_next_token_and_cancel(checkpoints):
    svc, ev = start(checkpoints("qwen3_moe"))
    try:
        svc.submit(
            P.Generate(
                "r2", prompt_tokens=tuple(range(3, 20)), sampling=SamplingOptions(max_tokens=400)
            )
        )
        first, _ = ev.until(P.Tokens)
        svc.set_k(2)
        time.sleep(0.3)
        t0 = time.monotonic()
        svc.cancel()
        done, _ = ev.until(P.GenerationDone)
        assert time.monotonic() - t0 < 1.0
        assert done.finish_reason == "cancelled"
        ks = list(done.k_per_token)
        assert ks[0] == 4 and ks[-1] == 2
        switch = ks.index(2)
        assert all(k == 4 for k in ks[:switch]) and all(k == 2 for k in ks[switch:])
    finally:
        svc.shutdown()


def test_errors_are_events_and_engine_survives(checkpoints, tmp_path):
    svc, ev = start(checkpoints("qwen3_moe"))
    try:
        svc.submit(P.LoadModel(path=str(tmp_path / "missing")))
        err, _ = ev.until(P.EngineError)
        assert "missing" in err.message and "\n" not in err.message
        svc.submit(P.LoadModel(path=str(checkpoints("qwen3_moe")), expert_cache="1"))
        loaded, _ = ev.until(P.ModelLoaded)
        ids = chat_ids(loaded.tokenizer, "hi")
        svc.submit(P.Generate("r3", prompt_tokens=ids, sampling=SamplingOptions(max_tokens=5)))
        done, _ = ev.until(P.GenerationDone)
        assert len(done.token_ids) >= 1
    finally:
        svc.shutdown()


def test_cancel_during_prefill_then_continue(checkpoints):
    """A prefill cut short leaves a usable partial cache; the next request reuses it."""
    ev = Events()
    svc = EngineService(ev.post, prefill_step_size=8)
    svc.start()
    try:
        svc.submit(P.LoadModel(path=str(checkpoints("qwen3_moe")), expert_cache="1"))
        ev.until(P.ModelLoaded)
        prompt = tuple(3 + (i * 7) % 900 for i in range(400))
        svc.submit(P.Generate("c1", prompt_tokens=prompt, sampling=SamplingOptions(max_tokens=4)))
        ev.until(P.PhaseChanged, pred=lambda e: e.phase == "prefill" and e.done > 0)
        svc.cancel()
        done, seen = ev.until(P.GenerationDone)
        assert done.finish_reason == "cancelled" and done.token_ids == ()
        assert not any(isinstance(e, P.EngineError) for e in seen)
        svc.submit(P.Generate("c2", prompt_tokens=prompt, sampling=SamplingOptions(max_tokens=4)))
        done2, seen2 = ev.until(P.GenerationDone)
        assert done2.finish_reason in ("length", "stop") and len(done2.token_ids) >= 1
        assert not any(isinstance(e, P.EngineError) for e in seen2)
        assert done2.stats["reused_prompt_tokens"] > 0
    finally:
        svc.shutdown()


def _still_usable(svc, ev, rid: str) -> None:
    """The model loaded before is still loaded: info, a reply, no fatal error."""
    assert svc.model_info is not None
    svc.submit(
        P.Generate(rid, prompt_tokens=tuple(range(3, 12)), sampling=SamplingOptions(max_tokens=3))
    )
    done, seen = ev.until(P.GenerationDone)
    assert done.finish_reason in ("stop", "length") and done.token_ids
    assert not any(isinstance(e, P.EngineError) for e in seen)


def test_bad_values_and_paths_never_unload_the_working_model(checkpoints, tmp_path):
    """The three reproduced bugs: `banana` as the cache budget, K=999, `open <typo>`:
    one line each, non-fatal, and the model that was loaded stays loaded and usable."""
    svc, ev = start(checkpoints("qwen3_moe"))
    try:
        path = svc.model_info.path
        cases = [
            (P.SetExpertCache("banana"), "banana"),
            (P.SetExpertCache("inf"), "inf"),
            (P.LoadModel(path=path, k=999), "999"),
            (P.LoadModel(path=path, expert_cache="banana"), "banana"),
            (P.LoadModel(path=str(tmp_path / "typo")), "typo"),
        ]
        for i, (cmd, named) in enumerate(cases):
            svc.submit(cmd)
            err, seen = ev.until(P.EngineError)
            assert named in err.message and "\n" not in err.message, err.message
            assert not err.fatal, err.message
            assert not any(isinstance(e, P.ModelLoaded) for e in seen)
            assert "unloading" not in " ".join(
                e.detail for e in seen if isinstance(e, P.PhaseChanged)
            )
            _still_usable(svc, ev, f"after-{i}")
        assert svc.model_info.path == path
    finally:
        svc.shutdown()


def test_tiny_budget_is_raised_to_the_minimum_with_one_notice(checkpoints):
    svc, ev = start(checkpoints("qwen3_moe"))  # expert_cache="1"
    try:
        svc.submit(P.SetExpertCache("1K"))
        loaded, seen = ev.until(P.ModelLoaded)
        notes = [e.message for e in seen if isinstance(e, P.Notice) and "minimum" in e.message]
        assert len(notes) == 1 and "1K" in notes[0], notes
        assert f"{loaded.info.expert_cache_budget:,} bytes" in notes[0]
    finally:
        svc.shutdown()


def test_set_k_command_is_checked_and_reported_live(checkpoints):
    svc, ev = start(checkpoints("qwen3_moe"))
    try:
        n = svc.model_info.num_experts
        svc.submit(P.SetK(n + 1))
        err, _ = ev.until(P.EngineError)
        assert f"{n + 1}" in err.message and not err.fatal
        svc.submit(P.SetK(2))
        assert svc.model_info.k == 2  # ModelInfo reports the live K, not the loaded one
        svc.submit(
            P.Generate(
                "k2", prompt_tokens=tuple(range(3, 12)), sampling=SamplingOptions(max_tokens=4)
            )
        )
        done, _ = ev.until(P.GenerationDone)
        assert set(done.k_per_token) == {2} and done.stats["k"] == 2
        sample, _ = ev.until(P.StatsSample)
        assert sample.k == 2
    finally:
        svc.shutdown()


def test_k_999_at_start_fails_before_loading_and_holds_no_lock(checkpoints):
    """`k = 999` in the config: refused on the header, before any weights load, and the
    machine-wide model lock is not left held (another engine can load at once)."""
    path = str(checkpoints("qwen3_moe"))
    ev = Events()
    svc = EngineService(ev.post)
    svc.start()
    other = None
    try:
        svc.submit(P.LoadModel(path=path, k=999, expert_cache="1"))
        err, seen = ev.until(P.EngineError)
        assert "K=999" in err.message and err.fatal  # fatal: no model is loaded
        assert not any(isinstance(e, P.PhaseChanged) and e.phase == "indexing" for e in seen)
        assert svc.model_info is None
        other, ev2 = start(path)  # would fail with "model locked" if the lock were held
        assert other.model_info is not None
    finally:
        svc.shutdown()
        if other is not None:
            other.shutdown()


def test_engine_thread_clears_its_mlx_streams_before_it_ends(checkpoints, monkeypatch):
    """MLX wants every thread that used it to call `clear_streams()` before it ends (else
    the thread-local cleanup may run in interpreter teardown and abort the process):
    the engine thread does, after the model was used, once, and on its own thread."""
    import mlx.core as mx

    calls: list[str] = []
    real = mx.clear_streams
    monkeypatch.setattr(
        mx, "clear_streams", lambda: (calls.append(threading.current_thread().name), real())
    )
    svc, ev = start(checkpoints("qwen3_moe"))
    svc.submit(
        P.Generate(
            "r1", prompt_tokens=chat_ids(ev.tokenizer, "hi"), sampling=SamplingOptions(max_tokens=4)
        )
    )
    ev.until(P.GenerationDone)
    assert calls == []  # not while it serves
    svc.shutdown()
    assert calls == ["ssdmoe-engine"]


def test_speculation_per_request_and_the_service_default(checkpoints):
    """A Generate's `speculate` (or the service's when it names none) runs the turn
    speculating; its figures reach GenerationDone and the stats samples; a bad value
    fails that request only, with one line."""
    from ssdmoe_tui.options import Speculation

    ev = Events()
    svc = EngineService(ev.post, max_batch=4, speculate=Speculation("ngram"))
    svc.start()
    try:
        svc.submit(P.LoadModel(path=str(checkpoints("qwen3_moe")), expert_cache="1G"))
        ev.until(P.ModelLoaded)
        ids = tuple([5, 6, 7, 8] * 8)
        svc.submit(
            P.Generate(
                "off", prompt_tokens=ids, sampling=SamplingOptions(max_tokens=12), speculate="off"
            )
        )
        plain, _ = ev.until(P.GenerationDone)
        assert plain.stats["speculation"] is None
        svc.submit(P.Generate("dflt", prompt_tokens=ids, sampling=SamplingOptions(max_tokens=12)))
        done, seen = ev.until(P.GenerationDone)
        assert done.token_ids == plain.token_ids
        assert done.stats["speculation"]["mode"] == "ngram"
        assert any(isinstance(e, P.StatsSample) and e.speculation for e in seen)
        svc.submit(
            P.Generate(
                "bad", prompt_tokens=ids, sampling=SamplingOptions(max_tokens=4), speculate="7"
            )
        )
        err, _ = ev.until(P.EngineError)
        assert err.message.startswith("--speculate '7'") and "\n" not in err.message
        svc.submit(
            P.Generate(
                "mtp", prompt_tokens=ids, sampling=SamplingOptions(max_tokens=4), speculate="mtp"
            )
        )
        err, _ = ev.until(P.EngineError)
        assert "no MTP head" in err.message
    finally:
        svc.shutdown()


def test_mtp_as_the_default_is_refused_at_load(checkpoints):
    """`serve --speculate mtp` on a checkpoint without an MTP head: the load fails in one
    line (the server exits with it), rather than every later request failing."""
    from ssdmoe_tui.options import Speculation

    ev = Events()
    svc = EngineService(ev.post, speculate=Speculation("mtp"))
    svc.start()
    try:
        svc.submit(P.LoadModel(path=str(checkpoints("qwen3_moe")), expert_cache="1G"))
        err, seen = ev.until(P.EngineError)
        assert "no MTP head" in err.message and "\n" not in err.message
        assert not any(isinstance(e, P.ModelLoaded) for e in seen)
    finally:
        svc.shutdown()
