"""A rank's share of each MoE block: computes the rows of the experts it owns."""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.distributed.expert_map import ExpertMap
from ssdmoe_tui.engine.model.streamed import Routed, StreamedSwitch


@dataclass
class Partition:
    """What the loader needs to build a rank's share of the experts."""

    map: ExpertMap
    dist: object  # the group.Distributed of this rank

    @property
    def owned_slots(self) -> int:
        """Cache slots beyond this are never used: the rank owns no more experts."""
        return self.map.owned_count(self.dist.rank)

    def make_switch(self, layer, cache, kind, activation, quant, times) -> DistributedSwitch:
        nxt = layer + 1 < self.map.num_layers
        return DistributedSwitch(
            layer, cache, kind, activation, quant, times,
            owned=self.map.owned_mask(layer, self.dist.rank),
            owned_next=self.map.owned_mask(layer + 1, self.dist.rank) if nxt else None,
            dist=self.dist,
        )  # fmt: skip


class DistributedSwitch(StreamedSwitch):
    """A `StreamedSwitch` that computes only this rank's rows and sums over the ranks.

    Same inputs and output as mlx-lm's `SwitchGLU`: (..., K, D) expert outputs. Rows
    whose expert another rank owns are zeros here, so the `all_sum` restores every row
    exactly. Each row is computed with the same `gather_qmm` call shape as one process
    uses for a single token, so the values are the same bits.

    Every rank sees the whole routing (the routers run everywhere), so what one process
    does with the routing is done here with all of it, and what touches the cache with
    this rank's share: a trace recorder (`cache.on_route`) and the co-occurrence
    predictor get every layer's full selection (only rank 0 records); trace-driven
    routing (`set_routing`) makes the rank look up its owned part of the trace's ids, in
    trace order; prefetch reads the next layer's predicted experts that this rank owns."""

    def __init__(
        self, layer, cache, kind, activation, quant, times, *, owned, dist, owned_next=None
    ) -> None:
        super().__init__(layer, cache, kind, activation, quant, times)
        object.__setattr__(self, "_owned", np.asarray(owned, dtype=bool))
        nxt = None if owned_next is None else np.asarray(owned_next, dtype=bool)
        object.__setattr__(self, "_owned_next", nxt)
        object.__setattr__(self, "_dist", dist)
        out_name = "down_proj.weight" if kind == "glu" else "fc2.weight"
        object.__setattr__(self, "_out_dims", int(cache.banks[0][out_name].shape[1]))

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        if self._capture:  # the previous layer's routing_predictor asks for indices only
            raise Routed(indices)
        times = self._times
        cache = self._cache
        predict = self._predict
        t0 = time.perf_counter()
        if self._mass is not None:
            self._mass.kept(self._layer, indices)  # a reference only (routing_mass.py)
        pred = None
        gov = cache.governor
        if (
            predict is not None
            and gov is not None
            and gov.enabled
            and x.ndim >= 2
            and x.shape[-2] == 1
        ):
            pred = predict(x)  # decode only: the next layer's routing, in the same sync
            mx.eval(indices, pred)
        host = np.array(indices, copy=False)  # the layer's one host sync, as in one process
        times.router_sync_s += time.perf_counter() - t0
        times.calls += 1
        times.last_k = int(host.shape[-1])
        wanted = np.unique(host)  # what one process would look up, in its order
        chosen = None  # trace routing: the ids rows may use (others carry weight 0)
        routing = self._routing
        if routing is not None:
            cell = routing.cell(self._layer)
            if cell is not None:
                wanted, chosen = cell, cell
        if cache.on_route is not None:
            cache.on_route(self._layer, wanted)  # the full selection (rank 0 records it)
        if cache.predictor is not None:
            cache.predictor.observe(self._layer, wanted.tolist())
        mine = wanted[self._owned[wanted]]
        partial = self._owned_rows(mx.expand_dims(x, (-2, -3)), host, mine, chosen)
        self._prefetch(host, wanted, mine, pred)
        return self._dist.combine(partial)

    def _prefetch(self, host, wanted, mine, pred) -> None:
        """Read the next layer's predicted experts that this rank owns (one process's
        rule: the next router's guesses, or co-occurrence in trace-driven decode)."""
        nxt_owned = self._owned_next
        cache = self._cache
        if nxt_owned is None:
            return
        nxt = None
        if pred is not None:  # read-ahead v2: a few guesses, cold slots only (prefetch.py)
            flat = np.array(pred, copy=False).reshape(-1)
            _, first = np.unique(flat, return_index=True)
            ranked = flat[np.sort(first)]
            ranked = ranked[nxt_owned[ranked]]
            cache.prefetch_cold(self._layer + 1, ranked, {(self._layer, int(e)) for e in mine})
            return
        if cache.predictor is not None and host.size == host.shape[-1]:
            ids = cache.predictor.predict(self._layer, wanted.tolist(), len(wanted))
            nxt = np.array(ids, dtype=np.int64) if ids else None
        if nxt is None:
            return
        nxt = nxt[nxt_owned[nxt]]
        if len(nxt):
            cache.prefetch(self._layer + 1, nxt, {(self._layer, int(e)) for e in mine})

    def _owned_rows(
        self, x: mx.array, host: np.ndarray, mine: np.ndarray, chosen: np.ndarray | None
    ) -> mx.array:
        """This rank's rows: `mine` (owned ids, in lookup order) made resident, in groups
        when they exceed the cache; rows of an id outside `chosen` stay zero (a
        trace-routed block's weight for them is exactly 0)."""
        cache = self._cache
        k = host.shape[-1]
        flat = host.reshape(-1)
        usable = self._owned[flat]
        if chosen is not None:
            usable &= np.isin(flat, chosen)
        rows = np.nonzero(usable)[0]
        zeros = mx.zeros((*host.shape, self._out_dims), dtype=x.dtype)
        if mine.size == 0:
            return zeros
        xf = x.reshape(-1, 1, 1, x.shape[-1])  # one row per token
        cap = cache.capacity
        groups = [mine[i : i + cap] for i in range(0, len(mine), cap)]
        if len(groups) > 1:
            self._times.grouped_calls += 1
        pieces, order = [], []
        for group in groups:
            r = rows if len(groups) == 1 else rows[np.isin(flat[rows], group)]
            slots = cache.ensure(self._layer, group, observe=False)
            if r.size == 0:
                continue  # a trace's ids no row chose: looked up (read), not computed
            lut = np.zeros(self._num_experts, dtype=np.int64)
            lut[group] = slots
            y = self._run_slots(xf[mx.array(r // k)], lut[flat[r]].reshape(-1, 1))  # (P, 1, D)
            if len(groups) > 1:
                mx.eval(y)  # before the next group may reuse these slots
            pieces.append(y.reshape(len(r), -1))
            order.append(r)
        if not pieces:
            return zeros
        where = np.zeros(flat.size, dtype=np.int32)
        where[np.concatenate(order)] = np.arange(1, sum(len(o) for o in order) + 1, dtype=np.int32)
        table = mx.concatenate([mx.zeros((1, self._out_dims), dtype=pieces[0].dtype), *pieces])
        return table[mx.array(where)].reshape(*host.shape, self._out_dims)
