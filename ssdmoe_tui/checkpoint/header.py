"""The one safetensors header reader: 8-byte little-endian length, then a JSON object.

Every file the project reads as safetensors (model shards, KV checkpoints) comes through
`read_header`, which checks the whole header before anyone uses a number from it:

- the header is at most `MAX_HEADER_BYTES` (the limit of the safetensors library itself),
  nests at most `MAX_DEPTH` deep (checked before parsing, so no RecursionError), and holds
  only integers that fit in int64 (no floats, no 1e400, no 5000-digit numbers);
- every tensor entry has a known dtype string, a shape of non-negative int64 dimensions,
  and data offsets inside the file that match shape x dtype exactly;
- no two tensors' bytes overlap;
- `__metadata__`, when present, maps strings to strings.

Anything else raises `HeaderError`: one line that names the file and the tensor or value.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.user_files import RefusedFile, open_regular

MAX_HEADER_BYTES = 100_000_000  # safetensors' own MAX_HEADER_SIZE
MAX_DEPTH = 8  # a real header nests 3 deep: {tensor: {"shape": [...]}}
INT64_MAX = 2**63 - 1
_MAX_INT_DIGITS = 64  # int64 needs 19; longer literals are refused unparsed

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


class HeaderError(ModelError):
    """A safetensors header that cannot be trusted; the message names the file."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a header. `begin`/`end` are offsets into the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class Header:
    path: Path
    tensors: dict[str, TensorEntry]  # in file order
    metadata: dict[str, str]
    data_start: int  # absolute file offset of the data section (8 + header length)
    file_size: int
    raw: bytes  # the header bytes as stored (for content hashes)

    def absolute(self, entry: TensorEntry) -> int:
        """File offset of a tensor's first byte."""
        return self.data_start + entry.begin


class _Float(str):
    """A JSON number that is not an integer, kept as written so the message can quote it."""


class _BigInt(str):
    """An integer literal too long to be any int64, kept unparsed (int() of 5000 digits
    is slow and over Python's limit)."""


def _parse_int(text: str) -> int | _BigInt:
    return int(text) if len(text.lstrip("-")) <= _MAX_INT_DIGITS else _BigInt(text)


def _no_constant(text: str) -> _Float:
    return _Float(text)  # NaN / Infinity / -Infinity: not an integer either


def _pairs(path: Path):
    def hook(pairs: list[tuple[str, object]]) -> dict:
        out: dict = {}
        for key, value in pairs:
            if key in out:
                raise HeaderError(path, f"key {key!r} appears twice in the safetensors header")
            out[key] = value
        return out

    return hook


