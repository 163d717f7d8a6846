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
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.engine.run.turn import Turn, fail
from ssdmoe_tui.errors import BadValueError, user_message
from ssdmoe_tui.options import CacheBudget, EngineOptions, Speculation, check_k

if TYPE_CHECKING:
    from ssdmoe_tui.engine.run.runner import Runner


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


def _release_thread_streams() -> None:
    """Destroy the MLX streams this thread made, while the runtime is whole: MLX asks
    every thread that used it to call `clear_streams()` before it ends (ml-explore/mlx
    #3395, #4327); left to the thread-local destructors, the cleanup can run during
    interpreter teardown and abort ("terminate called without an active exception")."""
    mx = sys.modules.get("mlx.core")  # a thread that never loaded MLX has none to clear
    clear = getattr(mx, "clear_streams", None) if mx is not None else None  # MLX >= 0.31
    if clear is not None:
        try:
            mx.synchronize()
            clear()
        except Exception:  # noqa: BLE001 - the thread ends either way
            pass


@dataclass
class KVHooks:
    """Persistence hooks, called on the engine thread. The engine knows nothing of
    where they store things: the command that assembles the app injects them
    (`commands/chat.py` with `sessions.kv_hooks.session_hooks`).

    save(session_id, tokens, cache, info): after a reply has been shown.
    load(session_id, tokens, info) -> (cache, n_tokens) | None: when the disk serves a
    longer prefix of a session's prompt than memory (e.g. after a restart).
    covers(session_id, tokens, info) -> int: how many tokens `load` would serve, from
    headers only (no tensors read); asked before every prompt, so a checkpoint on disk
    that is longer than what memory holds is never passed over. Without it, `load` is
    asked only when memory serves nothing.
    save_experts(session_id, working_set, info): after `save`, the expert cache's
    working set (`ExpertCache.working_set`: per layer, ids most recent first), which a
    resume hands back as `WarmExperts`.
    """

    save: Callable | None = None
    load: Callable | None = None
    save_experts: Callable | None = None
    covers: Callable | None = None


@dataclass(frozen=True)
class _WarmFinished:
    """Internal: the warm-up `job` has read everything (posted by its thread)."""

    job: object


# Builds the hooks on the engine thread (so a store that imports MLX is imported
# there); gets a `notice(text)` that posts a Notice event.
KVHooksFactory = Callable[[Callable[[str], None]], KVHooks]


