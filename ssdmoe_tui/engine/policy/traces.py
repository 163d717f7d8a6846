"""Expert-routing traces: the engine's own format (write and read) plus readers for the
real traces (tests/fixtures/traces), so one simulator replays them all.

Engine format ("ssdmoe-route-trace" v1), JSON lines, gzip when the name ends in .gz:

    {"format": "ssdmoe-route-trace", "version": 1, "model": "...", "k": 8,
     "num_layers": 48, "num_experts": 128, ...}          <- header, line 1
    [token, layer, phase, [expert, ...]]                  <- one row per (token, layer)

`phase` is 0 for prefill, 1 for decode. Rows are kept in the order the engine routed
them; consecutive rows with the same (token, phase) form one step. A prefill chunk may
be one row whose experts are the union over the chunk.

Plain JSON lines ("moe-routing-jsonl", for converting other tools' traces; documented in
docs/cache-policy.md): an optional header `{"format": "moe-routing-jsonl", "num_layers":
48, "num_experts": 128, "k": 6, "model": "..."}`, then one object per (token, layer):
`{"token": 17, "layer": 3, "experts": [5, 9, ...], "phase": "decode"}` (`phase`
"prefill" or "decode", default "decode"). All prefill rows of a turn form one step, read
as one chunk per layer (their union), as the engine reads a prompt.

Every reader bounds layer and expert ids by the header (or, without one, by
`MAX_LAYERS` / `MAX_EXPERTS`) and rejects negative ids, non-integer K and a truncated
last line with one line naming the file and line.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from ssdmoe_tui.atomic import private_dirs
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.user_files import check_regular, open_regular

FORMAT = "ssdmoe-route-trace"
VERSION = 1
JSONL_FORMAT = "moe-routing-jsonl"
PREFILL, DECODE = 0, 1
MAX_LAYERS = 4096  # sane caps when a trace does not say its shape
MAX_EXPERTS = 65536


@dataclass
class TraceMeta:
    model: str = ""
    k: int = 0
    num_layers: int = 0
    num_experts: int = 0
    source: str = FORMAT  # which reader produced it
    note: str = ""  # caveat to show the user, if any
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class TraceStep:
    """One token (or prefill chunk): the experts each layer selected, in routing order."""

    token: int
    phase: int  # PREFILL or DECODE
    layers: list[tuple[int, tuple[int, ...]]]  # (layer, experts) in the order routed
    # A prefill step read as one chunk (the union above) keeps its tokens' own routing
    # here, token by token, where the trace recorded it per token (route CSV, plain JSON
    # lines); None where it has one row for the chunk. trace_routing.py routes a chunk
    # shorter than both the trace's prompt and its own prompt's prefill by them.
    parts: list[list[tuple[int, tuple[int, ...]]]] | None = None


@dataclass
class Trace:
    meta: TraceMeta
    steps: list[TraceStep]

    def decode_steps(self) -> int:
        return sum(1 for s in self.steps if s.phase == DECODE)

    def head(self, decode_steps: int) -> Trace:
        """The trace up to its first `decode_steps` decode steps (prefill kept): the
        same recording, shorter, to see what more history buys a policy."""
        out: list[TraceStep] = []
        seen = 0
        for s in self.steps:
            if s.phase == DECODE:
                if seen >= decode_steps:
                    break
                seen += 1
            out.append(s)
        return Trace(self.meta, out)

    def first_layers(self, n: int) -> Trace:
        """The trace of its first `n` MoE layers only: real routing for a shallower
        checkpoint of the same experts (bench-quick's trace row: 8 of 48 layers)."""
        if not 1 <= n <= self.meta.num_layers:
            raise BadValueError(f"cannot keep {n} of the trace's {self.meta.num_layers} layers")
        meta = replace(self.meta, num_layers=n)
        steps = [
            TraceStep(
                s.token,
                s.phase,
                [(la, ids) for la, ids in s.layers if la < n],
                None if s.parts is None else [[(la, i) for la, i in p if la < n] for p in s.parts],
            )
            for s in self.steps
        ]
        return Trace(meta, steps)

    def rows(self, b: int, only: int | None = None) -> Trace:
        """`b` sequences decoding together, each following this trace's decode steps from
        its own offset (`decode_steps() * i // b`, wrapping), as `bench --batch` routes its
        rows (scripts/batch_bench.py): each decode step becomes one step whose layers hold
        the rows' union, in row order, what a batched pass asks the cache for. Prefill
        steps are kept once, where they are (every row's prompt routes to the same prefill
        union). `only`: row `only` alone, over the same steps (its one-sequence baseline)."""
        if b < 1:
            raise BadValueError(f"rows must be >= 1, got {b}")
        if only is not None and not 0 <= only < b:
            raise BadValueError(f"row {only} is not one of {b}")
        decode = [s for s in self.steps if s.phase == DECODE]
        if (b == 1 and not only) or not decode:
            return self
        n = len(decode)
        offsets = [n * i // b for i in range(b)]
        if only is not None:
            offsets = [offsets[only]]
        steps = []
        t = 0  # decode steps so far
        for step in self.steps:
            if step.phase != DECODE:
                steps.append(step)
                continue
            cells: dict[int, dict[int, None]] = {}
            for o in offsets:
                for layer, ids in decode[(o + t) % n].layers:
                    cells.setdefault(layer, {}).update(dict.fromkeys(ids))
            layers = [(la, tuple(ids)) for la, ids in cells.items()]
            steps.append(TraceStep(step.token, DECODE, layers))
            t += 1
        return Trace(self.meta, steps)


# --------------------------------------------------------------------------- writer


class _Text(io.TextIOWrapper):
    """UTF-8 text over a (gzip) stream that also closes the file under it (GzipFile
    leaves a file object it was given open)."""

    def __init__(self, stream: IO[bytes], under: IO[bytes]) -> None:
        super().__init__(stream, encoding="utf-8")
        self._under = under

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._under.close()


def _open_text(path: Path, mode: str) -> IO[str]:
    """Text of a trace. Reading opens regular files only (a FIFO or /dev/zero as a trace
    is refused by name rather than blocking or reading forever); writing creates the file
    0600 (a trace follows the prompts it was recorded on)."""
    if mode == "r":
        raw: IO[bytes] = open_regular(path)
    else:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
        raw = os.fdopen(os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600), mode + "b")
    if path.suffix == ".gz":
        return _Text(gzip.GzipFile(fileobj=raw, mode=mode + "b"), raw)  # type: ignore[arg-type]
    return io.TextIOWrapper(raw, encoding="utf-8")


class TraceWriter:
    """Appends routing rows as the engine runs: `add()` once per (token, layer).

    Cheap enough for the decode loop (one short line per layer); `close()` flushes.
    """

    def __init__(self, path: str | Path, meta: TraceMeta | Mapping[str, Any]) -> None:
        if isinstance(meta, TraceMeta):
            header = {k: v for k, v in asdict(meta).items() if k not in ("source", "extra")}
            header.update(meta.extra)
        else:
            header = dict(meta)
        header = {"format": FORMAT, "version": VERSION, **header}
        self.path = Path(path)
        try:
            if self.path.exists() and not self.path.is_file():
                raise OSError(f"{self.path} is not a regular file")
            private_dirs(self.path.parent)
            self._f: IO[str] | None = _open_text(self.path, "w")
            self._f.write(json.dumps(header, separators=(",", ":")) + "\n")
            self._f.flush()
        except OSError as e:
            raise BadValueError(f"cannot write trace {self.path}: {_why(e)}") from None
        self.rows = 0

    def add(self, token_idx: int, layer: int, experts: Iterable[int], phase: int = DECODE) -> None:
        if self._f is None:
            raise ValueError(f"trace {self.path} is closed")
        ids = experts.tolist() if hasattr(experts, "tolist") else list(experts)  # type: ignore[union-attr]
        ids = ",".join(str(int(e)) for e in ids)
        try:
            self._f.write(f"[{int(token_idx)},{int(layer)},{int(phase)},[{ids}]]\n")
        except OSError as e:
            raise BadValueError(f"cannot write trace {self.path}: {_why(e)}") from None
        self.rows += 1

    def flush(self) -> None:
        if self._f is not None:
            try:
                self._f.flush()
            except OSError as e:
                raise BadValueError(f"cannot write trace {self.path}: {_why(e)}") from None

    def close(self) -> None:
        if self._f is not None:
            f, self._f = self._f, None
            try:
                f.close()
            except OSError as e:
                raise BadValueError(f"cannot write trace {self.path}: {_why(e)}") from None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _why(e: OSError) -> str:
    return e.strerror or str(e)


# --------------------------------------------------------------------------- readers


class _Steps:
    """Groups consecutive rows with the same (token, phase) into steps; bounds the ids.

    `union_prefill`: all prefill rows up to the next decode row form one step whose
    layers hold the union of their experts (first-seen order): one chunk, as the engine
    reads a prompt; its `parts` keep each token's own rows.
    """

    def __init__(
        self, path: Path, num_layers: int = 0, num_experts: int = 0, union_prefill: bool = False
    ) -> None:
        self.steps: list[TraceStep] = []
        self._cur: tuple[int, int] | None = None
        self._path = path
        self._max_layers = num_layers if num_layers > 0 else MAX_LAYERS
        self._max_experts = num_experts if num_experts > 0 else MAX_EXPERTS
        self._union = union_prefill
        self._prefill: dict[int, dict[int, None]] | None = None
        # each prompt token's rows: a run of consecutive rows with one token value (a
        # converter may repeat a value, e.g. vocabulary ids: runs, not values, are tokens)
        self._parts: list[list[tuple[int, tuple[int, ...]]]] = []
        self._part_token: int | None = None

    def add(
        self, token: int, phase: int, layer: int, experts: tuple[int, ...], where: int | str = "?"
    ) -> None:
        if not 0 <= layer < self._max_layers:
            raise _bad(self._path, where, f"layer {layer} is outside 0..{self._max_layers - 1}")
        for e in experts:
            if not 0 <= e < self._max_experts:
                raise _bad(self._path, where, f"expert {e} is outside 0..{self._max_experts - 1}")
        if self._union and phase == PREFILL:
            if self._prefill is None:
                self._prefill = {}
                self._cur = None
                self.steps.append(TraceStep(token, PREFILL, []))
            self._prefill.setdefault(layer, {}).update(dict.fromkeys(experts))
            if not self._parts or token != self._part_token:
                self._parts.append([])
                self._part_token = token
            self._parts[-1].append((layer, experts))
            return
        self._close_prefill()
        if self._cur != (token, phase):
            self._cur = (token, phase)
            self.steps.append(TraceStep(token, phase, []))
        self.steps[-1].layers.append((layer, experts))

    def _close_prefill(self) -> None:
        if self._prefill is not None:
            step = next(s for s in reversed(self.steps) if s.phase == PREFILL)
            step.layers = [(la, tuple(ids)) for la, ids in sorted(self._prefill.items())]
            step.parts = self._parts
            self._prefill = None
            self._parts, self._part_token = [], None

    def done(self) -> list[TraceStep]:
        self._close_prefill()
        return self.steps


def read_trace(path: str | Path) -> Trace:
    """Read any supported trace; the format is recognised from its first line."""
    path = Path(path)
    try:
        check_regular(path)
    except FileNotFoundError:
        raise BadValueError(f"trace not found: {path}") from None
    except OSError as e:  # a folder, a FIFO, a device, a link loop: say which
        raise BadValueError(f"cannot read trace {path}: {e.strerror or e}") from None
    try:
        with _open_text(path, "r") as f:
            first = f.readline()
    except UnicodeDecodeError as e:  # Python's codec text names bytes, not the problem
        raise BadValueError(
            f"cannot read trace {path}: not UTF-8 text (byte {e.start} of its first line)"
        ) from None
    except (OSError, EOFError) as e:
        raise BadValueError(f"cannot read trace {path}: {e}") from None
    try:
        head = json.loads(first)
    except (json.JSONDecodeError, RecursionError):  # nested too deeply: not a header
        head = None
    try:
        if first.startswith("# route_trace"):
            return _read_route_csv(path)
        if isinstance(head, dict) and head.get("format") == FORMAT:
            return _read_engine(path)
        if isinstance(head, dict) and head.get("type") == "meta":
            return _read_vllm_routes(path)
        if isinstance(head, dict) and (
            head.get("format") == JSONL_FORMAT or ("experts" in head and "layer" in head)
        ):
            return _read_jsonl(path)
    except (OSError, UnicodeDecodeError, EOFError, RecursionError) as e:
        why = _why(e) if isinstance(e, OSError) else _NOT_OS.get(type(e), type(e).__name__)
        raise BadValueError(f"cannot read trace {path}: {why}") from None
    raise BadValueError(
        f"unrecognised trace format: {path} (expected an ssdmoe trace, a route_trace v1 CSV, "
        f"a vLLM moe_routes.jsonl or {JSONL_FORMAT} lines)"
    )


_NOT_OS = {
    UnicodeDecodeError: "not UTF-8 text",
    EOFError: "cut short (a compressed trace that ends early)",
    RecursionError: "nested too deeply",
}


def _bad(path: Path, lineno: int | str, why: str) -> BadValueError:
    return BadValueError(f"bad trace row at {path}:{lineno}: {why}")


def _int(value: Any, path: Path, lineno: int | str, what: str, *, minimum: int = 0) -> int:
    """A JSON integer (not a bool, float or string) >= minimum, else one line."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(path, lineno, f"{what} must be an integer, got {value!r:.40}")
    if value < minimum:
        raise _bad(path, lineno, f"{what} must be >= {minimum}, got {value}")
    return value


def _ids(value: Any, path: Path, lineno: int | str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise _bad(path, lineno, f"experts must be a list of integers, got {value!r:.40}")
    return tuple(_int(e, path, lineno, "expert id") for e in value)


def _lines(path: Path) -> list[str]:
    """The file's lines; a last line without its newline was cut short: one error."""
    with _open_text(path, "r") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1].strip():
        raise _bad(
            path,
            len(lines),
            "truncated last line (no newline: the recording was cut short); "
            "delete that line to replay the rest",
        )
    return lines


