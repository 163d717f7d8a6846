"""Messages between the engine thread and its clients (the TUI, the CLI, tests).

The engine thread owns every MLX call. Clients send *commands* through
`EngineService.submit()` and receive *events* through the `post` callback given to
the service; the callback is called on the engine thread and must not block
(Textual's `App.post_message` / `call_soon_threadsafe` are fine, a queue is fine).
Everything here is plain data: no MLX arrays, no Textual objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from ssdmoe_tui.options import (
    SamplingOptions,
    Speculation,
    parse_draft_depth,
    parse_speculate,
)

Phase = Literal["idle", "loading", "indexing", "prefill", "decoding", "saving"]


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class LoadModel:
    """Load (or switch to) a model. Every value and the model's header are checked
    first: a bad one is an EngineError with `fatal=False` and the model loaded before
    stays loaded and usable. Only then is the previous model unloaded."""

    path: str
    k: int | None = None  # None: the model's trained K
    prefill_k: int | None = None  # None: same as k
    expert_cache: str = "auto"  # "auto", "512M", "4G", or bytes as a string
    dtype: str | None = None  # None: backend default (float32 on CPU, bfloat16 on GPU)


@dataclass(frozen=True)
class Generate:
    """Generate a reply to `prompt_tokens`.

    The engine takes token ids only: the caller turns messages into ids
    (`ssdmoe_tui.prompting.chat_format`, or a store's exact history: `sessions/turns.py`,
    `server/prompts.py`). `k`: experts per token for this generation (None: the K the
    engine runs with); it travels with the request, so a queued request cannot pick up
    another's K.
    """

    request_id: str
    prompt_tokens: tuple[int, ...] = ()
    # How the reply is sampled (checked where it was built: the server's schema, the
    # app's settings, the CLI); engine/run/sampling.py turns it into mlx-lm's sampler.
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    session_id: str | None = None  # lets the engine pick the right cached KV state
    k: int | None = None  # experts per token from this reply's first token on (None: as set)
    # speculative decoding (engine/spec): off | auto | ngram | mtp; None: the service's
    # setting (`serve --speculate`); `draft_depth` None: the governor chooses
    speculate: str | None = None
    draft_depth: int | None = None

    def speculation(self, default: Speculation) -> Speculation:
        """This request's speculation (checked: one line naming a bad value)."""
        if self.speculate is None:
            if self.draft_depth is None:
                return default
            return replace(default, depth=parse_draft_depth(self.draft_depth))
        spec = parse_speculate(self.speculate, depth=parse_draft_depth(self.draft_depth))
        # `serve --exact-verify` is the service's: a request that drafts verifies exactly
        return replace(spec, exact=default.exact) if spec.on else spec


@dataclass(frozen=True)
class SetExpertCache:
    """Reload the loaded model with another budget (a bad size keeps the model as it is)."""

    size: str  # "auto", "512M", "4G", ...


@dataclass(frozen=True)
class SetK:
    """Experts per token from the next token on (not queued behind a running reply).
    The Runner owns K; StatsSample.k and `EngineService.model_info` report it."""

    k: int


@dataclass(frozen=True)
class WarmExperts:
    """Read these experts into the expert cache in the background while the engine is
    idle (warm resume): per MoE layer, expert ids, most recent first, as a KV
    checkpoint's saved working set holds them. Any later command stops it (the chunk
    being read finishes first); a new WarmExperts replaces it. Ids out of range for the
    loaded model are dropped with one Notice. Answered by ExpertsWarmed."""

    working_set: tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Shutdown:
    pass


Command = LoadModel | Generate | SetExpertCache | SetK | WarmExperts | Shutdown


# --------------------------------------------------------------------------- events


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    model_type: str
    num_layers: int  # MoE layers
    num_experts: int
    trained_k: int
    k: int
    prefill_k: int
    max_context: int
    device: str  # "cpu", "gpu/Metal", "gpu/CUDA"
    dtype: str
    expert_bytes: int  # bytes of one expert (all components)
    resident_bytes: int  # non-expert weights in memory
    expert_cache_budget: int
    reader: str  # "native" or "python"
    fingerprint: str  # identifies the exact weights (index key + config); KV checkpoints carry it
    hybrid: bool  # recurrent state (Mamba / linear attention): KV caches cannot be trimmed
    expert_source: str = "shards"  # or "repacked" (`ssdmoe repack`'s aligned copy)
    expert_source_note: str = ""  # why a repacked copy present was not used
    slot_placement: str = "none"  # MLX-CUDA only: "host" or "managed"
    # The URL of the `ssdmoe serve` that holds the model, for a client attached to one
    # (chat/remote.py); "" when this process's engine holds it.
    server: str = ""


