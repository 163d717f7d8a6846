"""What an engine is opened with, parsed and validated once, at the edge.

Every command that loads a model (`chat`, `generate`, `bench`, `repack`, the server)
builds one `EngineOptions` from its arguments or the config, through the parsers
here (argparse definitions in `commands/common.py` wrap them), and hands it to
`engine.open.open_engine`. A bad value fails here with one line naming it, before
anything is loaded or unloaded; only checks that need the model's own header (K
against its expert count) wait for `open.plan_engine`, which still runs before the
current model is dropped. Nothing here imports MLX.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields, replace

from ssdmoe_tui.errors import BadValueError

DTYPES = ("float32", "bfloat16", "float16")
READERS = ("auto", "native", "python")
EXPERT_SOURCES = ("auto", "shards", "repacked")
SEED_MAX = 2**64 - 1  # MLX takes an unsigned 64-bit seed

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.I)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def server_url(text: str, what: str = "attach") -> str:
    """`http://HOST:PORT` of an `ssdmoe serve` (the scheme may be left out; a path such as
    `/v1` and any user info are dropped). The one parser of a server's address: the
    `--attach` flag, the app's remote engine and a lock claim's advertised URL."""
    from urllib.parse import urlsplit

    value = str(text).strip()
    try:  # urllib refuses some hosts outright ('[::1' unclosed, '[zz]' no address)
        parts = urlsplit(value if "://" in value else "http://" + value)
        port = parts.port
        host = parts.hostname
    except ValueError:
        port = host = None
    if port is None or not host or parts.scheme != "http":
        raise BadValueError(f"{what}: {text!r} is not a server URL (http://HOST:PORT)")
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def is_loopback_url(url: str) -> bool:
    """Whether a server URL (as `server_url` writes it) names this machine's loopback:
    `localhost`, 127.0.0.0/8 or ::1. A lock claim may only advertise such a URL, and the
    app sends `$SSDMOE_API_KEY` on its own only there."""
    import ipaddress
    from urllib.parse import urlsplit

    try:
        host = urlsplit(url).hostname or ""
    except ValueError:  # not a URL urllib can split: no loopback of ours
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_bytes(text: str | int, what: str = "size") -> int:
    """'512M', '4G', '1.5GiB', '123456', '1e-30' -> bytes (>= 0, finite). One line on error."""
    if isinstance(text, bool):
        raise BadValueError(f"{what} {text!r} is not a size (use e.g. 512M, 4G or auto)")
    if isinstance(text, int):
        if text < 0:
            raise BadValueError(f"{what} {text} is negative")
        return text
    if str(text).strip().startswith("-"):
        raise BadValueError(f"{what} {text!r} is negative")
    m = _SIZE.match(str(text))
    if m is None:
        raise BadValueError(f"{what} {text!r} is not a size (use e.g. 512M, 4G or auto)")
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if not math.isfinite(value) or value >= 2**63:
        raise BadValueError(f"{what} {text!r} is too large")
    return int(value)


@dataclass(frozen=True)
class CacheBudget:
    """The expert cache budget: `auto` (from free memory) or a number of bytes.

    A budget below the model's minimum (K x MoE layers slots) is raised to it when the
    model opens, and `open_engine` says so once, with both numbers."""

    bytes: int | None = None  # None: auto
    text: str = "auto"  # as the user wrote it, for messages and settings

    @property
    def auto(self) -> bool:
        return self.bytes is None

    @classmethod
    def parse(cls, text: str | int | CacheBudget | None) -> CacheBudget:
        if isinstance(text, CacheBudget):
            return text
        if text is None or (isinstance(text, str) and text.strip().lower() == "auto"):
            return cls()
        return cls(parse_bytes(text, "expert cache"), str(text).strip())

    def __str__(self) -> str:
        return self.text


def _whole(text: str | int, what: str) -> int:
    if isinstance(text, bool):
        raise BadValueError(f"{what} must be a whole number, got {text!r}")
    if isinstance(text, int):
        return text
    try:
        return int(str(text).strip())
    except ValueError:
        raise BadValueError(f"{what} must be a whole number, got {text!r}") from None


def parse_positive(text: str | int, what: str) -> int:
    value = _whole(text, what)
    if value < 1:
        raise BadValueError(f"{what} must be at least 1, got {value}")
    return value


def parse_k(text: str | int, what: str = "K") -> int:
    """Experts per token: >= 1 here; <= the model's experts is checked on its header."""
    return parse_positive(text, what)


