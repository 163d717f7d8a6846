"""A long prefill chunk's next layer moved to the GPU by page migration (MLX-CUDA `host`
placement: in a prompt's first chunk by default, in every long chunk under
`SSDMOE_PREFILL_STAGE=migrate`; page_moves.py says why: the staging copy from
host-placed slots runs on MLX's stream and adds its time, page migrations run beside the
compute).

Measured on an H100 (docs/benchmarks.md, 2026-12-07 tenth session; Qwen3-30B-A3B shape,
4 GiB host slots, K = 8, warm, alternating processes): a 4,096-token prompt (one chunk)
0.838-0.858x resident moved against 0.718-0.787x staged in place; 8,192 tokens (two
chunks) 0.837 against 0.827x; 16,384 (four) 0.771-0.785x moved against 0.830-0.834x in
place. The prompt totals fit a first chunk ~0.35 s faster moved and each later chunk
~0.4 s slower (its reads into slots whose pages moved take twice as long: 3.2-3.6 s of
reading against 1.5-1.6 in place at 16k), hence `auto`: the first chunk only
(`moves_now`), and only a chunk of `AUTO_MIN_TOKENS` or more: a layer's move (21 ms for
its 128 experts on that H100) runs beside its compute (59.9 ms at 4,096 tokens, about
proportional to them), so a short chunk would wait for its pages (the first stoppable
request's first chunk is 128 tokens: prefill_stop.FIRST_CHUNK). Measured since (the
eleventh session, `prefill_chunks_s`): the moved first chunk 0.40 s faster, later chunks
as in place, 16k `auto` 0.854 / 0.859x against 0.830 / 0.832x; but after a one-chunk
4k prompt the one-token step took 0.63 against 0.16 s (0.782 against 0.794x). The
twelfth session's four processes each way (`prefill_chunks_detail`) put that step at
0.23-0.24 s both ways and the 4k prompt at 0.853-0.855x moved against 0.754-0.756x in
place: that one process's slow step, not the path's.

The same hooks as staging ahead (prestage.py): layer l's switch, once its compute is
queued and layer l+1's predicted union is being read ahead, leaves the prediction here
(`ask`); layer l+1's switch, its attention and router queued, calls `fulfil`: the
read-ahead's reads are waited for, and the pages of the rows holding l+1's predicted
experts are queued to move to the GPU while the device still computes layer l. Layer
l+1 then stages in place as before (`take` gives no copy): its gather reads device
memory where the move has landed.

Pages go back to the host two layers later: at layer l+1's `fulfil`, layer l-1's
compute is done (layer l's router, which the host waited for, needed it), so its pages
are queued back, beside layer l's compute; the reader refills a slot long after (the
cache evicts the oldest layers' slots first), into host pages at host speed. The last
two layers' pages of a chunk stay on the GPU until the next chunk's moves, or move back
when the reader first writes them. None of this decides what a read returns (managed
memory is coherent): only how long the gather and the refills take.

`mover` None (no MLX-CUDA, or its driver API missing): nothing moves, and the chunks are
staged in place as under `on`."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from ssdmoe_tui.engine.experts.page_moves import PageMover

# `auto` moves a first chunk of at least this many tokens (the module's docstring).
AUTO_MIN_TOKENS = 2048

# Moved layers left on the GPU when the next one moves: the layer before it, whose
# compute may still be queued (the module's docstring: why the one before that is done).
KEEP_LAYERS = 1


class PageAhead:
    """One per model, shared by its switches: the prediction asked for and the ranges
    moved, oldest first. `moves_now` (None: always) says whether this chunk moves pages;
    moved ones still go back when it does not."""

    def __init__(
        self, mover: PageMover | None, moves_now: Callable[[], bool] | None = None
    ) -> None:
        self.mover = mover
        self.moves_now = moves_now
        self._asked: tuple[int, int, np.ndarray] | None = None  # (layer, call, experts)
        self._moved: deque[list[tuple[int, int]]] = deque()
        self.moved_bytes = 0  # to the GPU, summed (bench's figure)
        self.moves = 0  # layers moved

    def ask(self, layer: int, experts: np.ndarray, call: int) -> None:
        """`layer`'s predicted union, read ahead by the call numbered `call`."""
        self._asked = (layer, call, experts)

    def fulfil(self, cache, layer: int, call: int) -> None:  # noqa: ANN001 - ExpertCache
        """At the start of `layer`'s call (its router queued): the older layers' pages
        back to the host, then this layer's predicted rows to the GPU."""
        asked, self._asked = self._asked, None
        mover = self.mover
        if mover is None:
            return
        while len(self._moved) > KEEP_LAYERS:
            mover.to_host(self._moved.popleft())
        if asked is None or asked[0] != layer or asked[1] != call:
            return
        if self.moves_now is not None and not self.moves_now():
            return
        cache.wait_prefetch()  # the bytes are in the pages before they move
        slots = cache.slots_of(layer, asked[2])
        ranges = cache.slot_ranges(slots[slots >= 0])
        if not ranges:
            return
        mover.to_device(ranges)
        self._moved.append(ranges)
        self.moved_bytes += sum(n for _, n in ranges)
        self.moves += 1

    def take(self, layer: int, call: int) -> None:
        """No copy of its own: the layer stages in place (from pages moved ahead)."""
        return None

    def drop(self) -> None:
        """A stopped chunk: forget the prediction (moved pages return at the next moves)."""
        self._asked = None


def page_ahead(placement: str, moves_now: Callable[[], bool] | None = None) -> PageAhead:
    """The model's PageAhead: a mover where slots are host-placed under MLX-CUDA."""
    from ssdmoe_tui.engine.experts.device_memory import is_cuda

    mover = None
    if is_cuda() and placement == "host":
        try:
            mover = PageMover()
        except (OSError, AttributeError):
            mover = None
    return PageAhead(mover, moves_now)
