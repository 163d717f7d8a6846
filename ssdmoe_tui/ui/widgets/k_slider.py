"""The K control: how many routed experts each token uses, 1..num_experts.

Textual has no slider (and the third-party one is GPL), so this is a small one of
our own: a track with the chosen K, a mark at the model's trained K, and the SSD
traffic per token the choice implies.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.reactive import reactive
from textual.widget import Widget

from ssdmoe_tui.ui.fmt import mib_per_token
from ssdmoe_tui.ui.messages import WidgetMessage


class KSlider(Widget, can_focus=True):
    """Focus it and use ←/→ or -/+, or click the track."""

    DEFAULT_CSS = """
    KSlider { height: 4; width: 1fr; }
    KSlider .kslider--track { color: $primary; }
    KSlider .kslider--rest { color: $foreground-muted; }
    KSlider .kslider--knob { color: $accent; text-style: bold; }
    KSlider .kslider--trained { color: $success; text-style: bold; }
    KSlider .kslider--tradeoff { color: $warning; }
    KSlider:focus .kslider--knob { color: $accent; text-style: bold reverse; }
    """
    COMPONENT_CLASSES = {
        "kslider--track",
        "kslider--rest",
        "kslider--knob",
        "kslider--trained",
        "kslider--tradeoff",
    }
    BINDINGS = [
        Binding("left,minus", "step(-1)", "K−", show=False, id="kslider.down"),
        Binding("right,plus,equals_sign", "step(1)", "K+", show=False, id="kslider.up"),
        Binding("home", "set_k(1)", "K=1", show=False, id="kslider.min"),
        Binding("end", "to_max", "K=max", show=False, id="kslider.max"),
    ]

    k: reactive[int] = reactive(1)
    num_experts: reactive[int] = reactive(0)  # 0: no model yet
    trained_k: reactive[int] = reactive(0)

    class Changed(WidgetMessage["KSlider"]):
        """K was changed by the user (keys or mouse)."""

        def __init__(self, slider: KSlider, k: int) -> None:
            super().__init__(slider)
            self.slider = slider
            self.k = k

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.expert_bytes = 0
        self.num_layers = 0
        self.user_changed_at = 0.0  # monotonic time of the last change by the user

    def configure(
        self, *, num_experts: int, trained_k: int, k: int, expert_bytes: int, num_layers: int
    ) -> None:
        """Set the range from a loaded model (does not post Changed)."""
        self.expert_bytes = expert_bytes
        self.num_layers = num_layers
        self.num_experts = max(0, num_experts)  # 0: no model
        self.trained_k = trained_k
        self.set_reactive(KSlider.k, self._clamp(k))
        self.refresh()

    def _clamp(self, k: int) -> int:
        return max(1, min(int(k), max(1, self.num_experts)))

    def set_k(self, k: int, *, notify: bool = True) -> None:
        if not self.num_experts:
            return
        new = self._clamp(k)
        if new != self.k:
            self.k = new
            if notify:
                self.user_changed_at = time.monotonic()
                self.post_message(self.Changed(self, new))

    def action_step(self, delta: int) -> None:
        self.set_k(self.k + delta)

    def action_set_k(self, k: int) -> None:
        self.set_k(k)

    def action_to_max(self) -> None:
        self.set_k(self.num_experts)

    @property
    def implied_mib_per_token(self) -> float:
        return mib_per_token(self.expert_bytes, self.k, self.num_layers)

    def _track_width(self) -> int:
        return max(3, self.content_size.width - 2)

    def _cell(self, k: int, width: int) -> int:
        if self.num_experts <= 1:
            return 0
        return round((k - 1) * (width - 1) / (self.num_experts - 1))

    def on_click(self, event: events.Click) -> None:
        if not self.num_experts:
            return
        self.focus()
        width = self._track_width()
        x = min(max(event.x - 1, 0), width - 1)
        if self.num_experts > 1:
            self.set_k(1 + round(x * (self.num_experts - 1) / (width - 1)))

    def render(self) -> Text:
        if not self.num_experts:
            return Text("K  —  (no model loaded)", style=self._style("kslider--rest"))
        k, n, trained = self.k, self.num_experts, self.trained_k
        head = Text.assemble(
            ("K ", "bold"),
            (f"{k}", self._style("kslider--knob")),
            f" of {n}   trained ",
            (f"{trained}", self._style("kslider--trained")),
        )
        width = self._track_width()
        knob, mark = self._cell(k, width), self._cell(trained, width)
        track = Text("[")
        for i in range(width):
            if i == knob:
                track.append("●", self._style("kslider--knob"))
            elif i == mark:
                track.append("┃", self._style("kslider--trained"))
            elif i < knob:
                track.append("━", self._style("kslider--track"))
            else:
                track.append("─", self._style("kslider--rest"))
        track.append("]")
        foot = Text(f"≈ {self.implied_mib_per_token:.2f} MiB/token uncached")
        if 0 < self.size.height < 4:  # compact (short terminals): the figures, no note
            return Text("\n").join([head, track, foot])
        if k < trained:
            note = Text(f"speed/quality trade-off (< {trained})", self._style("kslider--tradeoff"))
        elif k > trained:
            note = Text(f"above trained K ({trained}): slower", self._style("kslider--rest"))
        else:
            note = Text("= trained K", self._style("kslider--trained"))
        return Text("\n").join([head, track, foot, note])

    def _style(self, name: str):
        return self.get_component_rich_style(name, partial=True)
