"""A rank's share of each MoE block: computes the rows of the experts it owns."""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ssdmoe_tui.engine.distributed.expert_map import ExpertMap
from ssdmoe_tui.engine.model.streamed import StreamedSwitch


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
        return DistributedSwitch(
            layer, cache, kind, activation, quant, times,
            owned=self.map.owned_mask(layer, self.dist.rank), dist=self.dist,
        )  # fmt: skip


class DistributedSwitch(StreamedSwitch):
    """A `StreamedSwitch` that computes only this rank's rows and sums over the ranks.

    Same inputs and output as mlx-lm's `SwitchGLU`: (..., K, D) expert outputs. Rows
    whose expert another rank owns are zeros here, so the `all_sum` restores every row
    exactly. Each row is computed with the same `gather_qmm` call shape as one process
    uses for a single token, so the values are the same bits."""

    def __init__(self, layer, cache, kind, activation, quant, times, *, owned, dist) -> None:
        super().__init__(layer, cache, kind, activation, quant, times)
        object.__setattr__(self, "_owned", np.asarray(owned, dtype=bool))
        object.__setattr__(self, "_dist", dist)
        out_name = "down_proj.weight" if kind == "glu" else "fc2.weight"
        object.__setattr__(self, "_out_dims", int(cache.banks[0][out_name].shape[1]))

    def set_predictor(self, predict) -> None:  # prefetch is not used in distributed mode
        pass

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        times = self._times
        t0 = time.perf_counter()
        if self._mass is not None:
            self._mass.kept(self._layer, indices)  # a reference only (routing_mass.py)
        host = np.array(indices, copy=False)  # the layer's one host sync, as in one process
        times.router_sync_s += time.perf_counter() - t0
        times.calls += 1
        times.last_k = int(host.shape[-1])
        partial = self._owned_rows(mx.expand_dims(x, (-2, -3)), host)
        return self._dist.combine(partial)

    def _owned_rows(self, x: mx.array, host: np.ndarray) -> mx.array:
        cache = self._cache
        k = host.shape[-1]
        flat = host.reshape(-1)
        rows = np.nonzero(self._owned[flat])[0]
        if rows.size == 0:
            return mx.zeros((*host.shape, self._out_dims), dtype=x.dtype)
        uniq = np.unique(flat[rows])
        xf = x.reshape(-1, 1, 1, x.shape[-1])  # one row per token
        cap = cache.capacity
        groups = [uniq[i : i + cap] for i in range(0, len(uniq), cap)]
        if len(groups) > 1:
            self._times.grouped_calls += 1
        pieces, order = [], []
        for group in groups:
            r = rows if len(groups) == 1 else rows[np.isin(flat[rows], group)]
            slots = cache.ensure(self._layer, group)
            lut = np.zeros(self._num_experts, dtype=np.int64)
            lut[group] = slots
            y = self._run_slots(xf[mx.array(r // k)], lut[flat[r]].reshape(-1, 1))  # (P, 1, D)
            if len(groups) > 1:
                mx.eval(y)  # before the next group may reuse these slots
            pieces.append(y.reshape(len(r), -1))
            order.append(r)
        where = np.zeros(flat.size, dtype=np.int32)
        where[np.concatenate(order)] = np.arange(1, rows.size + 1, dtype=np.int32)
        table = mx.concatenate([mx.zeros((1, self._out_dims), dtype=pieces[0].dtype), *pieces])
        return table[mx.array(where)].reshape(*host.shape, self._out_dims)
