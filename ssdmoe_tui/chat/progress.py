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
    "tokenizer": (0.9, 0.97),
    "kernels": (0.97, 1.0),  # MLX-CUDA's first run: the kernels compile at the first pass
}
LABELS = {
    "download": "downloading from the Hugging Face Hub",
    "demo": "writing the demo model (first run only)",
    "index": "indexing experts",
    "resident": "loading resident weights",
    "tokenizer": "loading the tokenizer",
    "kernels": "compiling GPU kernels, once: the first reply on a new model takes minutes",
}
#: MLX-CUDA's first run (the loader said it compiles): the first reply's phases say so,
#: and the transcript says what it costs. Figures: docs/app.md, "First run on a GPU".
COMPILING = "compiling GPU kernels, once"
FIRST_REPLY_NOTE = (
    "First run of MLX-CUDA here: the first reply compiles the GPU kernels, once (the "
    "demo: about 2 minutes on an H100, its prefill at a fraction of a token a second). "
    "They are kept: later runs start in seconds."
)
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
    if text.startswith("compiling gpu kernels"):  # gpu_kernels.first_run_note, CUDA only
        return "kernels"
    return None


@dataclass
class LoadProgress:
    """Feed it each loading/indexing PhaseChanged; read `fraction`, `label`, `eta_s`."""

    fraction: float = 0.0
    label: str = "starting"
    started: float = field(default_factory=time.monotonic)
    compiling: bool = False  # the loader said MLX-CUDA compiles at the first pass

    def update(self, phase: str, done: int, total: int, detail: str) -> None:
        step = "index" if phase == "indexing" else step_of(detail, total)
        if step is None:
            return
        self.compiling = self.compiling or step == "kernels"
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


@dataclass
class PrefillClock:
    """Prefill progress that moves between the engine's reports.

    The engine reports prefill at chunk boundaries (`PhaseChanged("prefill", done,
    total)`); a prompt that fits one chunk (2048 tokens) gets no report until it is all
    done, which on a real model is minutes. Between reports the count moves at the
    prefill rate: the one measured in this prefill once a chunk has been reported, else
    the last prefill's (`learn`), else none is known and only the elapsed time moves.
    Estimated counts stay below the total (only the engine says it is done) and are
    marked "≈"."""

    rate: float | None = None  # tok/s
    total: int = 0
    first: int = 0  # tokens already served from the KV cache when it began
    done: int = 0  # the engine's last report
    started: float = 0.0
    reported: float = 0.0

    def learn(self, rate: object) -> None:
        """The prefill rate a finished turn measured (its `prefill_tok_s`)."""
        if isinstance(rate, (int, float)) and rate > 0:
            self.rate = float(rate)

    def report(self, done: int, total: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if total != self.total or done < self.done:  # a new prefill
            self.total, self.first, self.started = total, done, now
        elif done > self.first and now > self.started:
            self.rate = (done - self.first) / (now - self.started)
        self.done, self.reported = done, now

    def estimate(self, now: float | None = None) -> tuple[int, bool]:
        """(tokens prefilled, estimated?) now."""
        now = time.monotonic() if now is None else now
        if self.rate is None or self.done >= self.total:
            return self.done, False
        moved = int(self.rate * max(0.0, now - self.reported))
        if moved <= 0:
            return self.done, False
        return min(self.total - 1, self.done + moved), True

    def text(self, now: float | None = None, *, rate: bool = True) -> str:
        """ "≈312/1,261 · 60 tok/s · ~16 s left", or "0/1,261 · 3 s" without a rate;
        `rate=False` leaves the rate out (the status bar's short form)."""
        now = time.monotonic() if now is None else now
        tokens, guessed = self.estimate(now)
        parts = [f"{'≈' if guessed else ''}{tokens:,}/{self.total:,}"]
        if self.rate:
            if rate:
                r = self.rate
                parts.append(f"{r:,.0f} tok/s" if r >= 10 else f"{r:.1f} tok/s")
            left = (self.total - tokens) / self.rate
            parts.append(f"~{left:.0f} s left" if left < 120 else f"~{left / 60:.0f} min left")
        else:
            parts.append(f"{now - self.started:.0f} s")
        return " · ".join(parts)
