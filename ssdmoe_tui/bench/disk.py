"""Random-read bandwidth of the model's own shards, read the way the engine reads them.

Each batch is what one MoE layer's misses cost during decode: `k` distinct random
experts of one random layer, every component a separate piece at its real offset and
size (from the index), handed in one `read_batch` call to the project's reader at the
engine's queue depth, into a preallocated MLX buffer. No expert is read twice within
one measurement, so page-cache state is what the caller made it (dropped or warm).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ssdmoe_tui.engine.experts import iostats
from ssdmoe_tui.engine.experts.cache import _advise_random
from ssdmoe_tui.engine.experts.index import ExpertIndex
from ssdmoe_tui.engine.experts.reader import buffer_address, open_reader


@dataclass
class DiskResult:
    batch_experts: int  # experts per read_batch call (the K it models)
    pieces_per_batch: int
    piece_bytes: list[int]  # one expert's component sizes, in read order
    batches: int
    bytes: int
    seconds: float
    device_bytes: int | None  # what the device actually read (None: not measurable)
    reader: str
    queue_depth: int
    direct: bool

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["gb_per_s"] = round(self.bytes_per_s / 1e9, 4)
        d["mib_per_s"] = round(self.bytes_per_s / 2**20, 1)
        d["seconds"] = round(self.seconds, 4)
        return d


class _Picker:
    """Distinct (layer, expert) pairs, drawn layer by layer without replacement."""

    def __init__(self, num_layers: int, num_experts: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.left = [list(self.rng.permutation(num_experts)) for _ in range(num_layers)]

    def take(self, k: int) -> tuple[int, list[int]] | None:
        layers = [i for i, left in enumerate(self.left) if len(left) >= k]
        if not layers:
            return None
        layer = int(self.rng.choice(layers))
        picked = [int(self.left[layer].pop()) for _ in range(k)]
        return layer, picked

    @property
    def remaining(self) -> int:
        return sum(len(x) for x in self.left)


def random_read_bandwidth(
    model_dir: Path,
    index: ExpertIndex,
    ks: list[int],
    *,
    target_bytes: int,
    queue_depth: int = 16,
    reader: str = "auto",
    direct: bool = False,
    seed: int = 0,
) -> dict[int, DiskResult]:
    """Bandwidth for batches of k experts, for each k; about `target_bytes` per k.

    The experts of all measurements are disjoint; if the model has fewer experts than
    asked for, each measurement gets an equal share of them.
    """
    model_dir = Path(model_dir)
    rd = open_reader(queue_depth=queue_depth, direct=direct, prefer=reader)
    results: dict[int, DiskResult] = {}
    try:
        fds = _open_shards(rd, model_dir, index)
        picker = _Picker(index.num_layers, index.num_experts, seed)
        share = picker.remaining // max(len(ks), 1)
        for k in ks:
            k = max(1, min(k, index.num_experts))
            n_batches = max(1, min(target_bytes // (k * index.expert_bytes), share // k))
            results[k] = _measure(rd, index, fds, picker, k, n_batches)
    finally:
        rd.close()
    return results


def _open_shards(rd, model_dir: Path, index: ExpertIndex) -> dict[str, int]:  # noqa: ANN001 - a reader
    """Every shard holding experts, opened in the reader as the engine opens it."""
    fds: dict[str, int] = {}
    for layer in index.layers:
        for c in layer.components:
            if c.shard not in fds:
                fds[c.shard] = fd = rd.open(model_dir / c.shard)
                _advise_random(fd)  # as the engine does: no readahead
    return fds


def _measure(
    rd, index: ExpertIndex, fds: dict[str, int], picker: _Picker, k: int, n_batches: int
) -> DiskResult:  # noqa: ANN001 - a reader
    """`n_batches` batches of `k` experts not read before, one `read_batch` call each,
    timed around the calls alone."""
    import mlx.core as mx

    comps = index.layers[0].components
    piece_bytes = [c.stride for c in comps]
    buf = mx.zeros((k * index.expert_bytes,), dtype=mx.uint8)
    mx.eval(buf)
    base = buffer_address(memoryview(buf))
    # Destinations: expert j's components packed one after the other.
    dests = (
        base
        + (np.arange(k, dtype=np.int64) * index.expert_bytes)[:, None]
        + np.concatenate([[0], np.cumsum(piece_bytes)[:-1]]).astype(np.int64)[None, :]
    ).ravel()
    lengths = np.tile(np.array(piece_bytes, dtype=np.int64), k)
    total = 0
    seconds = 0.0
    done = 0
    dev0 = iostats.device_read_bytes()
    for _ in range(n_batches):
        pick = picker.take(k)
        if pick is None:
            break
        layer, experts = pick
        lay = index.layers[layer]
        offsets = lay.file_offsets(experts)
        fd_arr = np.tile(np.array([fds[c.shard] for c in lay.components]), k)
        t0 = time.perf_counter()
        total += rd.read_batch(fd_arr, offsets, lengths, dests)
        seconds += time.perf_counter() - t0
        done += 1
    dev1 = iostats.device_read_bytes()
    del buf
    return DiskResult(
        batch_experts=k,
        pieces_per_batch=k * len(comps),
        piece_bytes=piece_bytes,
        batches=done,
        bytes=total,
        seconds=seconds,
        device_bytes=(dev1 - dev0) if (dev0 is not None and dev1 is not None) else None,
        reader=rd.name,
        queue_depth=rd.queue_depth,
        direct=rd.direct_active,
    )
