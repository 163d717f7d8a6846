"""The engine thread: the one thread that ever touches MLX.

Metal and MLX-CUDA break when MLX is driven from several threads, so every MLX call
happens here. Clients submit commands (`protocol.py`) to a queue and receive events
through a non-blocking `post` callback. Tokens are batched (at most every ~25 ms)
and stats sampled (every ~200 ms) so the UI thread is never flooded. Importing this
module does not import MLX; the thread imports it on start.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ssdmoe_tui.engine import protocol as P
from ssdmoe_tui.errors import BadValueError, user_message

TOKEN_BATCH_S = 0.025
STATS_EVERY_S = 0.2


def _wait_os_thread_gone(thread: threading.Thread, timeout: float) -> None:
    """`join()` returns before the OS thread has run MLX's thread-exit cleanup; exiting
    the interpreter during it aborts the process ("terminate called without an active
    exception"). On Linux, wait until the kernel task is gone; elsewhere, a short grace."""
    tid = getattr(thread, "native_id", None)
    task = Path(f"/proc/self/task/{tid}") if tid is not None else None
    end = time.monotonic() + min(timeout, 2.0)
    if task is not None and Path("/proc/self/task").exists():
        while task.exists() and time.monotonic() < end:
            time.sleep(0.001)
    else:
        time.sleep(0.05)


@dataclass
class KVHooks:
    """Persistence hooks, called on the engine thread (sessions plug in here).

    save(session_id, tokens, cache, info): after a reply has been shown.
    load(session_id, tokens, info) -> (cache, n_tokens) | None: when no in-memory
    cache serves a session's prompt (e.g. after a restart).
    prompt(session_id, messages, tokenizer, info) -> token ids | None: the exact-history
    prompt (stored turn tokens + the templated new turn) instead of a re-render.
    """

    save: Callable | None = None
    load: Callable | None = None
    prompt: Callable | None = None


class EngineService:
    def __init__(
        self,
        post: Callable[[P.Event], None],
        *,
        prefill_step_size: int | None = None,
        persist_sessions: bool = False,
    ) -> None:
        """`persist_sessions`: attach the sessions store's KV hooks (checkpoints on disk,
        exact-history prompts) on the engine thread, so the UI never imports MLX."""
        self._post = post
        self._persist_sessions = persist_sessions
        self._queue: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._prefill_step_size = prefill_step_size
        self._sm = None
        self._runner = None
        self._pending_k: int | None = None
        self._busy = threading.Event()
        self.model_info: P.ModelInfo | None = None
        self.kv_hooks = KVHooks()
        self.kv_pool = None  # ssdmoe_tui.engine.kv_pool.KVPool, created on the engine thread
        self.kv_budget_bytes = 2 << 30
        self.last_stats: P.StatsSample | None = None
        self.last_result = None  # the last GenerationResult (engine-side record; tests read it)
        self.k_records: dict[str, tuple[int, ...]] = {}
        self._lock = None  # cross-process "one loaded model" lock (models.lock)
        self.use_model_lock = True

    # ------------------------------------------------------------------ client API
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="ssdmoe-engine", daemon=True)
            self._thread.start()

    def submit(self, cmd: P.Command) -> None:
        if isinstance(cmd, P.Generate):
            self._busy.set()
        if isinstance(cmd, (P.Generate, P.LoadModel)):
            self._cancel.clear()
        self._queue.put(cmd)

    def set_k(self, k: int) -> None:
        """Thread-safe; applies from the next token."""
        info = self.model_info
        if info is not None and not 1 <= k <= info.num_experts:
            raise BadValueError(f"K={k} is outside 1..{info.num_experts}")
        runner = self._runner
        if runner is not None:
            runner.request_k(k)
        else:
            self._pending_k = k

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def shutdown(self, timeout: float = 5.0) -> None:
        self._cancel.set()
        self._queue.put(P.Shutdown())
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            _wait_os_thread_gone(thread, timeout)

    # ------------------------------------------------------------------ engine thread
    def _emit(self, event: P.Event) -> None:
        try:
            self._post(event)
        except Exception:  # noqa: BLE001 - a broken client must not kill the engine
            pass

    def _attach_sessions(self) -> None:
        from ssdmoe_tui.sessions.kv_hooks import SessionKV
        from ssdmoe_tui.sessions.store import SessionStore

        kv = SessionKV(SessionStore(), notice=lambda msg: self._emit(P.Notice(msg)))
        self.kv_hooks = KVHooks(save=kv.save, load=kv.load, prompt=kv.prompt)

    def _main(self) -> None:
        if self._persist_sessions:
            try:
                self._attach_sessions()
            except Exception as e:  # noqa: BLE001 - chatting works without persistence
                self._emit(P.Notice(f"conversations will not be saved: {user_message(e)}"))
        while True:
            cmd = self._queue.get()
            try:
                if isinstance(cmd, P.Shutdown):
                    self._unload()
                    self._release_lock()
                    return
                if isinstance(cmd, P.LoadModel):
                    self._load(cmd)
                elif isinstance(cmd, P.Generate):
                    self._generate(cmd)
                elif isinstance(cmd, P.SetExpertCache):
                    self._set_cache(cmd)
            except Exception as e:  # noqa: BLE001 - every failure becomes one line for the user
                rid = getattr(cmd, "request_id", None)
                fatal = isinstance(cmd, P.LoadModel) or (
                    isinstance(cmd, P.SetExpertCache) and self._sm is None
                )
                self._emit(P.EngineError(user_message(e), request_id=rid, fatal=fatal))
                if isinstance(cmd, P.Generate):
                    self._emit(
                        P.GenerationDone(rid, "", (), (), "error", (), {"error": user_message(e)})
                    )
                self._emit(P.PhaseChanged("idle"))
            finally:
                if isinstance(cmd, P.Generate):
                    self._busy.clear()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _take_lock(self, path: Path) -> None:
        """One loaded model per machine: a second app instance is told who holds it."""
        if not self.use_model_lock:
            return
        from ssdmoe_tui.models.lock import acquire_model_lock

        if self._lock is None:
            self._lock = acquire_model_lock(str(path))
        else:
            self._lock.relabel(str(path))

    def _unload(self) -> None:
        if self._sm is not None:
            import mlx.core as mx

            self._sm.close()
            self._sm = None
            self._runner = None
            self.kv_pool = None
            self.model_info = None
            gc.collect()
            mx.clear_cache()

    def _load(self, cmd: P.LoadModel) -> None:
        from ssdmoe_tui.engine.loader import load_streamed
        from ssdmoe_tui.engine.runner import Runner

        self._emit(P.PhaseChanged("loading", detail="unloading previous model" if self._sm else ""))
        self._unload()
        path = self._resolve(cmd.path)
        self._take_lock(path)
        self._emit(P.PhaseChanged("indexing", detail=str(path)))
        sm = load_streamed(
            path,
            expert_cache=cmd.expert_cache,
            dtype=cmd.dtype,
            progress=lambda msg: self._emit(P.PhaseChanged("loading", detail=msg)),
        )
        self._sm = sm
        runner = Runner(sm, prefill_step_size=self._prefill_step_size)
        k = cmd.k if cmd.k is not None else self._pending_k
        self._pending_k = None
        if k is not None:
            sm.set_k(k)
            runner.k = k
        if cmd.prefill_k is not None:
            if not 1 <= cmd.prefill_k <= sm.index.num_experts:
                raise BadValueError(
                    f"prefill K={cmd.prefill_k} is outside 1..{sm.index.num_experts}"
                )
            runner.prefill_k = cmd.prefill_k
        self._runner = runner
        try:
            from ssdmoe_tui.engine.kv_pool import KVPool

            self.kv_pool = KVPool(self.kv_budget_bytes)
        except ImportError:
            self.kv_pool = None
        self.model_info = self._info()
        self._emit(P.ModelLoaded(self.model_info))
        self._emit(self._sample(None, None))
        self._emit(P.PhaseChanged("idle"))

    def _resolve(self, spec: str) -> Path:
        if not spec:
            from ssdmoe_tui.models.demo import ensure_demo_model

            return ensure_demo_model(
                progress=lambda msg: self._emit(P.PhaseChanged("loading", detail=msg))
            )
        from ssdmoe_tui.models.resolve import format_progress, resolve_model

        def progress(p) -> None:
            self._emit(
                P.PhaseChanged(
                    "loading",
                    p.downloaded_bytes,
                    p.total_bytes,
                    detail=f"downloading {format_progress(p)}",
                )
            )

        return Path(resolve_model(spec, progress=progress, cancel=self._cancel))

    def _info(self) -> P.ModelInfo:
        from ssdmoe_tui.engine.loader import device_name

        sm = self._sm
        cfg = sm.config.get("text_config", sm.config)
        return P.ModelInfo(
            name=sm.path.name,
            path=str(sm.path),
            model_type=sm.model_type,
            num_layers=sm.index.num_layers,
            num_experts=sm.index.num_experts,
            trained_k=sm.trained_k,
            k=self._runner.k,
            prefill_k=self._runner.prefill_k or self._runner.k,
            max_context=int(cfg.get("max_position_embeddings", 0) or 0),
            device=device_name(),
            dtype=str(sm.dtype).removeprefix("mlx.core."),
            expert_bytes=sm.index.expert_bytes,
            resident_bytes=sm.resident_bytes,
            expert_cache_budget=sm.cache.budget_bytes,
            reader=sm.cache.reader.name,
            fingerprint=sm.index.key,
            hybrid=sm.hybrid,
            expert_source=sm.expert_source,
            expert_source_note=sm.expert_source_note,
            slot_placement=sm.cache.placement.placement,
        )

    def _set_cache(self, cmd: P.SetExpertCache) -> None:
        if self._sm is None:
            raise BadValueError("no model loaded")
        if cmd.size != "auto":
            from ssdmoe_tui.engine.cache import parse_size

            try:
                parse_size(cmd.size)  # a bad size must not cost the loaded model
            except ValueError as e:
                raise BadValueError(str(e)) from None
        info = self.model_info
        self._load(
            P.LoadModel(
                path=info.path,
                k=self._runner.k,
                prefill_k=self._runner.prefill_k,
                expert_cache=cmd.size,
                dtype=info.dtype,
            )
        )

    def _prompt_tokens(self, cmd: P.Generate) -> list[int]:
        if cmd.prompt_tokens is not None:
            return list(cmd.prompt_tokens)
        if not cmd.messages:
            raise BadValueError("empty prompt")
        tok = self._sm.tokenizer
        hooks = self.kv_hooks
        if cmd.session_id and hooks.prompt is not None:
            ids = hooks.prompt(cmd.session_id, cmd.messages, tok, self.model_info)
            if ids:
                return list(ids)
        msgs = [{"role": m.role, "content": m.content} for m in cmd.messages]
        if getattr(tok, "chat_template", None):
            return list(tok.apply_chat_template(msgs, add_generation_prompt=True))
        return list(tok.encode("\n".join(m["content"] for m in msgs)))

    def _generate(self, cmd: P.Generate) -> None:
        import mlx.core as mx
        from mlx_lm.sample_utils import make_sampler

        if self._sm is None:
            raise BadValueError("no model loaded: open a model first")
        runner = self._runner
        prompt = self._prompt_tokens(cmd)
        if cmd.seed is not None:
            mx.random.seed(cmd.seed)
        cache, reused = self._take_cache(cmd.session_id, prompt)
        if cache is None:  # made here so live samples can report its size
            cache, reused = runner.make_cache(), 0
        sampler = make_sampler(cmd.temp, top_p=cmd.top_p)

        pending: list[int] = []
        pending_text: list[str] = []
        last_flush = [time.monotonic()]
        last_stats = [0.0]
        last_prefill = [0.0]

        def flush() -> None:
            if pending or pending_text:
                self._emit(P.Tokens(cmd.request_id, "".join(pending_text), tuple(pending)))
                pending.clear()
                pending_text.clear()
            last_flush[0] = time.monotonic()

        def on_token(tok: int, piece: str, stats) -> None:
            pending.append(tok)
            if piece:
                pending_text.append(piece)
            now = time.monotonic()
            if now - last_flush[0] >= TOKEN_BATCH_S:
                flush()
            if now - last_stats[0] >= STATS_EVERY_S:
                last_stats[0] = now
                self._emit(self._sample(stats, cache))

        def on_prefill(done: int, total: int) -> None:
            now = time.monotonic()
            if done in (0, total) or now - last_prefill[0] >= 0.1:
                last_prefill[0] = now
                phase = "prefill" if done < total else "decoding"
                self._emit(P.PhaseChanged(phase, done, total))

        result = runner.generate(
            prompt,
            max_tokens=cmd.max_tokens,
            sampler=sampler,
            cache=cache,
            reused_tokens=reused,
            on_token=on_token,
            on_prefill=on_prefill,
            should_stop=self._cancel.is_set,
        )
        flush()
        self.last_result = result
        self.k_records[cmd.request_id] = tuple(result.stats.k_per_token)
        stats = result.stats.as_dict()
        stats["k"] = runner.k
        stats["reader"] = self._sm.cache.reader.name
        stats["slot_placement"] = self._sm.cache.placement.placement
        stats["expert_source"] = self._sm.expert_source
        self._emit(
            P.GenerationDone(
                cmd.request_id,
                result.text,
                tuple(prompt),
                tuple(result.tokens),
                result.finish_reason,
                tuple(result.stats.k_per_token),
                stats,
            )
        )
        self.last_stats = self._sample(result.stats, result.cache)
        self._emit(self.last_stats)
        self._emit(P.PhaseChanged("idle"))
        self._cancel.clear()
        covered = result.covered_tokens
        if result.tokens:
            self._store_cache(cmd.session_id, covered, result.cache)
        elif covered and self.kv_pool is not None:
            # Cancelled during prefill: not a turn boundary, so memory only, no checkpoint.
            self.kv_pool.put(cmd.session_id or "_default", covered, result.cache)

    # ------------------------------------------------------------------ KV reuse
    def _take_cache(self, session_id: str | None, prompt: list[int]):
        key = session_id or "_default"
        if self.kv_pool is not None:
            cache, n = self.kv_pool.take(key, prompt)
            if cache is not None and n > 0:
                return cache, n
        if session_id and self.kv_hooks.load is not None:
            try:
                got = self.kv_hooks.load(session_id, prompt, self.model_info)
            except Exception as e:  # noqa: BLE001 - a bad checkpoint only costs a re-prefill
                self._emit(
                    P.Notice(f"checkpoint ignored: {user_message(e)}; rebuilding the context")
                )
                got = None
            if got is not None:
                cache, n = got
                if 0 < n < len(prompt):
                    return cache, n
        return None, 0

    def _store_cache(self, session_id: str | None, tokens: list[int], cache) -> None:
        key = session_id or "_default"
        if session_id and self.kv_hooks.save is not None:
            self._emit(P.PhaseChanged("saving"))
            try:
                self.kv_hooks.save(session_id, tokens, cache, self.model_info)
            except Exception as e:  # noqa: BLE001 - saving must never break chatting
                self._emit(P.Notice(f"could not save the KV checkpoint: {user_message(e)}"))
            self._emit(P.PhaseChanged("idle"))
        if self.kv_pool is not None:
            self.kv_pool.put(key, tokens, cache)

    # ------------------------------------------------------------------ stats
    def _sample(self, stats, cache) -> P.StatsSample:
        import mlx.core as mx

        from ssdmoe_tui.engine import iostats
        from ssdmoe_tui.engine.kv_pool import cache_nbytes

        sm = self._sm
        kv_bytes = 0
        ctx = 0
        if cache is not None:
            kv_bytes = cache_nbytes(cache)
            offs = [getattr(c, "offset", 0) for c in cache if hasattr(c, "offset")]
            ctx = max(offs) if offs else 0
        if stats is not None:
            ctx = max(ctx, stats.prompt_tokens + stats.generated_tokens)
        return P.StatsSample(
            decode_tok_s=stats.decode_tok_s if stats else 0.0,
            prefill_tok_s=stats.prefill_tok_s if stats else 0.0,
            ssd_mib_per_token=stats.ssd_mib_per_token() if stats else 0.0,
            requested_mib_per_token=stats.requested_mib_per_token() if stats else 0.0,
            expert_cache_hit_rate=stats.hit_rate if stats else 0.0,
            expert_cache_used_bytes=sm.cache.used_bytes,
            expert_cache_budget_bytes=sm.cache.budget_bytes,
            resident_bytes=sm.resident_bytes,
            kv_cache_bytes=kv_bytes,
            rss_bytes=iostats.rss_bytes() or 0,
            peak_rss_bytes=iostats.peak_rss_bytes() or 0,
            peak_memory_bytes=int(mx.get_peak_memory()),
            kv_hit_rate=stats.kv_hit_rate if stats else 0.0,
            context_tokens=ctx,
            max_context=self.model_info.max_context if self.model_info else 0,
            k=self._runner.k if self._runner else 0,
            generated_tokens=stats.generated_tokens if stats else 0,
            routing_mass=stats.routing_mass if stats else None,
            routing_mass_last=stats.mass_per_token[-1] if stats and stats.mass_per_token else None,
        )