def check_k(k: int | None, num_experts: int, what: str = "K") -> None:
    """The one range check of K against a model (its header-only index gives `num_experts`)."""
    if k is not None and not 1 <= k <= num_experts:
        raise BadValueError(f"{what}={k} is outside 1..{num_experts} for this model")


def parse_seed(text: str | int) -> int:
    value = _whole(text, "seed")
    if not 0 <= value <= SEED_MAX:
        raise BadValueError(f"seed must be 0..2**64-1, got {value}")
    return value


def _finite(text: str | float, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise BadValueError(f"{what} must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise BadValueError(f"{what} must be a finite number, got {text!r}")
    return value


def parse_seconds(text: str | float, what: str, most: float = 7 * 86400) -> float:
    """A positive, finite duration; `most` keeps it within what socket and thread
    timeouts accept (1e300 s would overflow them)."""
    value = _finite(text, what)
    if not 0 < value <= most:
        raise BadValueError(f"{what} must be a number of seconds in (0, {most:g}], got {text!r}")
    return value


def parse_temp(text: str | float) -> float:
    value = _finite(text, "temperature")
    if value < 0:
        raise BadValueError(f"temperature must be >= 0, got {value:g}")
    return value


def parse_top_p(text: str | float) -> float:
    value = _finite(text, "top-p")
    if not 0.0 <= value <= 1.0:
        raise BadValueError(f"top-p must be within 0..1 (0: off), got {value:g}")
    return value


def parse_choice(text: str, choices: tuple[str, ...], what: str) -> str:
    if text not in choices:
        raise BadValueError(f"{what} {text!r}: use one of {', '.join(choices)}")
    return text


def env_choice(name: str, choices: tuple[str, ...], default: str = "auto") -> str:
    """`$name`, lower-cased (unset or blank: `default`), one of `choices`: the engine's
    mode switches (`SSDMOE_PIPELINE`, `SSDMOE_QMM_PAD`, ...), each one clear line naming
    the variable for a bad value."""
    text = os.environ.get(name, "").strip().lower() or default
    if text not in choices:
        raise BadValueError(f"{name}={text!r}: use one of {', '.join(choices)}")
    return text


def check_text(text: str, what: str = "the prompt") -> str:
    """Text that the tokenizer can take: argv decodes undecodable bytes to lone
    surrogates (PEP 383), which tokenizers reject with a bare TypeError."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = text[e.start]
        if 0xDC80 <= ord(ch) <= 0xDCFF:  # an undecodable byte from argv (surrogateescape)
            where = f"byte 0x{ch.encode('utf-8', 'surrogateescape').hex()}"
        else:  # a lone surrogate that came in as text (e.g. JSON "\ud800")
            where = f"lone surrogate U+{ord(ch):04X}"
        raise BadValueError(f"{what} is not valid UTF-8 ({where} at character {e.start})") from None
    return text


def decode_text(data: bytes, what: str = "the prompt") -> str:
    """Bytes read from stdin or a file -> text, or one line naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadValueError(
            f"{what} is not valid UTF-8 (byte 0x{data[e.start : e.start + 1].hex()} at offset "
            f"{e.start})"
        ) from None


@dataclass(frozen=True)
class SamplingOptions:
    """How one reply is sampled, built once at each edge (the server's request schema,
    the app's generation settings, the CLI's flags), checked like the engine options,
    and carried by `protocol.Generate`. `engine/run/sampling.py` turns it into mlx-lm's
    sampler and logits processors: a new setting touches the edge, this and that
    factory. `stop` strings are cut from the text by the caller that shows it (the
    server's output filter); the engine stops at max tokens and end of sequence."""

    max_tokens: int = 256
    temp: float = 0.0
    top_p: float = 0.0
    seed: int | None = None
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    # mlx-lm's logits processors (over the last 20 tokens); None: off
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", tuple(self.stop))  # a list from JSON (the link)
        parse_positive(self.max_tokens, "max tokens")
        parse_temp(self.temp)
        parse_top_p(self.top_p)
        if self.seed is not None:
            parse_seed(self.seed)
        if self.top_k < 0:
            raise BadValueError(f"top-k must be >= 0 (0: off), got {self.top_k}")
        if not 0.0 <= _finite(self.min_p, "min-p") <= 1.0:
            raise BadValueError(f"min-p must be within 0..1 (0: off), got {self.min_p:g}")
        if self.repetition_penalty is not None and _finite(self.repetition_penalty,
                                                           "repetition penalty") <= 0:  # fmt: skip
            raise BadValueError(f"repetition penalty must be > 0, got {self.repetition_penalty:g}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if v is not None:
                _finite(v, name.replace("_", " "))

    # OpenAI's name for a setting where it differs (the server's schema, a remote engine's
    # request body); every other setting has the same name there.
    API_NAMES = {"temp": "temperature"}

    def as_request(self) -> dict:
        """These settings as an OpenAI-style request body takes them: max tokens and
        temperature always, every other setting only where it is not its default (so a
        server's own defaults stay in force)."""
        body: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("max_tokens", "temp") or value != f.default:
                body[self.API_NAMES.get(f.name, f.name)] = (
                    list(value) if f.name == "stop" else value
                )
        return body

    def penalties(self) -> dict:
        """The penalties as mlx-lm's `make_logits_processors` takes them (set ones only)."""
        names = ("repetition_penalty", "presence_penalty", "frequency_penalty")
        return {n: getattr(self, n) for n in names if getattr(self, n) not in (None, 0, 0.0)}


@dataclass(frozen=True)
class EngineOptions:
    """Everything `open_engine` needs, typed. Built once per command; the service
    derives a load's options from it with `with_` (a `dataclasses.replace`, so checked again)."""

    model: str = ""  # folder, Hub repo id[@revision], or "" for the embedded demo model
    k: int | None = None  # None: the model's trained K
    prefill_k: int | None = None  # None: same as k
    expert_cache: CacheBudget = field(default_factory=CacheBudget)
    dtype: str | None = None  # None: float32 on CPU, bfloat16 on GPU
    reader: str = "auto"
    direct_io: bool = False
    experts: str = "auto"  # where expert bytes come from (see engine.loader)
    prefetch: bool = False
    policy: str = "auto"
    prefill_step: int | None = None  # None: from free memory (Runner)
    queue_depth: int = 16
    routing_trace: str | None = (
        None  # route by this recorded trace (engine/policy/trace_routing.py)
    )

    def __post_init__(self) -> None:
        # Programmatic callers (tests, the server, the protocol) get the same checks as the CLI.
        if not isinstance(self.expert_cache, CacheBudget):
            object.__setattr__(self, "expert_cache", CacheBudget.parse(self.expert_cache))
        for name in ("k", "prefill_k"):
            value = getattr(self, name)
            if value is not None:
                parse_k(value, "prefill K" if name == "prefill_k" else "K")
        if self.dtype is not None:
            parse_choice(self.dtype, DTYPES, "dtype")
        parse_choice(self.reader, READERS, "reader")
        parse_choice(self.experts, EXPERT_SOURCES, "experts")
        if self.prefill_step is not None:
            parse_positive(self.prefill_step, "prefill step")
        parse_positive(self.queue_depth, "queue depth")
        # the policy name is the engine's to check (`policies.parse_policy`): the CLI
        # checks it as it parses, `plan_engine` before any model is touched

    def with_(self, **changes) -> EngineOptions:
        return replace(self, **changes)


SPECULATE_MODES = ("off", "auto", "ngram", "mtp")  # what users pick; the bench adds oracle
# and none: a drafter that never drafts (the speculative loop's own cost against plain)
BENCH_MODES = ("oracle", "none")
MAX_DRAFT_DEPTH = 8


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding of one turn (engine/spec): where drafts come from, and the
    draft depth (None: the governor prices each round; a number: that many drafts every
    round they are on offer). `p`: the oracle's acceptance (bench only). `exact`
    (`--exact-verify`): each verify chunk computed in one-token decode's shapes
    (engine/spec/exact.py), so its tokens are decode's on a device whose kernels depend
    on the row count (MLX-CUDA, Metal); on the CPU they already are."""

    mode: str = "off"  # off | auto | ngram | mtp | oracle
    depth: int | None = None
    p: float = 1.0
    exact: bool = False

    def __post_init__(self) -> None:
        parse_choice(self.mode, (*SPECULATE_MODES, *BENCH_MODES), "--speculate")
        if self.depth is not None:
            check_draft_depth(self.depth)
        if not 0.0 <= self.p <= 1.0:
            raise BadValueError(
                f"--speculate oracle:{self.p:g}: the acceptance must be within 0..1"
            )
        if self.exact and not self.on:
            raise BadValueError(EXACT_NEEDS_SPECULATE)

    @property
    def on(self) -> bool:
        return self.mode != "off"

    def __str__(self) -> str:
        mode = f"oracle:{self.p:g}" if self.mode == "oracle" else self.mode
        if self.exact:
            mode += " exact"
        return mode if self.depth is None or not self.on else f"{mode} (depth {self.depth})"


EXACT_NEEDS_SPECULATE = (
    "--exact-verify changes only how drafts are verified: it needs --speculate "
    "(add --speculate ngram, auto or mtp, or drop --exact-verify)"
)


def check_draft_depth(depth: int) -> int:
    if not 1 <= depth <= MAX_DRAFT_DEPTH:
        raise BadValueError(f"--draft-depth {depth} is out of range 1..{MAX_DRAFT_DEPTH}")
    return depth


def parse_draft_depth(text: str | int | None) -> int | None:
    """`auto` (or nothing): the governor chooses; else a fixed depth 1..MAX_DRAFT_DEPTH."""
    if text is None or text == "auto":
        return None
    return check_draft_depth(_whole(text, "--draft-depth"))


def parse_speculate(text: str, *, oracle: bool = False, depth: int | None = None) -> Speculation:
    """`off`, `auto`, `ngram`, `mtp`; with `oracle` (the bench) also `oracle[:P]`, P the
    acceptance as 0..1 or a percentage (`oracle:70%`), and `none` (never drafts). One
    line for anything else."""
    text = str(text).strip().lower()
    if oracle and (text == "oracle" or text.startswith("oracle:")):
        raw = text.partition(":")[2] or "1"
        try:
            p = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            raise BadValueError(
                f"--speculate {text}: P must be a number (oracle:0.7 or oracle:70%)"
            ) from None
        if not math.isfinite(p) or not 0.0 <= p <= 1.0:
            raise BadValueError(
                f"--speculate {text}: the acceptance P must be within 0..1 (or 0..100%)"
            )
        return Speculation("oracle", depth, p)
    if oracle and text == "none":
        return Speculation("none", depth)
    choices = (*SPECULATE_MODES, "oracle[:P]", "none") if oracle else SPECULATE_MODES
    if text not in SPECULATE_MODES:
        raise BadValueError(f"--speculate {text!r}: use one of {', '.join(choices)}")
    return Speculation(text, depth)


def parse_speculate_list(text: str) -> list[Speculation]:
    """The bench's `--speculate`: comma-separated modes, where a bare number continues an
    oracle list (`oracle:0.3,0.5,70%` is three oracles); `off` rows are always measured."""
    out: list[Speculation] = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            raise BadValueError(f"--speculate {text!r}: an empty item")
        if out and out[-1].mode == "oracle" and (item[0].isdigit() or item[0] == "."):
            item = f"oracle:{item}"
        spec = parse_speculate(item, oracle=True)
        if spec.on:
            out.append(spec)
    if not out:
        raise BadValueError(f"--speculate {text!r}: nothing to compare with off")
    return out


def parse_depth_list(text: str) -> list[int | None]:
    """`--draft-depth` of the bench: `auto` and/or depths, comma-separated."""
    return [parse_draft_depth(t.strip()) for t in str(text).split(",")]
