"""The top bar: model, architecture, device, K, expert-cache budget, phase."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ssdmoe_tui.engine.protocol import ModelInfo
from ssdmoe_tui.ui.fmt import fmt_bytes


class StatusBar(Static):
    info: reactive[ModelInfo | None] = reactive(None, always_update=True)
    k: reactive[int] = reactive(0)
    phase: reactive[str] = reactive("idle")
    loading: reactive[str] = reactive("")  # model being loaded, "" when none

    def render(self) -> Text:
        sep = ("  │  ", "dim")
        text = Text.assemble(("ssdmoe", "bold"), sep)
        info = self.info
        if info is None:
            if self.loading:
                text.append(f"loading {self.loading} …", style="italic")
            else:
                text.append("no model  (ctrl+p → Open model)", style="italic")
        else:
            text.append(info.name, style="bold")
            text.append(f" ({info.model_type})", style="dim")
            text.append_text(Text.assemble(sep, (info.device, "bold"), (f" · {info.dtype}", "dim")))
            k = self.k or info.k
            text.append_text(
                Text.assemble(sep, "K ", (str(k), "bold"), (f"/{info.num_experts}", "dim"))
            )
            if k != info.trained_k:
                text.append(f" (trained {info.trained_k})", style="dim")
            text.append_text(
                Text.assemble(sep, "cache ", (fmt_bytes(info.expert_cache_budget), "bold"))
            )
        text.append_text(Text.assemble(sep, (self.phase, "italic")))
        return text