@dataclass(frozen=True)
class ModelLoaded:
    info: ModelInfo
    # The model's tokenizer (a Hugging Face one behind mlx-lm's wrapper; no MLX calls):
    # callers template their messages into the ids a Generate carries.
    tokenizer: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class PhaseChanged:
    phase: Phase
    done: int = 0  # progress, e.g. prompt tokens processed
    total: int = 0
    detail: str = ""


@dataclass(frozen=True)
class StatsSample:
    """Posted at least 4x a second while generating, and once after each turn."""

    decode_tok_s: float
    prefill_tok_s: float
    ssd_mib_per_token: float  # device bytes (not page-cache hits) per decoded token
    requested_mib_per_token: float  # bytes the engine asked for per token
    expert_cache_hit_rate: float  # 0..1, this turn
    expert_cache_used_bytes: int
    expert_cache_budget_bytes: int
    resident_bytes: int
    kv_cache_bytes: int
    rss_bytes: int
    peak_rss_bytes: int
    peak_memory_bytes: int  # MLX peak
    kv_hit_rate: float  # prompt tokens served from cache / prompt tokens, this turn
    context_tokens: int
    max_context: int
    k: int
    generated_tokens: int
    # Router probability mass kept at the running K over the mass at the trained K (mean
    # over MoE layers; 1.0 at the trained K; engine/model/routing_mass.py): this turn's mean and
    # the last token's. None before the first generated token.
    routing_mass: float | None = None
    routing_mass_last: float | None = None
    # speculative decoding this turn (engine/spec/verify.SpecStats.as_dict: acceptance,
    # tokens per pass, bytes and ms per token); None: the turn does not speculate
    speculation: dict | None = None


@dataclass(frozen=True)
class Tokens:
    """A batch of streamed text; posted at most every ~25 ms."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class GenerationDone:
    request_id: str
    text: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    finish_reason: Literal["stop", "length", "cancelled", "error"]
    k_per_token: tuple[int, ...]  # K actually used by each generated token
    stats: dict = field(default_factory=dict)
    # A server's reply (the app's remote engine): the tool calls its API returned, each
    # {"id", "name", "arguments"}. The local engine leaves it empty: its calls are text.
    tool_calls: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class EngineError:
    """A one-line, user-facing error. `request_id` is set when a generation failed."""

    message: str
    request_id: str | None = None
    fatal: bool = False  # True: no model is loaded now (until another LoadModel succeeds)


@dataclass(frozen=True)
class Notice:
    """Something the user should know that is not an error (e.g. a checkpoint was ignored)."""

    message: str


@dataclass(frozen=True)
class ExpertsWarmed:
    """A WarmExperts has ended: experts asked for, already resident, read from disk,
    left out for want of room; `cancelled`: another command stopped it first."""

    requested: int
    resident: int
    read: int
    no_room: int
    bytes_read: int
    seconds: float
    cancelled: bool = False
    error: str = ""


@runtime_checkable
class EngineClient(Protocol):
    """An engine as its clients drive it, declared once: the in-process
    `engine.run.service.EngineService` and the chat's `chat.remote.RemoteEngine` (a
    running `ssdmoe serve`, for `--attach`) implement it; the chat controller and the
    server take any engine that does. tests/test_engine_contract.py runs one contract
    over both.

    Events come out through the `post` callback given to the engine when it is made, on
    a thread of the engine's own, in order; `post` must not block. Every request that
    starts ends with one GenerationDone carrying its request_id (a refused one: an
    EngineError carrying it)."""

    # True: a reply is asked as chat messages (`chat.remote.ChatTurn`), since the engine
    # owns its tokenizer and templates; False: as token ids (`Generate`).
    takes_messages: bool

    def start(self) -> None:
        """Start the engine's thread (idempotent); an engine that attaches posts
        ModelLoaded once attached, one that loads waits for a LoadModel."""

    def submit(self, command: Any) -> None:
        """Queue a command (a `Command`, or a ChatTurn where `takes_messages`); never
        blocks. A SetK applies from the next token (or the next request)."""

    def cancel(self, request_id: str | None = None) -> None:
        """Stop a reply between two tokens: this request's, or every one (None)."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop everything and end the engine's threads, waiting at most `timeout`."""


Event = (
    ModelLoaded
    | PhaseChanged
    | StatsSample
    | Tokens
    | GenerationDone
    | EngineError
    | Notice
    | ExpertsWarmed
)