def _json_objects(path: Path, lines: list[str]) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; anything but a JSON object is one
    line naming the file and line."""
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise _bad(path, i, getattr(e, "msg", "nested too deeply")) from None
        if not isinstance(row, dict):
            raise _bad(path, i, "expected a JSON object")
        yield i, row


def _check_shape(meta: TraceMeta, path: Path, where: int | str = 1) -> TraceMeta:
    """A header's numbers bounded as row values are: layers and experts by the caps a
    trace without a header gets, K by the experts (a header of 10**12 layers was an
    allocation that ended in "out of memory: lower the expert cache")."""
    for key, value, hi in (
        ("num_layers", meta.num_layers, MAX_LAYERS),
        ("num_experts", meta.num_experts, MAX_EXPERTS),
        ("k", meta.k, meta.num_experts or MAX_EXPERTS),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
            raise _bad(path, where, f"header {key!r} must be an integer in 0..{hi}, got {value}")
    return meta


def _header_meta(header: dict, path: Path, **defaults: Any) -> TraceMeta:
    def num(key: str) -> int:
        return _int(header.get(key, 0), path, 1, f"header {key!r}")

    meta = TraceMeta(
        model=str(header.get("model", "")),
        k=num("k"),
        num_layers=num("num_layers"),
        num_experts=num("num_experts"),
        note=str(header.get("note", "")),
        **defaults,
    )
    return _check_shape(meta, path)


def _read_engine(path: Path) -> Trace:
    lines = _lines(path)
    header = json.loads(lines[0])
    if header.get("version") != VERSION:
        raise BadValueError(f"{path}: trace version {header.get('version')} is not {VERSION}")
    known = {"format", "version", "model", "k", "num_layers", "num_experts", "note"}
    meta = _header_meta(header, path, extra={k: v for k, v in header.items() if k not in known})
    steps = _Steps(path, meta.num_layers, meta.num_experts)
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            t, layer, phase, experts = json.loads(line)
        except (json.JSONDecodeError, ValueError, TypeError, RecursionError) as e:
            why = (
                e.msg
                if isinstance(e, json.JSONDecodeError)
                else "expected [token, layer, phase, [experts]]"
            )
            raise _bad(path, i, why) from None
        phase = _int(phase, path, i, "phase")
        if phase not in (PREFILL, DECODE):
            raise _bad(path, i, f"phase must be 0 (prefill) or 1 (decode), got {phase}")
        steps.add(
            _int(t, path, i, "token"),
            phase,
            _int(layer, path, i, "layer"),
            _ids(experts, path, i),
            i,
        )
    trace = Trace(meta, steps.done())
    _fill_shape(meta, trace.steps)
    return trace


def _read_jsonl(path: Path) -> Trace:
    """The documented plain layout (see the module docstring and docs/cache-policy.md)."""
    lines = _lines(path)
    meta = TraceMeta(source=JSONL_FORMAT)
    steps: _Steps | None = None
    for i, row in _json_objects(path, lines):
        if "experts" not in row:
            if i != 1 and steps is not None:
                raise _bad(path, i, "a header is only allowed on line 1")
            meta = _header_meta(row, path, source=JSONL_FORMAT)
            continue
        if steps is None:
            steps = _Steps(path, meta.num_layers, meta.num_experts, union_prefill=True)
        phase = row.get("phase", "decode")
        if phase not in ("prefill", "decode"):
            raise _bad(path, i, f'phase must be "prefill" or "decode", got {phase!r:.20}')
        steps.add(
            _int(row.get("token"), path, i, "token"),
            PREFILL if phase == "prefill" else DECODE,
            _int(row.get("layer"), path, i, "layer"),
            _ids(row["experts"], path, i),
            i,
        )
    trace = Trace(meta, steps.done() if steps else [])
    _fill_shape(meta, trace.steps)
    return trace


def _read_route_csv(path: Path) -> Trace:
    """Helldez/BigMoeOnEdge "route_trace v1": `#` preamble, then one row per routed expert."""
    meta = TraceMeta(source="route_trace v1")
    body, body_start = _route_csv_preamble(path, meta)
    # Gather (turn, phase, step) -> layer -> [(slot, expert)], keeping first-seen order.
    cells: dict[tuple[int, int, int], dict[int, list[tuple[int, int]]]] = {}
    reader = csv.DictReader(body)
    need = {"turn", "phase", "step", "layer", "slot", "expert"}
    if not reader.fieldnames or not need <= set(reader.fieldnames):
        raise BadValueError(f"{path}: route_trace header lacks {sorted(need)}")
    for n, row in enumerate(reader, start=body_start + 1):
        try:
            vals = [row[c] for c in ("turn", "phase", "step", "layer", "slot", "expert")]
            if any(v is None or not v.strip().isdigit() for v in vals):
                raise ValueError(
                    f"expected non-negative integers, got {','.join(map(str, vals)):.60}"
                )
            turn, phase, step, layer, slot, expert = (int(v) for v in vals)
        except (TypeError, ValueError) as e:
            raise _bad(path, n, str(e)) from None
        if layer >= (meta.num_layers or MAX_LAYERS) or expert >= (meta.num_experts or MAX_EXPERTS):
            raise _bad(path, n, f"layer {layer} / expert {expert} outside the trace's "
                       f"{meta.num_layers or MAX_LAYERS} layers x {meta.num_experts or MAX_EXPERTS} experts")  # fmt: skip
        cells.setdefault((turn, phase, step), {}).setdefault(layer, []).append((slot, expert))
    # Prefill positions of a turn are one chunk (each layer reads their union), as the
    # engine and BigMoeOnEdge's own replay read a prompt.
    steps = _Steps(path, meta.num_layers, meta.num_experts, union_prefill=True)
    prev_turn = None
    for (turn, phase, step), layers in cells.items():
        if turn != prev_turn:
            steps._close_prefill()
            prev_turn = turn
        for layer in sorted(layers):
            experts = tuple(e for _, e in sorted(layers[layer]))
            steps.add(step, PREFILL if phase == 0 else DECODE, layer, experts)
    trace = Trace(meta, steps.done())
    _fill_shape(meta, trace.steps)
    return trace


def _route_csv_preamble(path: Path, meta: TraceMeta) -> tuple[list[str], int]:
    """Read the `#` lines into `meta` (model, shape, per-layer expert bytes); the CSV
    lines that follow and the line number of their header."""
    layer_bytes: dict[int, int] = {}
    body: list[str] = []
    body_start = 0  # line number of the column header
    for n, line in enumerate(_lines(path), start=1):
        if line.startswith("#"):
            fields = dict(p.split("=", 1) for p in line[1:].split() if "=" in p)

            def num(key: str, default: int, n: int = n, fields: dict = fields) -> int:
                v = fields.get(key)
                if v is None:
                    return default
                if not v.isdigit():
                    raise _bad(path, n, f"{key} must be a non-negative integer, got {v!r:.40}")
                return int(v)

            if "layer" in fields and "expert_bytes" in fields:
                layer_bytes[num("layer", 0)] = num("expert_bytes", 0)
            else:
                meta.model = Path(fields.get("model", meta.model)).name
                meta.num_layers = num("n_layer", meta.num_layers)
                meta.num_experts = num("n_expert", meta.num_experts)
                meta.k = num("n_expert_used", meta.k)
                _check_shape(meta, path, n)
        elif line.strip():
            body_start = body_start or n
            body.append(line)
    if len(layer_bytes) and max(layer_bytes) >= (meta.num_layers or MAX_LAYERS):
        raise BadValueError(
            f"{path}: expert_bytes for layer {max(layer_bytes)} of {meta.num_layers or MAX_LAYERS}"
        )
    if layer_bytes:
        meta.extra["expert_bytes"] = [layer_bytes.get(i, 0) for i in range(max(layer_bytes) + 1)]
    return body, body_start


def _read_vllm_routes(path: Path) -> Trace:
    """vLLM `moe_routes.jsonl` (meta line, then `route` rows with topk_ids/topk_weights).

    The leading rows with exactly uniform weights are vLLM's memory-profiling dummy pass
    and are dropped. Requests are interleaved by the batcher, so token order is not a
    per-request order: fine for popularity, not for recency.
    """
    steps: _Steps | None = None
    head: dict[str, Any] = {}
    dummy = True
    for i, row in _json_objects(path, _lines(path)):
        if row.get("type") == "meta":
            head = row
            _int(head.get("top_k", 0), path, i, "top_k")
            _int(head.get("num_experts", 0), path, i, "num_experts")
            continue
        if row.get("type") != "route":
            continue
        if steps is None:
            steps = _Steps(path, 0, int(head.get("num_experts", 0)))
        try:
            ids = _ids(row["topk_ids"], path, i)
            weights = [float(w) for w in row.get("topk_weights", [])]
        except (KeyError, TypeError, ValueError) as e:
            raise _bad(path, i, f"bad route row ({type(e).__name__}: {e})") from None
        if dummy and weights and max(weights) - min(weights) < 1e-9:
            continue
        dummy = False
        steps.add(_int(row.get("token_idx"), path, i, "token_idx"), DECODE,
                  _int(row.get("layer"), path, i, "layer"), ids, i)  # fmt: skip
    meta = TraceMeta(
        model=str(head.get("model_id", "")),
        k=_int(head.get("top_k", 0), path, 1, "meta 'top_k'"),
        num_experts=_int(head.get("num_experts", 0), path, 1, "meta 'num_experts'"),
        source="vllm moe_routes",
        note="requests are interleaved by the batcher: token order is not per-request; "
        "use for expert popularity, not for recency-based hit rates",
    )
    _check_shape(meta, path)
    trace = Trace(meta, steps.done() if steps else [])
    _fill_shape(meta, trace.steps)
    return trace


def _fill_shape(meta: TraceMeta, steps: list[TraceStep]) -> None:
    """Fill K / num_layers / num_experts from the rows where the header lacks them."""
    max_layer = max_expert = -1
    max_k = 0
    for s in steps:
        for layer, experts in s.layers:
            max_layer = max(max_layer, layer)
            if experts:
                max_expert = max(max_expert, max(experts))
            if s.phase == DECODE:
                max_k = max(max_k, len(experts))
    meta.num_layers = max(meta.num_layers, max_layer + 1)
    meta.num_experts = max(meta.num_experts, max_expert + 1)
    if not meta.k:
        meta.k = max_k
