"""Expert-routing traces: the engine's own format (write and read) plus readers for the
real traces (tests/fixtures/traces), so one simulator replays them all.

Engine format ("ssdmoe-route-trace" v1), JSON lines, gzip when the name ends in .gz:

    {"format": "ssdmoe-route-trace", "version": 1, "model": "...", "k": 8,
     "num_layers": 48, "num_experts": 128, ...}          <- header, line 1
    [token, layer, phase, [expert, ...]]                  <- one row per (token, layer)

`phase` is 0 for prefill, 1 for decode. Rows are kept in the order the engine routed
them; consecutive rows with the same (token, phase) form one step. A prefill chunk may
be one row whose experts are the union over the chunk. A torn last line (crash while
recording) is ignored.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ssdmoe_tui.errors import BadValueError

FORMAT = "ssdmoe-route-trace"
VERSION = 1
PREFILL, DECODE = 0, 1


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


@dataclass
class Trace:
    meta: TraceMeta
    steps: list[TraceStep]

    def decode_steps(self) -> int:
        return sum(1 for s in self.steps if s.phase == DECODE)


# --------------------------------------------------------------------------- writer


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] | None = _open_text(self.path, "w")
        self._f.write(json.dumps(header, separators=(",", ":")) + "\n")
        self.rows = 0

    def add(self, token_idx: int, layer: int, experts: Iterable[int], phase: int = DECODE) -> None:
        if self._f is None:
            raise ValueError(f"trace {self.path} is closed")
        ids = experts.tolist() if hasattr(experts, "tolist") else list(experts)  # type: ignore[union-attr]
        ids = ",".join(str(int(e)) for e in ids)
        self._f.write(f"[{int(token_idx)},{int(layer)},{int(phase)},[{ids}]]\n")
        self.rows += 1

    def flush(self) -> None:
        if self._f is not None:
            self._f.flush()

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- readers


class _Steps:
    """Groups consecutive rows with the same (token, phase) into steps."""

    def __init__(self) -> None:
        self.steps: list[TraceStep] = []
        self._cur: tuple[int, int] | None = None

    def add(self, token: int, phase: int, layer: int, experts: tuple[int, ...]) -> None:
        if self._cur != (token, phase):
            self._cur = (token, phase)
            self.steps.append(TraceStep(token, phase, []))
        self.steps[-1].layers.append((layer, experts))


def read_trace(path: str | Path) -> Trace:
    """Read any supported trace; the format is recognised from its first line."""
    path = Path(path)
    if not path.is_file():
        raise BadValueError(f"trace not found: {path}")
    try:
        with _open_text(path, "r") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError, EOFError) as e:
        raise BadValueError(f"cannot read trace {path}: {e}") from None
    if first.startswith("# route_trace"):
        return _read_route_csv(path)
    try:
        head = json.loads(first)
    except json.JSONDecodeError:
        head = None
    if isinstance(head, dict) and head.get("format") == FORMAT:
        return _read_engine(path)
    if isinstance(head, dict) and head.get("type") == "meta":
        return _read_vllm_routes(path)
    raise BadValueError(
        f"unrecognised trace format: {path} (expected an ssdmoe trace, a route_trace v1 CSV "
        "or a vLLM moe_routes.jsonl)"
    )


def _bad(path: Path, lineno: int, why: str) -> BadValueError:
    return BadValueError(f"bad trace row at {path}:{lineno}: {why}")


def _read_engine(path: Path) -> Trace:
    steps = _Steps()
    with _open_text(path, "r") as f:
        lines = f.read().split("\n")
    header = json.loads(lines[0])
    if header.get("version") != VERSION:
        raise BadValueError(f"{path}: trace version {header.get('version')} is not {VERSION}")
    known = {"format", "version", "model", "k", "num_layers", "num_experts", "note"}
    meta = TraceMeta(
        model=str(header.get("model", "")),
        k=int(header.get("k", 0)),
        num_layers=int(header.get("num_layers", 0)),
        num_experts=int(header.get("num_experts", 0)),
        note=str(header.get("note", "")),
        extra={k: v for k, v in header.items() if k not in known},
    )
    last = len(lines) - 1
    for i, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            t, layer, phase, experts = json.loads(line)
            row = (int(t), int(phase), int(layer), tuple(int(e) for e in experts))
        except (json.JSONDecodeError, ValueError, TypeError) as e:
            if i - 1 == last:  # torn final line: the recording was cut short
                break
            raise _bad(path, i, str(e)) from None
        steps.add(row[0], row[1], row[2], row[3])
    _fill_shape(meta, steps.steps)
    return Trace(meta, steps.steps)


def _read_route_csv(path: Path) -> Trace:
    """Helldez/BigMoeOnEdge "route_trace v1": `#` preamble, then one row per routed expert."""
    meta = TraceMeta(source="route_trace v1")
    layer_bytes: dict[int, int] = {}
    body: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                fields = dict(p.split("=", 1) for p in line[1:].split() if "=" in p)
                if "layer" in fields and "expert_bytes" in fields:
                    layer_bytes[int(fields["layer"])] = int(fields["expert_bytes"])
                else:
                    meta.model = Path(fields.get("model", meta.model)).name
                    meta.num_layers = int(fields.get("n_layer", meta.num_layers))
                    meta.num_experts = int(fields.get("n_expert", meta.num_experts))
                    meta.k = int(fields.get("n_expert_used", meta.k))
            else:
                body.append(line)
    if layer_bytes:
        meta.extra["expert_bytes"] = [layer_bytes.get(i, 0) for i in range(max(layer_bytes) + 1)]
    # Gather (turn, phase, step) -> layer -> [(slot, expert)], keeping first-seen order.
    cells: dict[tuple[int, int, int], dict[int, list[tuple[int, int]]]] = {}
    reader = csv.DictReader(body)
    need = {"turn", "phase", "step", "layer", "slot", "expert"}
    if not reader.fieldnames or not need <= set(reader.fieldnames):
        raise BadValueError(f"{path}: route_trace header lacks {sorted(need)}")
    for n, row in enumerate(reader, start=1):
        try:
            key = (int(row["turn"]), int(row["phase"]), int(row["step"]))
            cells.setdefault(key, {}).setdefault(int(row["layer"]), []).append(
                (int(row["slot"]), int(row["expert"]))
            )
        except (TypeError, ValueError) as e:
            raise BadValueError(f"bad trace row {n} in {path}: {e}") from None
    steps = _Steps()
    for (_turn, phase, step), layers in cells.items():
        for layer in sorted(layers):
            experts = tuple(e for _, e in sorted(layers[layer]))
            steps.add(step, PREFILL if phase == 0 else DECODE, layer, experts)
    _fill_shape(meta, steps.steps)
    return Trace(meta, steps.steps)


def _read_vllm_routes(path: Path) -> Trace:
    """vLLM `moe_routes.jsonl` (meta line, then `route` rows with topk_ids/topk_weights).

    The leading rows with exactly uniform weights are vLLM's memory-profiling dummy pass
    and are dropped. Requests are interleaved by the batcher, so token order is not a
    per-request order: fine for popularity, not for recency.
    """
    steps = _Steps()
    head: dict[str, Any] = {}
    dummy = True
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise _bad(path, i, str(e)) from None
            if row.get("type") == "meta":
                head = row
                continue
            if row.get("type") != "route":
                continue
            try:
                ids = tuple(int(e) for e in row["topk_ids"])
                weights = [float(w) for w in row.get("topk_weights", [])]
                if dummy and weights and max(weights) - min(weights) < 1e-9:
                    continue
                dummy = False
                steps.add(int(row["token_idx"]), DECODE, int(row["layer"]), ids)
            except (KeyError, TypeError, ValueError) as e:
                raise _bad(path, i, str(e)) from None
    meta = TraceMeta(
        model=str(head.get("model_id", "")),
        k=int(head.get("top_k", 0)),
        num_experts=int(head.get("num_experts", 0)),
        source="vllm moe_routes",
        note="requests are interleaved by the batcher: token order is not per-request; "
        "use for expert popularity, not for recency-based hit rates",
    )
    _fill_shape(meta, steps.steps)
    return Trace(meta, steps.steps)


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
