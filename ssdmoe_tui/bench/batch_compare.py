"""The engine's batched decode beside mlx-lm's resident `BatchGenerator`, in one process.

Two things are measured on the same prompts (B of one length, so no row is padded
differently from another):

- **speed**: aggregate decode tok/s over the steady window (every step decodes all B
  rows: from the step after the last row joined to the step before the first leaves),
  the engine's `BatchRunner` against `BatchGenerator` on the model loaded whole
  (`mlx_lm.load`, cast to the engine's dtype, K set on its MoE blocks). The caller
  alternates the two and takes medians, so a shared machine's load falls on both alike;
- **invariance**: each batched row's greedy tokens against the same prompt alone (ours:
  `Runner.generate`; mlx-lm's: `stream_generate`), and at the first token that differs
  the top-2 log-probability margin of both runs there. A flip at a margin of the size of
  the last layer's rounding is a near-tie that any change of kernel can tip; a large one
  would be a defect.

`scripts/batch_vs_mlx.py` runs this on CPU and on the H200 (`scripts/gpu_batch.sh`);
`bench --batch` reports the resident `BatchGenerator` beside its rows when the model fits.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx


class MarginSampler:
    """Greedy, recording each call's top-2 log-probs per row (lazy until `margins`).
    Its own object per sequence, so a batch samples its rows one by one: the tokens are
    the greedy ones all the same (argmax of the same log-probs)."""

    def __init__(self) -> None:
        self._top: list[mx.array] = []

    def __call__(self, logprobs: mx.array) -> mx.array:
        self._top.append(top2(logprobs))
        return mx.argmax(logprobs, axis=-1)

    def margins(self) -> list[tuple[float, float]]:
        """(top-1, top-2) log-prob per generated token."""
        return [tuple(x) for x in mx.concatenate(self._top).tolist()] if self._top else []


def top2(logprobs: mx.array) -> mx.array:
    """[rows, 2]: the two largest log-probs of each row, largest first (float32)."""
    lp = logprobs.reshape(-1, logprobs.shape[-1]).astype(mx.float32)
    return mx.sort(mx.topk(lp, 2, axis=-1), axis=-1)[:, ::-1]


@dataclass
class BatchRun:
    """One batched run: every row's tokens and the steady window's figures."""

    tokens: list[list[int]]
    window_tokens: int = 0
    window_s: float = 0.0
    window_cpu_s: float = 0.0  # the process's CPU time (all threads) in the window
    # in the window, where measured: time in the model's forward calls (graph building,
    # `TimedModel`), and the engine's figures: building its passes, queueing them,
    # waiting in its step's sync, handing out the tokens and the part of that spent
    # reading them to the host, and rows ending leaving (BatchFigures.build_s / queue_s /
    # sync_s / deliver_s / to_host_s / leave_s)
    window_model_s: float | None = None
    window_build_s: float | None = None
    window_queue_s: float | None = None
    window_sync_s: float | None = None
    window_deliver_s: float | None = None
    window_to_host_s: float | None = None
    window_leave_s: float | None = None
    window_steps: int = 0
    margins: list[list[tuple[float, float]]] = field(default_factory=list)  # when recorded

    @property
    def aggregate_tok_s(self) -> float | None:
        return self.window_tokens / self.window_s if self.window_s > 0 else None

    @property
    def cpu_ms_per_token(self) -> float | None:
        """CPU time a token costs (steadier than wall time on a loaded machine)."""
        return 1e3 * self.window_cpu_s / self.window_tokens if self.window_tokens else None

    def host_split(self) -> dict:
        """Milliseconds per step of the window: wall, in the model's forward call, and
        building the passes (BatchGenerator: its forward calls), queueing them
        (`mx.async_eval`), waiting in the sync (`mx.eval`), (engine) handing out the
        tokens (`to_host` of it: reading them; `leave`: rows that ended leaving, in the
        window's last step), and `other`: the step's time outside those
        (the loop around them; BatchGenerator: with its tokens' read and hand-out, and its
        sampling's graph, which the engine's `build` holds); None: not measured."""
        n = self.window_steps

        def ms(x: float | None) -> float | None:
            return round(1e3 * x / n, 4) if x is not None and n else None

        parts = (self.window_build_s, self.window_queue_s, self.window_sync_s,
                 self.window_deliver_s)  # fmt: skip
        # BatchGenerator's side has no `deliver`: its `other` is then its tokens' read and
        # its loop around the step
        other = (None if None in parts[:3]
                 else self.window_s - sum(p for p in parts if p is not None))  # fmt: skip
        return {"step": ms(self.window_s), "model": ms(self.window_model_s),
                "build": ms(self.window_build_s), "queue": ms(self.window_queue_s),
                "sync": ms(self.window_sync_s), "deliver": ms(self.window_deliver_s),
                "to_host": ms(self.window_to_host_s), "leave": ms(self.window_leave_s),
                "other": ms(other)}  # fmt: skip


class TimedEvals:
    """`mx.async_eval` and `mx.eval` timed while in use (seconds summed in `queue_s` and
    `sync_s`): BatchGenerator's step queues the next pass and waits for the current one
    through them (mlx_lm/generate.py calls them through the `mlx.core` module, so the
    module's attributes are swapped and put back on exit). Only while nothing else runs."""

    def __init__(self) -> None:
        self.queue_s = 0.0
        self.sync_s = 0.0
        self._orig: tuple | None = None

    def __enter__(self) -> TimedEvals:
        self._orig = (mx.async_eval, mx.eval)
        mx.async_eval = self._timed(mx.async_eval, "queue_s")
        mx.eval = self._timed(mx.eval, "sync_s")
        return self

    def _timed(self, fn, total: str):  # noqa: ANN001, ANN202 - an mlx.core function
        def call(*args):  # noqa: ANN002, ANN202
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                setattr(self, total, getattr(self, total) + time.perf_counter() - t)

        return call

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        assert self._orig is not None
        mx.async_eval, mx.eval = self._orig


class TimedModel:
    """A model whose forward calls are timed (seconds summed in `seconds`): the host's
    graph building of a step, on either side alike. Everything else is the model's."""

    def __init__(self, model) -> None:  # noqa: ANN001 - an mlx-lm model
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "seconds", 0.0)

    def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003
        t = time.perf_counter()
        try:
            return self._model(*args, **kwargs)
        finally:
            object.__setattr__(self, "seconds", self.seconds + time.perf_counter() - t)

    def __getattr__(self, name: str):
        return getattr(self._model, name)


def window_index(steps: Sequence[tuple[float, float, int]], b: int) -> tuple[int, int] | None:
    """Indices of the first and last step that gave all B rows a token (None: < 2)."""
    full = [i for i, (_, _, rows) in enumerate(steps) if rows == b]
    return (full[0], full[-1]) if len(full) >= 2 else None


def steady_window(steps: Sequence[tuple[float, float, int]], b: int) -> tuple[int, float, float]:
    """(tokens, seconds, CPU seconds of the process) between the ends of the first and the
    last step that gave all B rows a token (each step: wall, CPU time, rows)."""
    full = [(t, c) for t, c, rows in steps if rows == b]
    if len(full) < 2:
        return 0, 0.0, 0.0
    return b * (len(full) - 1), full[-1][0] - full[0][0], full[-1][1] - full[0][1]


def first_flip(
    alone: Sequence[int],
    alone_top: Sequence[tuple[float, float]],
    batched: Sequence[int],
    batched_top: Sequence[tuple[float, float]],
) -> dict | None:
    """Where a batched row first differs from its run alone: the token index and the
    top-2 margin of each run there (alone's top-1 is the token it took); None if equal."""
    if len(alone) != len(batched):
        raise ValueError(f"runs of {len(alone)} and {len(batched)} tokens: EOS not off?")
    for i, (a, b) in enumerate(zip(alone, batched, strict=True)):
        if a != b:
            ma = alone_top[i][0] - alone_top[i][1] if i < len(alone_top) else None
            mb = batched_top[i][0] - batched_top[i][1] if i < len(batched_top) else None
            return {
                "token": i,
                "alone_margin": None if ma is None else round(ma, 6),
                "batched_margin": None if mb is None else round(mb, 6),
                "differing_after": sum(
                    x != y for x, y in zip(alone[i:], batched[i:], strict=False)
                ),
                "compared_after": min(len(alone), len(batched)) - i,
            }
    return None


# --------------------------------------------------------------------------- the engine


def engine_batch(
    runner, prompts: list[list[int]], n: int, *, invariant: bool = False, record: bool = False
) -> BatchRun:  # noqa: ANN001 - a Runner
    """`prompts` through one `BatchRunner` (max_batch = B), greedy, `n` tokens each, EOS
    off (the caller clears the tokenizer's); the window: steps that decoded all B rows."""
    from ssdmoe_tui.engine.run.batch import BatchRunner, SeqSpec
    from ssdmoe_tui.engine.run.runner import Done

    b = len(prompts)
    batch = BatchRunner(runner, max_batch=b, invariant=invariant)
    samplers = [MarginSampler() if record else None for _ in prompts]
    for i, p in enumerate(prompts):
        batch.add(SeqSpec(i, p, max_tokens=n, sampler=samplers[i]))
    out: dict[int, list[int]] = {}
    steps: list[tuple[float, float, int]] = []
    # (model, build, queue, sync, deliver, to host, leave) so far
    split: list[tuple[float, ...]] = []
    timed = runner.sm.model if isinstance(runner.sm.model, TimedModel) else None
    fig = batch.figures
    bound = 4 * b * (n + max(len(p) for p in prompts)) + 64
    for _ in range(bound):
        if batch.idle:
            break
        before = fig.row_tokens
        events = batch.step()
        steps.append((time.perf_counter(), time.process_time(), fig.row_tokens - before))
        split.append((timed.seconds if timed else 0.0, fig.build_s, fig.queue_s, fig.sync_s,
                      fig.deliver_s, fig.to_host_s, fig.leave_s))  # fmt: skip
        for uid, ev in events:
            if isinstance(ev, Done):
                out[uid] = ev.result.tokens
    else:
        raise RuntimeError(f"batch of {b} did not finish in {bound} steps")
    run = BatchRun([out[i] for i in range(b)])
    run.window_tokens, run.window_s, run.window_cpu_s = steady_window(steps, b)
    w = window_index(steps, b)
    if w is not None:
        first, last = split[w[0]], split[w[1]]
        run.window_steps = w[1] - w[0]
        m, *parts = (z - a for a, z in zip(first, last, strict=True))
        run.window_model_s = m if timed else None
        (run.window_build_s, run.window_queue_s, run.window_sync_s, run.window_deliver_s,
         run.window_to_host_s, run.window_leave_s) = parts  # fmt: skip
    if record:
        run.margins = [s.margins() for s in samplers]
    return run


def engine_alone(runner, prompt: list[int], n: int) -> tuple[list[int], list]:  # noqa: ANN001
    """One sequence through `Runner.generate` (greedy): its tokens and top-2 per token."""
    s = MarginSampler()
    r = runner.generate(prompt, max_tokens=n, sampler=s)
    return r.tokens, s.margins()


# --------------------------------------------------------------------------- mlx-lm


class ResidentBatch:
    """The model loaded whole by mlx-lm (cast to `dtype`, K set on its MoE blocks)."""

    def __init__(self, path: Path, dtype, k: int | None = None) -> None:  # noqa: ANN001
        import mlx_lm

        from ssdmoe_tui.engine.model.loader import cast_model, set_model_k

        self.model, self.tokenizer = mlx_lm.load(str(path))
        self.tokenizer.eos_token_ids = set()  # `alone` decodes exactly N tokens, as the batch
        cast_model(self.model, dtype)
        mx.eval(self.model.parameters())
        if k is not None:
            set_model_k(self.model, k)

    @classmethod
    def over(cls, model, tokenizer) -> ResidentBatch:  # noqa: ANN001
        """`BatchGenerator` over a model already loaded: the engine's own (`sm.model`,
        every layer frozen: no host sync, its experts in the cache's slots), so its loop
        and mlx-lm's run the same layers: what differs from `BatchGenerator` over mlx-lm's
        model is the streamed layer and where its weights sit; what differs from the
        engine's batch is the loop around the model (`scripts/batch_vs_mlx.py
        --bg-streamed`). Only `batch` is meant for it (the tokenizer is the engine's)."""
        self = cls.__new__(cls)
        self.model, self.tokenizer = model, tokenizer
        return self

    def batch(
        self, prompts: list[list[int]], n: int, *, record: bool = False, detok: bool = False
    ) -> BatchRun:
        """`BatchGenerator` with every prompt inserted at once (it prefills them together),
        greedy, no stop tokens; the window: steps that returned all B rows' tokens.
        `detok`: each row's token also goes through its own streaming detokenizer every
        step, as mlx_lm.server's loop does (the engine's batch does it for every row)."""
        from mlx_lm.generate import BatchGenerator

        b = len(prompts)
        gen = BatchGenerator(self.model, max_tokens=n, completion_batch_size=max(b, 1),
                             prefill_batch_size=max(b, 1))  # fmt: skip
        try:
            uids = gen.insert([list(p) for p in prompts], max_tokens=[n] * b)
            index = {u: i for i, u in enumerate(uids)}
            detoks = [self.tokenizer.detokenizer for _ in prompts] if detok else None
            tokens: list[list[int]] = [[] for _ in prompts]
            tops: list[list] = [[] for _ in prompts]
            steps: list[tuple[float, float, int]] = []
            timed = self.model if isinstance(self.model, TimedModel) else None
            evals = TimedEvals() if timed else None
            model_s: list[tuple[float, float, float]] = []  # forward, queue, sync so far
            for _ in range(4 * (n + max(len(p) for p in prompts)) + 64):
                if evals is not None:
                    with evals:
                        resps = gen.next_generated()
                else:
                    resps = gen.next_generated()
                if not resps:
                    break
                steps.append((time.perf_counter(), time.process_time(), len(resps)))
                if timed is not None and evals is not None:
                    model_s.append((timed.seconds, evals.queue_s, evals.sync_s))
                for r in resps:
                    i = index[r.uid]
                    tokens[i].append(int(r.token))
                    if detoks is not None:
                        detoks[i].add_token(int(r.token))
                        detoks[i].last_segment  # noqa: B018 - the piece a server sends
                    if record:
                        tops[i].append(top2(r.logprobs))
                if all(len(t) >= n for t in tokens):
                    break
        finally:
            gen.close()
        run = BatchRun(tokens)
        run.window_tokens, run.window_s, run.window_cpu_s = steady_window(steps, b)
        w = window_index(steps, b)
        if w is not None:
            run.window_steps = w[1] - w[0]
            if timed:
                (m0, q0, s0), (m1, q1, s1) = model_s[w[0]], model_s[w[1]]
                run.window_model_s = run.window_build_s = m1 - m0
                run.window_queue_s, run.window_sync_s = q1 - q0, s1 - s0
        if record:
            run.margins = [
                [tuple(x) for x in mx.concatenate(t).tolist()] if t else [] for t in tops
            ]
        return run

    def alone(self, prompt: list[int], n: int) -> tuple[list[int], list]:
        """`stream_generate` (greedy): its tokens and top-2 per token."""
        import mlx_lm

        from ssdmoe_tui.engine.run.sampling import greedy

        toks, tops = [], []
        for r in mlx_lm.stream_generate(
            self.model, self.tokenizer, mx.array(prompt), max_tokens=n, sampler=greedy()
        ):
            toks.append(int(r.token))
            tops.append(top2(r.logprobs))
        return toks, [tuple(x) for x in mx.concatenate(tops).tolist()] if tops else []


def invariance_rows(alone: list[tuple[list[int], list]], batched: BatchRun) -> dict:
    """Rows equal alone, and each differing row's first flip (`first_flip`)."""
    flips = []
    equal = 0
    for i, (toks, top) in enumerate(alone):
        f = first_flip(toks, top, batched.tokens[i], batched.margins[i] if batched.margins else [])
        if f is None:
            equal += 1
        else:
            flips.append({"row": i, **f})
    return {"rows": len(alone), "rows_equal_alone": equal, "first_flips": flips}