_STEP = np.zeros(256, dtype=np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_CHUNK = 8 << 20  # bytes per pass: bounded memory for a header of up to 100 MB


def _bracket_depth(blob: bytes) -> int:
    raw = np.frombuffer(blob, dtype=np.uint8)
    depth = deepest = 0
    for i in range(0, len(raw), _CHUNK):
        running = np.cumsum(_STEP[raw[i : i + _CHUNK]], dtype=np.int64) + depth
        if len(running):
            deepest = max(deepest, int(running.max()))
            depth = int(running[-1])
    return deepest


def nesting_depth(blob: bytes) -> int:
    """Deepest [ / { nesting of a JSON text, strings ignored; linear and recursion-free.
    Counting brackets inside strings too gives an upper bound, which is all a header under
    the limit needs; strings are stripped (slower) only when that bound is over it."""
    bound = _bracket_depth(blob)
    return bound if bound <= MAX_DEPTH else _bracket_depth(_STRING.sub(b'""', blob))


def parse_json(blob: bytes, path: Path, what: str = "safetensors header") -> object:
    """JSON with the header's limits: bounded depth, no floats smuggled in as ints."""
    depth = nesting_depth(blob)
    if depth > MAX_DEPTH:
        raise HeaderError(path, f"{what} nests {depth} levels deep (at most {MAX_DEPTH})")
    try:
        return json.loads(
            blob,
            parse_int=_parse_int,
            parse_float=_Float,
            parse_constant=_no_constant,
            object_pairs_hook=_pairs(path),
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        detail = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8"
        raise HeaderError(path, f"{what} is not valid JSON ({detail})") from None
    except RecursionError:  # unreachable after the depth check; kept as a backstop
        raise HeaderError(path, f"{what} nests too deep") from None


def _int64(value: object, path: Path, name: str, field: str) -> int:
    if isinstance(value, _BigInt):
        raise HeaderError(
            path,
            f"tensor {name}: {field} value {_show(value)} ({len(value)} digits) is outside 0..2**63-1",
        )
    if type(value) is not int:
        raise HeaderError(path, f"tensor {name}: {field} value {_show(value)} is not an integer")
    if not 0 <= value <= INT64_MAX:
        raise HeaderError(path, f"tensor {name}: {field} value {value} is outside 0..2**63-1")
    return value


def _show(value: object) -> str:
    text = value if isinstance(value, _Float | _BigInt) else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _entry(name: str, spec: object, path: Path) -> TensorEntry:
    if not isinstance(spec, dict):
        raise HeaderError(path, f"tensor {name}: entry is {_show(spec)}, not an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in spec]
    if missing:
        raise HeaderError(path, f"tensor {name}: header entry has no {missing[0]}")
    dtype = spec["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise HeaderError(path, f"tensor {name}: unknown dtype {_show(dtype)}")
    shape, offsets = spec["shape"], spec["data_offsets"]
    if not isinstance(shape, list):
        raise HeaderError(path, f"tensor {name}: shape {_show(shape)} is not a list")
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise HeaderError(path, f"tensor {name}: data_offsets {_show(offsets)} is not [begin, end]")
    dims = tuple(_int64(d, path, name, "shape") for d in shape)
    begin, end = (_int64(x, path, name, "data_offsets") for x in offsets)
    if end < begin:
        raise HeaderError(path, f"tensor {name}: data_offsets end {end} is before begin {begin}")
    need = math.prod(dims) * DTYPE_SIZES[dtype]
    if need > INT64_MAX:
        raise HeaderError(
            path, f"tensor {name}: shape {list(dims)} x {dtype} needs more than 2**63 bytes"
        )
    if end - begin != need:
        raise HeaderError(
            path,
            f"tensor {name} holds {end - begin} bytes but shape {list(dims)} x {dtype} "
            f"needs {need}",
        )
    return TensorEntry(name, dtype, dims, begin, end)


def _metadata(value: object, path: Path) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise HeaderError(path, "__metadata__ must map strings to strings")
    return value


def parse_header(blob: bytes, path: Path, file_size: int) -> Header:
    """Validate a header's bytes (the JSON after the 8-byte length) against a file size."""
    path = Path(path)
    parsed = parse_json(blob, path)
    if not isinstance(parsed, dict):
        raise HeaderError(path, "safetensors header is not a JSON object")
    data_start = 8 + len(blob)
    data_len = file_size - data_start
    tensors: dict[str, TensorEntry] = {}
    metadata: dict[str, str] = {}
    for name, spec in parsed.items():
        if name == "__metadata__":
            metadata = _metadata(spec, path)
            continue
        entry = _entry(name, spec, path)
        if entry.end > data_len:
            raise HeaderError(
                path,
                f"truncated: tensor {name} ends at data byte {entry.end} but the file holds "
                f"{max(data_len, 0)}",
            )
        tensors[name] = entry
    last: TensorEntry | None = None
    for entry in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if entry.nbytes == 0:
            continue
        if last is not None and entry.begin < last.end:
            raise HeaderError(
                path,
                f"tensors {last.name} and {entry.name} overlap (data bytes "
                f"{entry.begin}..{min(entry.end, last.end)})",
            )
        last = entry
    return Header(path, tensors, metadata, data_start, file_size, bytes(blob))


def read_header_bytes(path: Path | str, *, label: str | None = None) -> tuple[bytes, int]:
    """(the header's JSON bytes, file size), framing checked but the JSON not parsed: what
    a content hash needs, at the cost of one small read."""
    path = Path(path)
    shown = Path(label) if label is not None else path
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError(
                    shown, "truncated (shorter than the 8-byte safetensors header length)"
                )
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                raise HeaderError(
                    shown,
                    f"safetensors header length {n} is over the {MAX_HEADER_BYTES}-byte limit "
                    "(corrupt or not a safetensors file)",
                )
            if 8 + n > size:
                raise HeaderError(
                    shown, f"truncated: safetensors header length {n} is past the end of the file"
                )
            if n < 2:
                raise HeaderError(shown, f"safetensors header length {n} is too short for JSON")
            return f.read(n), size
    except FileNotFoundError:
        raise HeaderError(shown, "missing (a broken link into the hub cache?)") from None
    except RefusedFile as e:
        raise HeaderError(shown, e.reason) from None
    except IsADirectoryError:
        raise HeaderError(shown, "is a folder, not a safetensors file") from None
    except OSError as e:
        raise HeaderError(shown, f"unreadable ({e.strerror or e})") from None


def read_header(path: Path | str, *, label: str | None = None) -> Header:
    """Read and validate a safetensors file's header; no tensor data is read.

    `label` replaces the path in messages (the KV checkpoints name only the file)."""
    path = Path(path)
    blob, size = read_header_bytes(path, label=label)
    header = parse_header(blob, Path(label) if label is not None else path, size)
    return header if label is None else replace(header, path=path)