class EngineService:
    """The in-process engine (`protocol.EngineClient`): one thread owns MLX and the
    loaded model; commands go in through `submit`, events out through `post`."""

    takes_messages = False  # a reply is asked as token ids (Generate)

    def __init__(
        self,
        post: Callable[[P.Event], None],
        *,
        options: EngineOptions | None = None,
        prefill_step_size: int | None = None,
        kv_hooks: KVHooks | KVHooksFactory | None = None,
        max_batch: int | None = 1,
        speculate: Speculation | None = None,
    ) -> None:
        """`options`: what every LoadModel starts from (reader, prefetch, ...); a
        LoadModel sets the model, K, prefill K, expert cache and dtype on top.
        `kv_hooks`: persistence (or a factory called on the engine thread).
        `max_batch`: Generates decoded together (engine/run/batch_loop.py); 1: one at a
        time (the app); None: what the KV budget allows at the model's context, at
        least 4 (`auto_max_batch`, set at each load).
        `speculate`: speculative decoding for requests that name none (engine/spec); a
        request that speculates runs alone when no batch is running."""
        self._post = post
        self.options = options or EngineOptions()
        if prefill_step_size is not None:
            self.options = self.options.with_(prefill_step=prefill_step_size)
        self._hooks_source = kv_hooks
        self._queue: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._runner: Runner | None = None
        self._info: P.ModelInfo | None = None
        self._options = self.options  # what the loaded model was opened with
        self._busy = threading.Event()
        self.kv_hooks = kv_hooks if isinstance(kv_hooks, KVHooks) else KVHooks()
        self.kv_pool = None  # ssdmoe_tui.engine.run.kv_pool.KVPool, created on the engine thread
        self.kv_budget_bytes = 2 << 30
        self.last_stats: P.StatsSample | None = None
        self._lock = None  # cross-process "one loaded model" lock (models.lock)
        self.use_model_lock = True
        # The stats samples carry the router mass (the app's panel shows it): free at the
        # trained K, resolved per sample below it (engine/model/routing_mass.py).
        self.measure_routing_mass = True
        # engine.distributed.ServiceLink: one rank of an expert-parallel launch (serve
        # --distributed); commands, K and stops then come from rank 0, in step.
        self.link = None
        self.max_batch_setting = max_batch
        self.max_batch = max_batch or 4
        self.speculate = speculate or Speculation()
        self._cancel_ids: set[str] = set()  # requests stopped one by one (batched serving)
        self._outstanding = 0  # Generates submitted and not yet done
        self._count_lock = threading.Lock()
        self.batch_figures: dict | None = None  # the running batch's (BatchFigures.as_dict)
        self._warm = None  # engine.experts.warm.WarmUp while a warm-up reads

    # ------------------------------------------------------------------ client API
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="ssdmoe-engine", daemon=True)
            self._thread.start()

    def submit(self, cmd: P.Command) -> None:
        if isinstance(cmd, P.SetK):  # not queued: it applies from the next token
            try:
                if self._runner is None:
                    raise BadValueError("no model loaded: K applies to a loaded model")
                self.set_k(cmd.k)
            except BadValueError as e:
                self._emit(P.EngineError(user_message(e)))
            return
        if isinstance(cmd, P.Generate):
            with self._count_lock:
                self._outstanding += 1
            self._busy.set()
            if not self.batching:
                self._cancel.clear()
        elif isinstance(cmd, P.LoadModel) and not self._busy.is_set():
            # Not while a reply runs: the app stops it as it opens another model, and
            # clearing here undid that stop (the reply ran to max_tokens before the load);
            # the reply clears the stop as it ends.
            self._cancel.clear()
        self._queue.put(cmd)

    def set_k(self, k: int) -> None:
        """Thread-safe; applies from the next token. Raises BadValueError out of range.
        While no model is loaded (e.g. during a reload) there is no K to set: the next
        ModelLoaded says which K the model runs with."""
        runner = self._runner
        if runner is not None:
            if self.link is not None:  # every rank switches at the same token
                check_k(k, runner.sm.index.num_experts, "K")
                self.link.set_k(k)
                return
            runner.set_k(k)

    def cancel(self, request_id: str | None = None) -> None:
        """Stop a generation between two tokens: every one (None), or one request's."""
        if request_id is None:
            self._cancel.set()
        else:
            self._cancel_ids.add(request_id)

    @property
    def batching(self) -> bool:
        """Generates decode together (not under --distributed: ranks step one reply)."""
        return self.max_batch > 1 and self.link is None

    def _generation_ended(self, request_id: str | None) -> None:
        with self._count_lock:
            self._outstanding = max(0, self._outstanding - 1)
            if not self._outstanding:
                self._busy.clear()
        if request_id is not None:
            self._cancel_ids.discard(request_id)

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    @property
    def model_info(self) -> P.ModelInfo | None:
        """The loaded model, with the live K (None while none is loaded)."""
        info, runner = self._info, self._runner
        if info is None or runner is None:
            return None
        return replace(info, k=runner.k, prefill_k=runner.prefill_k or runner.k)

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

    def _notice(self, message: str) -> None:
        self._emit(P.Notice(message))

    def _main(self) -> None:
        try:
            self._serve_commands()
        finally:
            if self._warm is not None:  # left by an exception: no read may outlive us
                self._end_warm()
            _release_thread_streams()

    def _serve_commands(self) -> None:
        if self._hooks_source is not None and not isinstance(self._hooks_source, KVHooks):
            try:
                self.kv_hooks = self._hooks_source(self._notice)
            except Exception as e:  # noqa: BLE001 - chatting works without persistence
                self._notice(f"conversations will not be saved: {user_message(e)}")
        held: P.Command | None = None  # a command that ended a batch's admissions
        while True:
            cmd, held = held if held is not None else self._next_command(), None
            if isinstance(cmd, _WarmFinished):
                if cmd.job is self._warm:
                    self._end_warm()
                continue
            self._end_warm()  # any command first: the warm-up yields (one chunk at most)
            if (
                isinstance(cmd, P.Generate)
                and self.batching
                and self._runner is not None
                and not self._speculates(cmd)
            ):
                from ssdmoe_tui.engine.run.batch_loop import BatchLoop

                held = BatchLoop(self._context()).run(cmd)
                continue
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
                elif isinstance(cmd, P.WarmExperts):
                    self._start_warm(cmd)
            except Exception as e:  # noqa: BLE001 - every failure becomes one line for the user
                if self.link is not None and not isinstance(e, BadValueError):
                    self.link.fatal(e)  # the ranks are out of step: end them all
                if isinstance(cmd, P.Generate):
                    fail(self._context(), cmd.request_id, e)
                else:
                    # fatal: no model is loaded now (a failed open that kept the previous
                    # model, or a bad value, is not fatal: that model stays usable).
                    fatal = (
                        isinstance(cmd, (P.LoadModel, P.SetExpertCache)) and self._runner is None
                    )
                    self._emit(P.EngineError(user_message(e), fatal=fatal))
                self._emit(P.PhaseChanged("idle"))
            finally:
                if isinstance(cmd, P.Generate):
                    self._cancel.clear()  # its stop is spent, also when it failed
                    self._generation_ended(cmd.request_id)

    def _speculates(self, cmd: P.Generate) -> bool:
        """Whether `cmd` asks for speculation (then it decodes alone: a batch amortizes
        the reads its own way); a bad value fails in `_generate`, with one line."""
        try:
            return cmd.speculation(self.speculate).on
        except BadValueError:
            return True

    def _context(self) -> _Context:
        """What a scheduler (`_generate`, the batch loop) may use of this service."""
        return _Context(self, self._runner, self.max_batch, self.kv_budget_bytes)

    def _next_command(self) -> P.Command:
        if self.link is None:
            return self._queue.get()
        cmd, k = self.link.next_command(self._queue)
        if k is not None and self._runner is not None:
            self._runner.set_k(k)
        return cmd

    def _start_warm(self, cmd: P.WarmExperts) -> None:
        """Start reading `cmd`'s experts in the background (engine/experts/warm.py)."""
        from ssdmoe_tui.engine.experts.warm import WarmUp, check_working_set

        runner = self._runner
        if runner is None or self.link is not None:
            return  # nothing to warm; under --distributed each rank holds its own share
        sm = runner.sm
        ws, dropped = check_working_set(cmd.working_set, sm.index.num_layers, sm.index.num_experts)
        if dropped:
            self._notice(f"expert warm-up: {dropped} ids out of range for {sm.path.name} ignored")
        job = WarmUp(sm.cache)
        job.on_finished = lambda: self._queue.put(_WarmFinished(job))
        self._warm = job
        try:
            job.start(ws, per_round=runner.k)
        except BaseException:
            self._end_warm()  # gives back the slots claimed and not read
            raise
        if not job.running:
            self._end_warm()

    def _end_warm(self) -> None:
        """Stop (or settle a finished) warm-up and say what it did."""
        job, self._warm = self._warm, None
        if job is None:
            return
        f = job.stop()
        if f.error:
            self._notice(f"expert warm-up stopped: {f.error}")
        self._emit(
            P.ExpertsWarmed(
                f.requested,
                f.resident,
                f.read,
                f.no_room,
                f.bytes_read,
                f.seconds,
                f.cancelled,
                f.error,
            )
        )

    def advertise(self, url: str, *, key_required: bool = False) -> bool:
        """Put the URL this model is served on in its machine-wide claim (models/lock.py),
        so another ssdmoe on this machine can attach instead of loading its own copy.
        False when this service holds no claim (no model, or the lock is off)."""
        lock = self._lock
        if lock is None:
            return False
        lock.advertise(url, key_required=key_required)
        return True

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _take_lock(self, plan) -> None:
        """Models share the machine within its memory (models/lock.py): a second one that
        does not fit is refused with the numbers."""
        if not self.use_model_lock:
            return
        from ssdmoe_tui.engine.run.open import memory_need
        from ssdmoe_tui.models.lock import acquire_model_lock

        need = memory_need(plan, self.kv_budget_bytes)
        if self._lock is None:
            self._lock = acquire_model_lock(str(plan.path), need_bytes=need)
        else:
            self._lock.relabel(str(plan.path), need)

    def _unload(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            import mlx.core as mx

            runner.close()
            self.kv_pool = None
            self._info = None
            del runner
            gc.collect()
            mx.clear_cache()

    @staticmethod
    def _check_mtp(path) -> None:  # noqa: ANN001 - a Path
        """`speculate=mtp` as the default needs the checkpoint's MTP head: one line if not."""
        import json

        from ssdmoe_tui.engine.spec.mtp import check_mtp

        check_mtp(json.loads((path / "config.json").read_text()), path)

    def _load(self, cmd: P.LoadModel) -> None:
        options = self.options.with_(
            model=cmd.path,
            k=cmd.k,
            prefill_k=cmd.prefill_k,
            expert_cache=CacheBudget.parse(cmd.expert_cache),
            dtype=cmd.dtype,
        )
        self._open(options)

    def _open(self, options: EngineOptions) -> None:
        """Plan (every check that needs no weights) while the current model stays
        loaded; only a good plan unloads it."""
        from ssdmoe_tui.engine.run.open import load_engine, plan_engine
        from ssdmoe_tui.models.resolve import format_progress

        def say(msg: str) -> None:
            self._emit(P.PhaseChanged("loading", detail=msg))

        def download(p) -> None:
            self._emit(
                P.PhaseChanged(
                    "loading",
                    p.downloaded_bytes,
                    p.total_bytes,
                    detail=f"downloading {format_progress(p)}",
                )
            )

        self._emit(P.PhaseChanged("loading", detail=options.model or "the demo model"))
        plan = plan_engine(options, say=say, download=download, cancel=self._cancel)
        if self.speculate.mode == "mtp":  # the default for every request: refused here,
            self._check_mtp(plan.path)  # once, not by each request after a good start
        if self._runner is not None:
            say("unloading previous model")
        self._unload()
        try:
            self._take_lock(plan)
            self._emit(P.PhaseChanged("indexing", detail=str(plan.path)))
            runner = load_engine(
                plan,
                say=say,
                notice=self._notice,
                distributed=self.link.dist if self.link is not None else None,
            )
        except BaseException:
            self._release_lock()  # nothing loaded: another instance may load a model
            raise
        self._runner = runner
        if self.measure_routing_mass:
            runner.sm.measure_routing_mass()
        try:
            from ssdmoe_tui.engine.run.kv_pool import KVPool

            self.kv_pool = KVPool(self.kv_budget_bytes)
        except ImportError:
            self.kv_pool = None
        self._options = plan.options
        if self.max_batch_setting is None:
            from ssdmoe_tui.engine.run.kv_pool import auto_max_batch

            self.max_batch = auto_max_batch(runner, self.kv_budget_bytes)
        self._info = self._describe(runner)
        self._emit(P.ModelLoaded(self.model_info, tokenizer=runner.sm.tokenizer))
        self._emit(self._sample(None, None))
        self._emit(P.PhaseChanged("idle"))

    def _describe(self, runner: Runner) -> P.ModelInfo:
        from ssdmoe_tui.engine.model.context import max_context
        from ssdmoe_tui.engine.model.loader import device_name

        sm = runner.sm
        return P.ModelInfo(
            name=sm.path.name,
            path=str(sm.path),
            model_type=sm.model_type,
            num_layers=sm.index.num_layers,
            num_experts=sm.index.num_experts,
            trained_k=sm.trained_k,
            k=runner.k,
            prefill_k=runner.prefill_k or runner.k,
            max_context=max_context(sm.config),  # the same figure the runner refuses by
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
        budget = CacheBudget.parse(cmd.size)  # a bad size must not cost the loaded model
        runner, info = self._runner, self._info
        if runner is None or info is None:
            raise BadValueError("no model loaded")
        self._open(
            self._options.with_(
                model=info.path,
                k=runner.k,
                prefill_k=runner.prefill_k,
                expert_cache=budget,
            )
        )

    def _generate(self, cmd: P.Generate) -> None:
        """One Generate alone, over `Runner.stream` (the batch loop runs the others)."""
        import mlx.core as mx

        from ssdmoe_tui.engine.run.sampling import processors_for, sampler_for

        runner = self._runner
        if runner is None:
            raise BadValueError("no model loaded: open a model first")
        link = self.link
        turn = Turn(self._context(), cmd)
        sampling = turn.sampling
        spec = cmd.speculation(self.speculate)
        if spec.on and link is not None:
            raise BadValueError("speculative decoding is not available with --distributed")
        if cmd.k is not None:  # every rank of a distributed launch gets the same command
            runner.set_k(cmd.k)
        if sampling.seed is not None:
            mx.random.seed(sampling.seed)
        cache, reused = turn.take_cache()
        if cache is None:  # made here so live samples can report its size
            cache, reused = runner.make_cache(), 0
        turn.live_cache = cache

        sampler, processors = sampler_for(sampling), processors_for(sampling)
        should_stop = turn.should_stop
        if link is not None:
            sampler, turn.meter = link.sampler(sampler), link.meter(runner.sm)
            should_stop = link.should_stop(should_stop, runner)
        events = runner.stream(
            turn.prompt,
            max_tokens=sampling.max_tokens,
            sampler=sampler,
            cache=cache,
            reused_tokens=reused,
            should_stop=should_stop,
            logits_processors=processors,
            speculate=spec if spec.on else None,
        )
        result = turn.relay(events)
        extra = {}
        if link is not None:
            extra["distributed"] = link.turn_stats(runner.sm, turn.meter, len(result.tokens) - 1)
        turn.report(result, extra)
        self._emit(P.PhaseChanged("idle"))
        self._cancel.clear()
        turn.keep_cache(result)

    def _take_cache(self, session_id: str | None, prompt: list[int]):
        """`EngineContext.take_cache`: the KV cache serving the longest prefix of `prompt`,
        from memory or disk, whichever holds more (a restart leaves memory a short common
        prefix of many conversations while each has its own checkpoint on disk), and its
        length."""
        key = session_id or "_default"
        in_memory = self.kv_pool.covers(key, prompt) if self.kv_pool is not None else 0
        if session_id and self._disk_serves_more(session_id, prompt, in_memory):
            try:
                got = self.kv_hooks.load(session_id, prompt, self._info)
            except Exception as e:  # noqa: BLE001 - a bad checkpoint only costs a re-prefill
                self._emit(
                    P.Notice(f"checkpoint ignored: {user_message(e)}; rebuilding the context")
                )
                got = None
            if got is not None:
                cache, n = got
                if in_memory < n < len(prompt):
                    return cache, n
        if in_memory > 0:
            cache, n = self.kv_pool.take(key, prompt)
            if cache is not None and n > 0:
                return cache, n
        return None, 0

    def _disk_serves_more(self, session_id: str, prompt: list[int], in_memory: int) -> bool:
        """Whether the KV hooks can serve more of `prompt` than the `in_memory` tokens."""
        hooks = self.kv_hooks
        if hooks.load is None:
            return False
        if hooks.covers is None:
            return in_memory == 0
        try:
            return int(hooks.covers(session_id, prompt, self._info)) > in_memory
        except Exception:  # noqa: BLE001 - a store that cannot say only costs a prefill
            return False

    def _save_experts(self, session_id: str) -> None:
        """The expert cache's working set, for a warm resume of this session."""
        if self.kv_hooks.save_experts is None or self._runner is None:
            return
        try:
            ws = self._runner.sm.cache.working_set()
            self.kv_hooks.save_experts(session_id, ws, self._info)
        except Exception as e:  # noqa: BLE001 - a resume is only colder without it
            self._emit(P.Notice(f"could not save the expert working set: {user_message(e)}"))

    def _keep_cache(
        self, session_id: str | None, tokens: list[int], cache: list, *, checkpoint: bool
    ) -> None:
        """`EngineContext.keep_cache`: the pool, and at a turn boundary the KV hooks."""
        key = session_id or "_default"
        if checkpoint and session_id and self.kv_hooks.save is not None:
            self._emit(P.PhaseChanged("saving"))
            try:
                self.kv_hooks.save(session_id, tokens, cache, self._info)
            except Exception as e:  # noqa: BLE001 - saving must never break chatting
                self._emit(P.Notice(f"could not save the KV checkpoint: {user_message(e)}"))
            self._save_experts(session_id)
            self._emit(P.PhaseChanged("idle"))
        if self.kv_pool is not None:
            self.kv_pool.put(key, tokens, cache)

    # ------------------------------------------------------------------ stats
    def _sample(self, stats, cache) -> P.StatsSample:
        import mlx.core as mx

        from ssdmoe_tui.engine.experts import iostats
        from ssdmoe_tui.engine.run.kv_pool import cache_nbytes

        runner = self._runner
        sm = runner.sm
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
            max_context=self._info.max_context if self._info else 0,
            k=runner.k,
            generated_tokens=stats.generated_tokens if stats else 0,
            routing_mass=stats.routing_mass if stats else None,
            routing_mass_last=stats.mass_per_token[-1] if stats and stats.mass_per_token else None,
            speculation=None
            if stats is None or stats.spec is None
            else stats.spec.as_dict(stats.decode_requested_bytes, stats.decode_s),
        )


@dataclass
class _Context:
    """The service as its schedulers see it (`turn.EngineContext`): a Turn and the batch
    loop use this and nothing else of the service, on the engine thread. Made per
    Generate (or per batch), with the runner loaded then."""

    _svc: EngineService
    runner: Runner
    max_batch: int
    kv_budget_bytes: int

    def emit(self, event: P.Event) -> None:
        self._svc._emit(event)

    def sample(self, stats, cache) -> P.StatsSample:  # noqa: ANN001
        return self._svc._sample(stats, cache)

    def close_sample(self, stats, cache) -> None:  # noqa: ANN001
        svc = self._svc
        svc.last_stats = svc._sample(stats, cache)
        svc._emit(svc.last_stats)

    def take_cache(self, session_id: str | None, prompt: list[int]):
        return self._svc._take_cache(session_id, prompt)

    def keep_cache(self, session_id, tokens, cache, *, checkpoint: bool) -> None:  # noqa: ANN001
        self._svc._keep_cache(session_id, tokens, cache, checkpoint=checkpoint)

    def cancelled(self, request_id: str) -> bool:
        svc = self._svc
        return svc._cancel.is_set() or request_id in svc._cancel_ids

    def speculates(self, cmd: P.Generate) -> bool:
        return self._svc._speculates(cmd)

    def ended(self, request_id: str) -> None:
        self._svc._generation_ended(request_id)

    def next_command(self) -> P.Command | None:
        svc = self._svc
        while True:
            try:
                cmd = svc._queue.get_nowait()
            except queue.Empty:
                return None
            if not (isinstance(cmd, _WarmFinished) and cmd.job is not svc._warm):
                return cmd  # a warm-up's marker for a job already ended is skipped

    def set_pool_budget(self, nbytes: int) -> None:
        if self._svc.kv_pool is not None:
            self._svc.kv_pool.set_budget(nbytes)

    def show_batch(self, figures: dict) -> None:
        self._svc.batch_figures = figures

    def stop_spent(self) -> None:
        self._svc._cancel.clear()
