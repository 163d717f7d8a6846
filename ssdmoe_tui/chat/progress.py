"""How far a model load has got, from the engine's phase events: a fraction, a phase
label and a time estimate for the progress bars (welcome panel, engine panel).

The engine reports a load as steps ("creating the demo model", "wrote shard i/n",
"indexing experts", "loading resident weights", "loading tokenizer") and a Hub download
as bytes done/total. Each step owns a slice of the bar; inside a step, i/n or bytes move
it. The estimate is elapsed time scaled by what is left, once a tenth is done.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

# (start, end) of the bar per step, in load order.
STEPS = {
    "download": (0.0, 0.6),
    "demo": (0.0, 0.6),
    "index": (0.6, 0.7),
    "resident": (0.7, 0.9),
    "tokenizer": (0.9, 1.0),
}
LABELS = {
    "download": "downloading from the Hugging Face Hub",
    "demo": "writing the demo model (first run only)",
    "index": "indexing experts",
    "resident": "loading resident weights",
    "tokenizer": "loading the tokenizer",
}
_SHARD = re.compile(r"wrote \S+ \((\d+)/(\d+)")


def step_of(detail: str, total: int) -> str | None:
    """Which step a PhaseChanged detail belongs to (None: not a step, e.g. a path).

    Matched on the engine's own phrases at the start of the detail: a model path that
    merely contains "index" or "tokenizer" is not a step."""
    text = detail.lower()
    if total and text.startswith("downloading"):
        return "download"
    if text.startswith("creating the demo model") or _SHARD.match(detail):
        return "demo"
    if text.startswith("indexing"):
        return "index"
    if text.startswith("loading resident"):
        return "resident"
    if text.startswith("loading tokenizer") or text.startswith("loading the tokenizer"):
        return "tokenizer"
    return None


@dataclass
class LoadProgress:
    """Feed it each loading/indexing PhaseChanged; read `fraction`, `label`, `eta_s`."""

    fraction: float = 0.0
    label: str = "starting"
    started: float = field(default_factory=time.monotonic)

    def update(self, phase: str, done: int, total: int, detail: str) -> None:
        step = "index" if phase == "indexing" else step_of(detail, total)
        if step is None:
            return
        start, end = STEPS[step]
        if end <= self.fraction:
            return  # an earlier step: the bar never goes back
        within = 0.0
        if step == "download" and total:
            within = done / total
        elif m := _SHARD.search(detail):
            within = int(m.group(1)) / max(1, int(m.group(2)))
        # Without a demo to write or a download, the load starts at the index step.
        self.fraction = max(self.fraction, start + (end - start) * min(1.0, within))
        self.label = LABELS[step]

    @property
    def eta_s(self) -> float | None:
        if self.fraction < 0.1:
            return None
        elapsed = time.monotonic() - self.started
        return elapsed * (1.0 - self.fraction) / self.fraction

    def text(self) -> str:
        """ "indexing experts · 64% · ~3 s left"."""
        parts = [self.label, f"{self.fraction * 100:.0f}%"]
        if (eta := self.eta_s) is not None:
            parts.append(f"~{eta:.0f} s left" if eta < 120 else f"~{eta / 60:.0f} min left")
        return " · ".join(parts)
