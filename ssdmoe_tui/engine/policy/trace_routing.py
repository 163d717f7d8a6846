"""Trace-driven routing: the engine computes every MoE layer as usual but routes each
token to the experts a recorded trace names, so cache policy and prediction can be
measured in the real engine on real routing (issue 13, part 1).

Each MoE block's router (`gate`) still runs; its logits outside the trace's ids for that
(step, layer) are set to the dtype's lowest value, so the block's own top-k picks the
trace's ids and its own softmax and renormalisation weight them with the router's
scores at those ids. The cache is asked for exactly the trace's ids, in trace order
(what `ssdmoe trace replay` replays), so engine and simulator see the same lookups.

Steps: every prefill chunk (a forward pass of more than one token, or one the runner
marks with `prefill_chunk`: a chunk of one token, as a two-token prompt or the remainder
after whole chunks gives) routes to the trace's prefill union for that layer, the
trace's prompt read as one chunk, as `trace replay` reads it; the other single-token
passes follow the trace's decode steps in order, and wrap to the first decode step at
the trace's end (counted in `wraps`). The first of them is the one that samples the
first token from the prompt's last position.

But a chunk shorter than both the trace's prompt (P prefill tokens) and its own
prompt's prefill (a batch's joining prompt sized to stall the other rows a bounded time,
a prompt's short last chunk, a resumed turn's new tokens) routes token by token, where
the trace recorded its prompt per token (`TraceStep.parts`): prompt position t as the
trace's prefill token t mod P, so a chunk reads what its own tokens route to. Read as the
union, a one-token chunk of a 1k-token join read the whole prompt's union (55 of 128
experts a layer on the Qwen3-30B trace, ~0.7 s a chunk on the H100 at 4 GiB), and no
chunk size could stall the others less (2026-12-07, thirteenth session). A token the
trace does not route on a layer (llama.cpp skips the last layer for prompt tokens whose
logits are not asked for) routes there as the prompt's tokens that are routed on it do
(their union). The runner says where each chunk sits in its prompt (`prefill_span`); a
pass without it reads the union.

So a cold prompt prefilled in one chunk, or in chunks of at least P tokens, reads the
union once a chunk (hits after the first, but the policy sees each lookup, where `trace
replay` sees one): compare hit rates with the replay on cold prompts of one chunk.

Tokens produced this way are not the model's own: output is labelled `trace:<name>` and
no exactness claim is made for it.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ssdmoe_tui.engine.policy.traces import DECODE, PREFILL, Trace, read_trace
from ssdmoe_tui.errors import BadValueError


def check_trace_k(flag: str, value: int | list[int] | None, trace_k: int) -> None:
    """K comes from the trace: a --k / --prefill-k (or bench's --k list) that asks for
    another is one line (None or the trace's own K passes)."""
    values = value if isinstance(value, list) else [] if value is None else [value]
    if any(v != trace_k for v in values):
        raise BadValueError(
            f"{flag} {','.join(map(str, values))} differs from the routing trace's K={trace_k} "
            "(K comes from the trace)"
        )


def _check_shape(name: str, meta, num_layers: int, num_experts: int) -> None:  # noqa: ANN001 - TraceMeta
    """The trace routes this model: its MoE layers and experts, one clear line if not."""
    if (meta.num_layers, meta.num_experts) != (num_layers, num_experts):
        # --layers only cuts depth: a trace with other experts needs another model's config
        fix = (
            f"(ssdmoe demo-model --config CONFIG --layers {meta.num_layers})"
            if meta.num_experts == num_experts
            else f"from a config with {meta.num_experts} experts, --layers {meta.num_layers}"
        )
        raise BadValueError(
            f"routing trace {name} has {meta.num_layers} MoE layers x {meta.num_experts} "
            f"experts, the model {num_layers} x {num_experts}: build a matching checkpoint " + fix
        )


def _union(cells: list[np.ndarray]) -> np.ndarray:
    """The ids of `cells` once each, in first-seen order (what the cache is asked for)."""
    return np.array(list(dict.fromkeys(np.concatenate(cells).tolist())), dtype=np.int64)


class TraceRouting:
    """The trace's expert ids per (step, layer), and where the engine is in it."""

    def __init__(self, trace: Trace, name: str, num_layers: int, num_experts: int) -> None:
        meta = trace.meta
        self.name = name
        self.label = f"trace:{name}"
        _check_shape(name, meta, num_layers, num_experts)
        self.k = meta.k
        self.num_layers = num_layers
        self.num_experts = num_experts
        prefill: dict[int, dict[int, None]] = {}
        self.decode: list[dict[int, np.ndarray]] = []
        parts: list[list[tuple[int, tuple[int, ...]]]] | None = []
        for step in trace.steps:
            if step.phase == PREFILL:
                for layer, ids in step.layers:
                    prefill.setdefault(layer, {}).update(dict.fromkeys(ids))
                parts = None if parts is None or step.parts is None else parts + step.parts
            elif step.phase == DECODE:
                self.decode.append(self._decode_cells(step))
        if not self.decode:
            raise BadValueError(f"routing trace {name} has no decode steps")
        if self.k < 1:
            raise BadValueError(f"routing trace {name} does not say K")
        self.prefill = {la: np.array(list(ids), dtype=np.int64) for la, ids in prefill.items()}
        # the trace's prompt token by token (empty: recorded as one row a chunk)
        self.prefill_tokens = self._token_cells(parts or [])
        # set by the runner around each prefill chunk: (prompt position of its first
        # token, the prompt's prefill tokens); None: route the chunk to the union
        self.prefill_span: tuple[int, int] | None = None
        self._tokens: list[int] | None = None  # the trace prefill tokens of this chunk
        self.token_chunks = 0  # prefill chunks routed token by token (a stopped one too)
        self.phase = PREFILL
        self.position = -1  # decode step index (before wrapping)
        self.wraps = 0
        self.prefill_chunk = False  # set by the runner around each prefill chunk
        self.on_decode_start = None  # callback when the first decode pass begins
        # A batch (engine/run/batch.py) sets each row's own decode step before a pass of
        # one token per row: every sequence follows the trace from its own offset.
        self.rows: list[int] | None = None
        self._rows: list[int] | None = None  # the rows of the pass being built
        # A speculative verify chunk (engine/spec/verify.py): the next pass of this many
        # tokens routes them to the decode steps after `position`, one step per token.
        self.chunk: int | None = None
        self._chunk: list[int] | None = None  # the steps of the chunk being built
        self._masks: dict[int, mx.array] = {}

    def _decode_cells(self, step) -> dict[int, np.ndarray]:  # noqa: ANN001 - a trace Step
        """A decode step's ids per layer: K distinct ids on every MoE layer."""
        cells = {}
        for layer, ids in step.layers:
            if len(ids) != self.k or len(set(ids)) != self.k:
                raise BadValueError(
                    f"routing trace {self.name}: decode token {step.token} layer {layer} "
                    f"has {len(ids)} distinct-or-not ids {list(ids)[:8]}, expected "
                    f"K={self.k} distinct"
                )
            cells[layer] = np.array(ids, dtype=np.int64)
        if len(cells) != self.num_layers:
            # Else those layers would silently follow the model's own router.
            missing = min(set(range(self.num_layers)) - set(cells))
            raise BadValueError(
                f"routing trace {self.name}: decode token {step.token} routes "
                f"{len(cells)} of {self.num_layers} MoE layers (layer {missing} missing: "
                f"a recording cut short?); every decode step must route every layer"
            )
        return cells

    def _token_cells(self, parts: list) -> list[dict[int, np.ndarray]]:
        """Each recorded prompt token's ids per layer (`parts`: TraceStep.parts of every
        prefill step); a layer a token lacks takes the union of the tokens that have it
        (see the module docstring), the prefill union of that layer."""
        cells = [{la: np.array(ids, dtype=np.int64) for la, ids in p if ids} for p in parts]
        for layer in self.prefill:
            routed = [c[layer] for c in cells if layer in c]
            if routed and len(routed) < len(cells):
                union = _union(routed)
                for cell in cells:
                    cell.setdefault(layer, union)
        return cells

    # ---------------------------------------------------------------- position
    def begin_pass(self, tokens: int) -> None:
        """Called once per forward pass (by the first MoE layer's gate)."""
        self._masks = {}
        self._rows = None
        self._chunk = None
        self._tokens = None
        if self.chunk is not None and tokens == self.chunk and not self.prefill_chunk:
            if self.phase == PREFILL and self.position < 0 and self.on_decode_start is not None:
                self.on_decode_start()
            self.phase = DECODE
            self._chunk = [self.position + 1 + i for i in range(tokens)]
            self.chunk = None
            return
        if self.prefill_chunk or (tokens > 1 and (self.rows is None or tokens != len(self.rows))):
            self.phase = PREFILL
            p, span = len(self.prefill_tokens), self.prefill_span
            if p and span is not None and tokens < min(p, span[1]):
                self._tokens = [(span[0] + i) % p for i in range(tokens)]
                self.token_chunks += 1
            return
        if self.rows is not None:
            if self.phase == PREFILL and self.position < 0:
                self.position = 0
                if self.on_decode_start is not None:
                    self.on_decode_start()
            self.phase = DECODE
            self._rows = list(self.rows)
            return
        first = self.phase == PREFILL and self.position < 0
        self.phase = DECODE
        self.position += 1
        if self.position and self.position % len(self.decode) == 0:
            self.wraps += 1
        if first and self.on_decode_start is not None:
            self.on_decode_start()

    def suspend(self) -> tuple:
        """The pass being built, set aside so another runs at one of its layer boundaries
        (Runner.outside_prefill); `resume` puts it back."""
        held = (self.phase, self.prefill_chunk, self.prefill_span, self.rows, self.chunk,
                self._masks, self._rows, self._chunk, self._tokens)  # fmt: skip
        self.prefill_chunk, self.prefill_span, self.rows = False, None, None
        return held

    def resume(self, held: tuple) -> None:
        (self.phase, self.prefill_chunk, self.prefill_span, self.rows, self.chunk,
         self._masks, self._rows, self._chunk, self._tokens) = held  # fmt: skip

    def advance(self, steps: int) -> None:
        """A verified chunk kept `steps` tokens: the next decode pass follows them."""
        before = self.position
        self.position += steps
        n = len(self.decode)
        self.wraps += (self.position // n) - (max(before, 0) // n)

    def _own_cells(self, layer: int) -> tuple[list[np.ndarray | None], tuple[int, int]] | None:
        """A pass whose tokens (a chunk) or rows (a batch) each follow their own trace
        step: their cells for `layer`, in order, and the mask's leading shape (a batch:
        one row per sequence (rows, 1); a chunk: one per token (1, n)). None: the pass
        has one cell."""
        if self.phase == PREFILL:
            if self._tokens is None:
                return None
            return [self.prefill_tokens[t].get(layer) for t in self._tokens], (1, len(self._tokens))
        steps = self._rows if self._rows is not None else self._chunk
        if steps is None:
            return None
        cells = [self.decode[p % len(self.decode)].get(layer) for p in steps]
        return cells, ((len(steps), 1) if self._rows is not None else (1, len(steps)))

    def cell(self, layer: int) -> np.ndarray | None:
        """The ids this pass routes `layer` to (trace order); None: the trace has no row
        (then the router's own choice stands)."""
        own = self._own_cells(layer)
        if own is not None:
            cells = own[0]
            return None if any(c is None for c in cells) else _union(cells)
        if self.phase == PREFILL:
            return self.prefill.get(layer)
        return self.decode[self.position % len(self.decode)].get(layer)

    def mask(self, layer: int) -> mx.array | None:
        m = self._masks.get(layer)
        if m is not None:
            return m
        own = self._own_cells(layer)
        if own is None:
            ids = self.cell(layer)
            if ids is None:
                return None
            host = np.zeros(self.num_experts, dtype=bool)
            host[ids] = True
        else:
            cells, shape = own
            if any(c is None for c in cells):
                return None
            host = np.zeros((*shape, self.num_experts), dtype=bool)
            rows = host.reshape(-1, self.num_experts)  # a view: row i is cell i's
            for i, ids in enumerate(cells):
                rows[i, ids] = True
        m = self._masks[layer] = mx.array(host)
        return m

    def summary(self) -> dict:
        return {
            "routing": self.label,
            "routing_k": self.k,
            "routing_decode_steps": len(self.decode),
            "routing_wraps": self.wraps,
            "routing_prefill_tokens": len(self.prefill_tokens),
            "routing_token_chunks": self.token_chunks,
        }


class TraceGate(nn.Module):
    """The block's router with logits outside the trace's ids pushed to the lowest value."""

    def __init__(self, inner: nn.Module, routing: TraceRouting, layer: int) -> None:
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_routing", routing)
        object.__setattr__(self, "_layer", layer)

    def __call__(self, x: mx.array) -> mx.array:
        routing = self._routing
        if self._layer == 0:
            routing.begin_pass(int(np.prod(x.shape[:-1])))
        logits = self.inner(x)
        mask = routing.mask(self._layer)
        if mask is None:
            return logits
        return mx.where(mask, logits, mx.array(mx.finfo(logits.dtype).min, logits.dtype))


def attach(sm, path: str | Path, trace: Trace | None = None) -> TraceRouting:
    """Route `sm` (a StreamedModel) by the trace at `path` (or `trace`, read already:
    `path` then only names it); sets K to the trace's."""
    routers = [sm.router(b) for b in sm.blocks]
    if not routers or not all(isinstance(r, nn.Linear | nn.QuantizedLinear) for r in routers):
        raise BadValueError(
            f"--routing-trace needs a family whose router is a linear layer of logits "
            f"(qwen3_moe, gpt_oss, mixtral...), not {sm.model_type}"
        )
    trace = read_trace(path) if trace is None else trace
    routing = TraceRouting(trace, Path(path).name, sm.index.num_layers, sm.index.num_experts)
    if routing.k > sm.index.num_experts:
        raise BadValueError(f"routing trace K={routing.k} exceeds {sm.index.num_experts} experts")
    for layer, (block, switch) in enumerate(zip(sm.blocks, sm.switches, strict=True)):
        setattr(block, sm.family.router, TraceGate(routers[layer], routing, layer))
        switch.set_routing(routing)
    sm.cache.routing = routing
    if sm.prefetch:
        # The next block's router cannot foresee the trace's ids: predict them from the
        # lookups instead (co-occurrence, layer L -> L+1), as `trace replay --prefetch` does.
        from ssdmoe_tui.engine.policy.policies import CooccurrencePredictor

        for switch in sm.switches:
            switch.set_predictor(None)
        sm.cache.predictor = CooccurrencePredictor(sm.index.num_layers)
    # The simulator ages the policy once after the prefill step; the runner ages it
    # before every decode step but the first.
    routing.on_decode_start = sm.cache.step
    sm.set_k(routing.k)
    return routing
