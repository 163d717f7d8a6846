"""The top bar: model, architecture, device, K, expert-cache budget, phase."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ssdmoe_tui.engine.run.protocol import ModelInfo
from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.ui.fmt import fmt_bytes


class StatusBar(Static):
    info: reactive[ModelInfo | None] = reactive(None, always_update=True)
    k: reactive[int] = reactive(0)
    phase: reactive[str] = reactive("idle")
    loading: reactive[str] = reactive("")  # model being loaded, "" when none

    def parts(self) -> list[tuple[int, Text]]:
        """(priority, piece) in display order; the lowest priorities go first when the
        terminal is too narrow for all of them (at 80 columns the figures all stay)."""
        info = self.info
        parts: list[tuple[int, Text]] = [(0, Text("ssdmoe", style="bold"))]
        if info is None:
            if self.loading:
                parts.append((9, Text(f"loading {self.loading} …", style="italic")))
            else:
                parts.append((9, Text("no model  (F4 picks one)", style="italic")))
        else:
            name = Text(visible(info.name), style="bold")  # an attached server's word
            parts.append((9, name))
            parts.append((2, Text(f"({info.model_type})", style="dim")))
            parts.append((6, Text(info.device, style="bold")))
            parts.append((1, Text(info.dtype, style="dim")))
            k = self.k or info.k
            k_text = Text.assemble("K ", (str(k), "bold"), (f"/{info.num_experts}", "dim"))
            if k != info.trained_k:
                k_text.append(f" (trained {info.trained_k})", style="dim")
            parts.append((8, k_text))
            parts.append(
                (7, Text.assemble("cache ", (fmt_bytes(info.expert_cache_budget), "bold")))
            )
            if self.loading:
                parts.append((5, Text(f"reloading {self.loading} …", style="italic")))
        parts.append((8, Text(self.phase, style="italic")))
        return parts

    def render(self) -> Text:
        parts = self.parts()
        width = self.content_size.width or 10_000
        while len(parts) > 1 and _joined(parts).cell_len > width:
            parts.remove(min(parts, key=lambda p: p[0]))
        return _joined(parts)


def _joined(parts: list[tuple[int, Text]]) -> Text:
    """Pieces with a bar between them; a "(…)" piece stays next to the one before it."""
    text = Text()
    for i, (_, piece) in enumerate(parts):
        if i:
            text.append(" " if piece.plain.startswith("(") else " │ ", style="dim")
        text.append_text(piece)
    return text
