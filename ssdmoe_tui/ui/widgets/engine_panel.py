"""The engine panel: what the streaming engine is doing, token by token.

Fed only from events the engine posts (StatsSample, PhaseChanged, ModelLoaded);
it never asks MLX anything. Every shown value is kept in `shown` as the exact text
on screen, so tests can compare it with the sample that produced it.
"""

from __future__ import annotations

import time
from collections import deque

from rich.cells import cell_len
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Label, ProgressBar, Sparkline, Static

from ssdmoe_tui.chat.progress import LoadProgress, PrefillClock
from ssdmoe_tui.checkpoint import arch
from ssdmoe_tui.engine.run.protocol import ModelInfo, PhaseChanged, StatsSample
from ssdmoe_tui.ui.child import child
from ssdmoe_tui.ui.fmt import fmt_bytes, fmt_count, fmt_mib, fmt_pct, fmt_rate
from ssdmoe_tui.ui.widgets.k_slider import KSlider

HISTORY = 60  # sparklines cover about the last 60 decoded tokens

PHASE_LABELS = {
    "idle": "idle",
    "loading": "loading model",
    "indexing": "indexing experts",
    "prefill": "prefill",
    "decoding": "decoding",
    "saving": "saving",
}

# (key, label) rows in display order; the section a row belongs to is set in compose().
# Labels stay short: at 80x24 the panel is ~30 columns and shows every row at once.
ROWS = {
    "decode": "decode",
    "prefill": "prefill (last)",
    "ssd": "read from SSD",
    "page_cache": "from page cache",
    "mass": "router mass kept",
    "cache_hit": "cache hit rate",
    "cache_used": "cache used",
    "mem_resident": "weights",
    "mem_kv": "KV cache",
    "mem_rss": "process RSS",
    "mem_peak": "peak RSS",
    "kv_hit": "KV hit (turn)",
    "context": "context",
    "spec_accept": "drafts kept",
    "spec_pass": "tokens per pass",
    "spec_cost": "per token",
    "spec_gain": "speed vs plain",
}

TOOLTIPS = {
    "ssd": "Expert bytes per token that came from the storage device (/proc/self/io "
    "read_bytes): the cost of streaming.",
    "page_cache": "Expert bytes per token the engine read that the OS served from its "
    "page cache in RAM, not from the device (a small model's shards sit there after the "
    "first read).",
    "mass": "The cost of K: the router's probability mass kept by the experts run, against "
    "the trained K (100 % there), mean over MoE layers and this reply's tokens; the "
    "sparkline is per token.",
    "cache_hit": "Share of routed experts found in the engine's own expert cache this turn.",
    "kv_hit": "Share of this turn's prompt served from the saved KV cache.",
    "spec_accept": "Speculative decoding (F9): drafted tokens the model agreed with this reply. "
    "Greedy replies are unchanged on CPU; on MLX-CUDA a verify pass's logits differ from "
    "one-token decode (up to 0.28 on the H200), so near-ties may flip tokens.",
    "spec_pass": "Tokens each forward pass produced this reply (1 without speculation).",
    "spec_cost": "Expert bytes read and milliseconds per token this reply.",
    "spec_gain": "What speculation bought: this reply's undrafted one-token steps (their "
    "mean time) over its time per token; below 1.00x it cost. An estimate: those steps "
    "carry the governor's own work, so it leans high by that much. The governor drafts "
    "only where it expects at least 5 % more tokens per second.",
}

SPEC_ROWS = ("spec_accept", "spec_pass", "spec_cost", "spec_gain")
MASS_NOT_MEASURED = (
    "Not measured for {family}: its router is neither a softmax over the experts nor "
    "DeepSeek-V3's biased sigmoid, the functions the meter computes (checkpoint/arch.py)."
)


def mass_measured(model_type: str) -> bool:
    """Whether the engine measures the router mass of this family (its routing function
    is one the meter computes); an unknown type is taken to be measured ("—" until then)."""
    entry = arch.ARCHITECTURES.get(model_type)
    return entry is None or entry.routing != "none"


