"""Decode read-ahead v2: which guesses to read, and where a layer's guesses stop paying.

Layer l's host sync also brings back layer l+1's routing predicted from l's input
(engine/model/streamed.py). Read-ahead v1 read every predicted expert into any slot the
policy would evict: it lowered the hit rate everywhere it was measured (the guesses
evicted experts the next tokens wanted; docs/benchmarks.md). v2 bounds the damage:

- at most `limit` predicted misses per layer (the router's most likely first);
- only into free slots or cold ones: slots no layer asked for in the last `cold_tokens`
  tokens (the cache stamps each slot with the token that last asked for it), coldest
  first; a warm expert is never evicted for a guess, and an unused guess is the
  coldest slot of all;
- per target layer, the share of its guesses used is tracked over windows of `window`
  guesses; a layer whose window falls below `min_precision` stops guessing for
  `reprobe_tokens` tokens, then tries again.

Guesses are read by a second reader, one expert at a time, most likely first, and only
until their layer's lookup comes (`overlap`): a guess never holds the disk once the
layer's own misses are asked for, beyond the one being read, and guesses not started then
are never read. The lookup keeps the started guesses' slots out of its victims and hands
them back as still landing (`Pending.landing`); the hits read ahead are computed after
`complete` waits for them, with the misses. Which guesses are read is then the prefetch
thread's pace: the counts (and so hits and bytes) vary from run to run, tokens never.

Exactness: a guess only changes which slot holds what; nothing computes from a guessed
slot before its bytes landed, so tokens never change (tests/engine/test_prefetch_v2.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ssdmoe_tui.errors import BadValueError

LIMIT_ENV = "SSDMOE_PREFETCH_TOP"  # guesses per layer (default 2)
COLD_ENV = "SSDMOE_PREFETCH_COLD"  # tokens without a use before a slot is cold (default 4)
OVERLAP_ENV = "SSDMOE_PREFETCH_OVERLAP"  # on (default) / off: see `PrefetchGovernor.overlap`


def _env_on(name: str, default: bool) -> bool:
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ("on", "1", "true", "yes"):
        return True
    if text in ("off", "0", "false", "no"):
        return False
    raise BadValueError(f"{name}={text!r}: expected on or off")


def _env_int(name: str, default: int, low: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        v = int(text)
    except ValueError:
        v = low - 1
    if v < low:
        raise BadValueError(f"{name}={text!r}: expected a whole number >= {low}")
    return v


@dataclass
class PrefetchGovernor:
    """Per-layer on/off of decode read-ahead, learned online from its own hits."""

    num_layers: int
    limit: int = 2
    cold_tokens: int = 4
    window: int = 16  # guesses per verdict
    min_precision: float = 0.25
    reprobe_tokens: int = 64
    enabled: bool = True  # the whole read-ahead (a bench toggles it between rounds)
    # The layer's lookup does not wait for its guesses: guesses not started by then are
    # never read, its own misses are read beside the one in flight (a second reader),
    # and only the compute of a guessed expert waits for it (`ExpertCache._lookup`).
    # Waiting first (off) put a second round trip on the disk each layer: on the H100
    # (2026-12-07 sixteenth session, the uniform Qwen3.5 shape, 4 GiB, cold) tokens
    # waited 48-59 ms on guesses and read-ahead ran at 0.83-0.95x.
    overlap: bool = True
    _issued: list[int] = field(default_factory=list)
    _used: list[int] = field(default_factory=list)
    _off_until: list[int] = field(default_factory=list)
    _token: int = 0
    # lifetime totals per target layer: guesses, used, and windows that switched it off
    issued: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    switched_off: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reset()

    @classmethod
    def from_env(cls, num_layers: int) -> PrefetchGovernor:
        """$SSDMOE_PREFETCH_TOP, $SSDMOE_PREFETCH_COLD and $SSDMOE_PREFETCH_OVERLAP over
        the defaults (one line on a bad value)."""
        return cls(
            num_layers,
            limit=_env_int(LIMIT_ENV, 2, 1),
            cold_tokens=_env_int(COLD_ENV, 4, 0),
            overlap=_env_on(OVERLAP_ENV, True),
        )

    def reset(self) -> None:
        n = self.num_layers
        self._issued, self._used, self._off_until = [0] * n, [0] * n, [0] * n
        self.issued, self.used, self.switched_off = [0] * n, [0] * n, [0] * n
        self._token = 0

    def allowed(self, layer: int) -> bool:
        """Whether `layer` may be guessed for now."""
        return self.enabled and self._token >= self._off_until[layer]

    def settle(self, layer: int, issued: int, used: int) -> None:
        """`layer` looked up: of the `issued` experts read ahead for it, `used` were asked for."""
        self.issued[layer] += issued
        self.used[layer] += used
        self._issued[layer] += issued
        self._used[layer] += used
        if self._issued[layer] >= self.window:
            if self._used[layer] < self.min_precision * self._issued[layer]:
                self._off_until[layer] = self._token + self.reprobe_tokens
                self.switched_off[layer] += 1
            self._issued[layer] = self._used[layer] = 0

    def step(self) -> None:
        """One token decoded."""
        self._token += 1

    def figures(self) -> dict:
        """Per target layer: guesses, used, precision, windows that switched it off."""
        return {
            "issued": list(self.issued),
            "used": list(self.used),
            "precision": [
                round(u / i, 4) if i else None for u, i in zip(self.used, self.issued, strict=True)
            ],
            "switched_off": list(self.switched_off),
        }