K_ECHO_GRACE_S = 1.0  # samples this soon after a K change may predate it: not reflected


def page_cache_mib(s: StatsSample) -> float:
    """MiB per token the engine read that did not come from the device: the OS served
    them from its page cache (read-ahead can make the device side the larger one)."""
    return max(0.0, s.requested_mib_per_token - s.ssd_mib_per_token)


def _short(x: float) -> str:
    """A figure in at most 6 columns (`0.53`, `12.3`, `486`): the speculation cost row
    fits beside its label at 80 columns."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}" if x < 100 else f"{x:.0f}"


def used_of(used: int, budget: int) -> str:
    """`5.1 / 8.0 GiB` (the unit once when both share it): at 80 columns the panel is 31
    wide, and `cache used` with `999.9 GiB / 999.9 GiB` did not fit beside its label."""
    a, b = fmt_bytes(used), fmt_bytes(budget)
    unit = b.rsplit(" ", 1)[-1]
    if a.endswith(" " + unit) and " " in b:
        return f"{a[: -len(unit) - 1]} / {b}"
    return f"{a} / {b}"


class Row(Horizontal):
    """`label ......... value` on one line."""

    DEFAULT_CSS = """
    Row { height: 1; }
    Row > .row-label { width: 1fr; color: $foreground-muted; padding-right: 1;
                       text-wrap: nowrap; text-overflow: ellipsis; }
    Row > .row-value { width: auto; text-style: bold; }
    """

    def __init__(self, key: str, label: str) -> None:
        super().__init__(id=f"row-{key}")
        self.key = key
        self.label = label
        if key in TOOLTIPS:
            self.tooltip = TOOLTIPS[key]

    def compose(self) -> ComposeResult:
        yield Label(self.label, classes="row-label")
        yield Static("—", id=f"v-{self.key}", classes="row-value")


class EnginePanel(VerticalScroll):
    """Side column: phase, K, throughput, SSD traffic, caches, memory, context."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.shown: dict[str, str] = {}
        self.decode_history: deque[float] = deque(maxlen=HISTORY)
        self.ssd_history: deque[float] = deque(maxlen=HISTORY)
        self.mass_history: deque[float] = deque(maxlen=HISTORY)
        self.last_sample: StatsSample | None = None
        self.info: ModelInfo | None = None
        self.mass_measured = True  # False: the model's family has no router-mass function
        self._last_generated = 0
        self.phase = "idle"
        self._context_unknown = False  # a resumed conversation before its next turn
        # A new conversation until its first request: a sample the engine sends late for
        # the previous one's last request (stopped in its prefill by ctrl+n) is not this
        # conversation's, so only its machine-wide figures (memory, cache use) are shown.
        self._between = False

    def compose(self) -> ComposeResult:
        yield Static("phase", classes="section-title")
        yield Static(PHASE_LABELS["idle"], id="phase")
        yield ProgressBar(total=1, show_eta=False, id="phase-progress")
        yield Static("experts per token", classes="section-title")
        yield KSlider(id="k-slider")
        yield Static("throughput", classes="section-title")
        yield Row("decode", ROWS["decode"])
        yield Sparkline([], id="spark-decode")
        yield Row("prefill", ROWS["prefill"])
        yield Static("expert bytes per token", classes="section-title")
        yield Row("ssd", ROWS["ssd"])
        yield Row("page_cache", ROWS["page_cache"])
        yield Sparkline([], id="spark-ssd")  # all bytes read per token: SSD + page cache
        # The cost of K: the router's probability mass the running K keeps (100 % at trained K).
        yield Row("mass", ROWS["mass"])
        yield Sparkline([], id="spark-mass")
        yield Static("expert cache", classes="section-title")
        yield Row("cache_hit", ROWS["cache_hit"])
        yield Row("cache_used", ROWS["cache_used"])
        # An expert-parallel launch (`ssdmoe launch ... ssdmoe --distributed`): each rank's
        # share, bytes and hits over the last reply (hidden in one process).
        yield Static("ranks (last reply)", classes="section-title", id="ranks-title")
        yield Static("", id="ranks")
        yield Static("memory", classes="section-title")
        for key in ("mem_resident", "mem_kv", "mem_rss", "mem_peak"):
            yield Row(key, ROWS[key])
        yield Static("context", classes="section-title")
        yield Row("kv_hit", ROWS["kv_hit"])
        yield Row("context", ROWS["context"])
        yield ProgressBar(total=1, show_eta=False, show_percentage=True, id="context-meter")
        # speculative decoding (F9): shown while a reply speculates
        yield Static("speculation", classes="section-title", id="spec-title")
        for key in SPEC_ROWS:
            yield Row(key, ROWS[key])

    def on_mount(self) -> None:
        self.border_title = "engine"
        self.query_one("#phase-progress", ProgressBar).display = False
        self.query_one("#ranks-title").display = False
        self.query_one("#ranks").display = False
        self._show_spec(None)

    # ------------------------------------------------------------------ updates

    def _set(self, key: str, text: str) -> None:
        if self.shown.get(key) != text:
            self.shown[key] = text
            value = self.query_one(f"#v-{key}", Static)
            value.update(text)
            # Its width in cells, set with the text: left to `width: auto`, a value set
            # before the widget had mounted (`--attach` in a real terminal) kept the width
            # Textual had cached for the "—" before it (Widget.refresh skips
            # clear_cached_dimensions until mounted): "weights 9", "context 0" in 2 of 8.
            value.styles.width = max(1, cell_len(text))

    def _mass(self, value: float | None) -> str:
        """The router mass kept, "—" until measured, "n/a" for a family never measured."""
        return fmt_pct(value) if self.mass_measured else "n/a"

    def show_model(self, info: ModelInfo | None, k: int | None = None) -> None:
        """Show a loaded model (None: no model); `k` is the K it runs at."""
        self.info = info
        slider = self.query_one(KSlider)
        if info is None:
            slider.configure(num_experts=0, trained_k=0, k=1, expert_bytes=0, num_layers=0)
            for key in ROWS:
                self._set(key, "—")
            self.last_sample = None
            self.clear_history()
            self.query_one("#context-meter", ProgressBar).update(total=1, progress=0)
            return
        slider.configure(
            num_experts=info.num_experts,
            trained_k=info.trained_k,
            k=k if k is not None else info.k,
            expert_bytes=info.expert_bytes,
            num_layers=info.num_layers,
        )
        # Another model: nothing measured on the one before applies (F4's sparklines).
        for key in ROWS:
            self._set(key, "—")
        self.last_sample = None
        self.clear_history()
        self.mass_measured = mass_measured(info.model_type)
        self.query_one("#row-mass", Row).tooltip = TOOLTIPS["mass"] + (
            "" if self.mass_measured else f" {MASS_NOT_MEASURED.format(family=info.model_type)}"
        )
        self._set("mass", self._mass(None))
        self._set("mem_resident", fmt_bytes(info.resident_bytes))
        self._set("cache_used", f"— / {fmt_bytes(info.expert_cache_budget)}")
        self._show_context_unknown()

    def new_conversation(self, resumed: bool = False) -> None:
        """Another conversation in this window (ctrl+n, ctrl+o, --resume): the figures of
        the one before (its context, KV hit, router mass, sparklines) go. A resumed one's
        context is shown once its next turn has run (its KV checkpoint loads then)."""
        self.clear_history()
        for key in ("kv_hit", "decode", "prefill", "ssd", "page_cache", "cache_hit"):
            self._set(key, "—")
        self._set("mass", self._mass(None))
        self._context_unknown = resumed
        self._between = True
        self._show_context_unknown()

    def _show_context_unknown(self) -> None:
        info = self.info
        if info is None:
            return
        used = "—" if self._context_unknown else "0"
        self._set("context", f"{used} / {fmt_count(info.max_context)}")
        meter = self.query_one("#context-meter", ProgressBar)
        meter.update(total=max(1, info.max_context), progress=0)

    def show_phase(self, event: PhaseChanged) -> None:
        self.phase = event.phase
        label = PHASE_LABELS.get(event.phase, event.phase)
        if event.total and event.phase in ("prefill", "loading", "indexing"):
            label += f"  {fmt_count(event.done)}/{fmt_count(event.total)}"
        if event.detail:
            label += f"\n{event.detail}"
        self.query_one("#phase", Static).update(label)
        self.shown["phase"] = label
        bar = self.query_one("#phase-progress", ProgressBar)
        bar.display = event.phase in ("prefill", "loading", "indexing") and event.total > 0
        if bar.display:
            bar.update(total=event.total, progress=event.done)
        if event.phase == "prefill" and event.done == 0:
            self._last_generated = 0

    def show_prefill(self, clock: PrefillClock, note: str = "") -> None:
        """A prefill: tokens (estimated between the engine's reports), rate, time left;
        `note` on its own line (MLX-CUDA's first run: the kernels compiling)."""
        label = f"{PHASE_LABELS['prefill']}  {clock.text()}" + (f"\n{note}" if note else "")
        self.query_one("#phase", Static).update(label)
        self.shown["phase"] = label
        bar = self.query_one("#phase-progress", ProgressBar)
        bar.display = clock.total > 0
        if bar.display:
            bar.update(total=clock.total, progress=clock.estimate()[0])

    def show_load(self, progress: LoadProgress) -> None:
        """A model load: its step, share done and time left, on the phase line and bar."""
        label = f"{PHASE_LABELS['loading']}\n{progress.text()}"
        self.query_one("#phase", Static).update(label)
        self.shown["phase"] = label
        bar = self.query_one("#phase-progress", ProgressBar)
        bar.display = True
        bar.update(total=100, progress=progress.fraction * 100)

    def show_sample(self, s: StatsSample) -> None:
        self.last_sample = s
        self._set("cache_used", used_of(s.expert_cache_used_bytes, s.expert_cache_budget_bytes))
        self._set("mem_resident", fmt_bytes(s.resident_bytes))
        self._set("mem_kv", fmt_bytes(s.kv_cache_bytes))
        self._set("mem_rss", fmt_bytes(s.rss_bytes))
        self._set("mem_peak", fmt_bytes(s.peak_rss_bytes))
        if self._between:
            return
        new_tokens = s.generated_tokens - self._last_generated
        if new_tokens < 0:  # a new turn started
            new_tokens = s.generated_tokens
        self._last_generated = s.generated_tokens
        # A rate over the first token alone is a timing artefact (thousands of tok/s).
        settled = s.generated_tokens >= 2
        if new_tokens > 0 and settled:
            # One sparkline point per token decoded since the previous sample, so the
            # lines span ~60 tokens whatever the sample rate.
            for _ in range(min(new_tokens, HISTORY)):
                self.decode_history.append(s.decode_tok_s)
                self.ssd_history.append(s.requested_mib_per_token)
                if s.routing_mass_last is not None:
                    self.mass_history.append(s.routing_mass_last)
            self.query_one("#spark-decode", Sparkline).data = list(self.decode_history)
            self.query_one("#spark-ssd", Sparkline).data = list(self.ssd_history)
            self.query_one("#spark-mass", Sparkline).data = list(self.mass_history)
        # Before any prompt has run (the sample a load posts) a rate or a share is not
        # zero, it is not measured yet.
        ran = s.context_tokens > 0 or s.generated_tokens > 0
        if ran:
            self._context_unknown = False
        self._set("decode", fmt_rate(s.decode_tok_s) if settled else "—")
        self._set("prefill", fmt_rate(s.prefill_tok_s) if s.prefill_tok_s > 0 else "—")
        self._set("ssd", fmt_mib(s.ssd_mib_per_token) if ran else "—")
        self._set("page_cache", fmt_mib(page_cache_mib(s)) if ran else "—")
        self._set("mass", self._mass(s.routing_mass))
        self._set("cache_hit", fmt_pct(s.expert_cache_hit_rate) if ran else "—")
        self._set("kv_hit", fmt_pct(s.kv_hit_rate) if ran else "—")
        if self._context_unknown:
            return
        self._set("context", f"{fmt_count(s.context_tokens)} / {fmt_count(s.max_context)}")
        meter = self.query_one("#context-meter", ProgressBar)
        meter.update(total=max(1, s.max_context), progress=min(s.context_tokens, s.max_context))
        self._show_spec(s.speculation)

    def _show_spec(self, sp: dict | None) -> None:
        """The speculation rows: acceptance, tokens per pass, bytes and ms per token, and
        the speed it bought against a plain step (hidden while replies do not speculate)."""
        shown = sp is not None
        self.query_one("#spec-title").display = shown
        for key in SPEC_ROWS:
            self.query_one(f"#row-{key}").display = shown
        if sp is None:
            return
        acc = sp.get("acceptance")
        self._set("spec_accept", "—" if acc is None else
                  f"{acc * 100:.0f} % ({sp.get('accepted', 0)}/{sp.get('drafted', 0)})")  # fmt: skip
        tpp = sp.get("tokens_per_pass")
        self._set("spec_pass", "—" if tpp is None else f"{tpp:.2f}")
        self._set(
            "spec_cost",
            f"{_short(sp.get('bytes_per_token', 0) / 2**20)} MiB · "
            f"{_short(sp.get('ms_per_token', 0))} ms",
        )
        gain = sp.get("speedup")
        self._set("spec_gain", "—" if gain is None else f"≈{gain:.2f}x")

    def show_ranks(self, d: dict | None) -> None:
        """Per-rank figures of a distributed reply (its stats' `distributed`); None: hide."""
        shown = bool(d and d.get("per_rank"))
        self.query_one("#ranks-title").display = shown
        box = self.query_one("#ranks", Static)
        box.display = shown
        if not shown:
            return
        lines = [
            f"rank {r['rank']}  {fmt_pct(r.get('owned_fraction'))} of experts\n"
            f"  {fmt_mib(r.get('requested_mib_per_token'))}/tok · hit {fmt_pct(r.get('hit_rate'))}\n"
            f"  all_sum {r.get('all_sum_ms_per_token') or 0.0:.1f} ms/tok"
            for r in d["per_rank"]
        ]
        lines.append(f"total {fmt_mib(d.get('total_requested_mib_per_token'))}/tok")
        text = "\n".join(lines)
        self.shown["ranks"] = text
        box.update(text)

    k_control = child(KSlider)

    def follow_k(self, s: StatsSample, decoding: bool) -> bool:
        """Move the K control to the K the engine decodes with (a token's K), unless the
        user has just moved it: a sample taken before the change reached the engine would
        undo it on screen. Idle samples may predate a K set between replies. True when
        the control moved."""
        control = self.k_control
        recent = time.monotonic() - control.user_changed_at < K_ECHO_GRACE_S
        if decoding and s.k and control.num_experts and s.k != control.k and not recent:
            control.set_k(s.k, notify=False)
            return True
        return False

    def clear_history(self) -> None:
        """The sparklines start again: a request is about to go (its samples are this
        conversation's from now on), or another conversation starts."""
        self._between = False
        self.decode_history.clear()
        self.ssd_history.clear()
        self.mass_history.clear()
        self._last_generated = 0
        self.query_one("#spark-decode", Sparkline).data = []
        self.query_one("#spark-ssd", Sparkline).data = []
        self.query_one("#spark-mass", Sparkline).data = []
