"""Byte-offset index of the stacked expert tensors in a checkpoint's safetensors shards.

Only headers are read (8-byte length + JSON), never tensor data. Expert tensors are
recognised by name pattern, not by model: any `<prefix>.switch_mlp.<proj>.<part>`
with proj in gate/up/down_proj, fc1, fc2 and part in weight/scales/biases. A stacked
tensor of shape (E, ...) holds expert e's bytes at `offset + e * stride`, so an
expert is one contiguous piece per component. The index is cached under the
platformdirs cache dir, keyed by the shards' names, sizes and mtimes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.errors import ModelError, UnsupportedModelError
from ssdmoe_tui.paths import cache_dir

INDEX_VERSION = 2

EXPERT_RE = re.compile(
    r"^(?P<prefix>.+)\.switch_mlp\.(?P<proj>gate_proj|up_proj|down_proj|fc1|fc2)\.(?P<part>weight|scales|biases)$"
)
_PROJ_ORDER = {"gate_proj": 0, "up_proj": 1, "down_proj": 2, "fc1": 3, "fc2": 4}
_PART_ORDER = {"weight": 0, "scales": 1, "biases": 2}
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
_MAX_HEADER = 100 << 20


@dataclass(frozen=True)
class Component:
    """One stacked tensor of one MoE layer, e.g. `gate_proj.weight`."""

    name: str  # "gate_proj.weight"
    shard: str  # file name relative to the model folder
    offset: int  # absolute file offset of expert 0's bytes
    stride: int  # bytes per expert
    shape: tuple[int, ...]  # per-expert shape
    dtype: str  # safetensors dtype, e.g. "U32", "BF16"
    step: int = 0  # file bytes from one expert to the next when not `stride` (repacked file)

    @property
    def file_step(self) -> int:
        return self.step or self.stride


@dataclass(frozen=True)
class MoELayer:
    prefix: str  # module path of the MoE block, e.g. "model.layers.3.mlp"
    components: tuple[Component, ...]

    def file_offsets(self, experts) -> np.ndarray:
        """File offset of every component of each expert, row-major (expert, component)."""
        e = np.asarray(experts, dtype=np.int64)[:, None]
        base = np.array([c.offset for c in self.components], dtype=np.int64)
        step = np.array([c.file_step for c in self.components], dtype=np.int64)
        return (base[None, :] + e * step[None, :]).ravel()


@dataclass(frozen=True)
class ExpertIndex:
    key: str
    num_experts: int
    layers: tuple[MoELayer, ...]
    shards: tuple[str, ...]
    expert_bytes: int  # all components of one expert
    expert_pieces: int  # reads per expert after coalescing touching components
    resident_bytes: int  # every tensor that is not an expert tensor
    total_bytes: int

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def mib_per_token(self, k: int) -> float:
        return self.expert_bytes * k * self.num_layers / 2**20

    def component_layout(self) -> tuple[tuple[str, tuple[int, ...], str, int], ...]:
        """(name, shape, dtype, stride) of the components, identical for every layer."""
        return tuple((c.name, c.shape, c.dtype, c.stride) for c in self.layers[0].components)

    def is_expert_tensor(self, name: str) -> bool:
        return EXPERT_RE.match(name) is not None


def read_header(path: Path) -> tuple[dict, int]:
    """Return (header dict, data start offset) of a safetensors file, naming it on error."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ModelError(f"{path}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER or 8 + n > size:
                raise ModelError(
                    f"{path}: safetensors header length {n} is past the end of the file"
                )
            blob = f.read(n)
    except FileNotFoundError as e:
        raise ModelError(f"missing shard: {path}") from e
    try:
        header = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(
            f"{path}: safetensors header is not valid JSON ({e.__class__.__name__})"
        ) from e
    if not isinstance(header, dict):
        raise ModelError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + n


def shard_names(model_dir: Path) -> list[str]:
    """Shard file names: from model.safetensors.index.json when present, else a glob."""
    idx = model_dir / "model.safetensors.index.json"
    if idx.exists():
        try:
            weight_map = json.loads(idx.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelError(f"{idx}: not a valid safetensors index ({e})") from e
        names = sorted(set(weight_map.values()))
        for n in names:
            if not (model_dir / n).exists():
                raise ModelError(f"missing shard: {model_dir / n} (listed in {idx.name})")
        return names
    names = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not names:
        raise ModelError(f"{model_dir}: no .safetensors files")
    return names


def _index_key(model_dir: Path, names: list[str]) -> str:
    h = hashlib.sha256(f"v{INDEX_VERSION}".encode())
    for n in names:
        st = (model_dir / n).stat()
        h.update(f"{n}:{st.st_size}:{st.st_mtime_ns}".encode())
    cfg = model_dir / "config.json"
    if cfg.exists():
        h.update(cfg.read_bytes())
    return h.hexdigest()[:32]


def _layer_sort_key(prefix: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", prefix)]


def _coalesced_pieces(components: list[Component], num_experts: int) -> int:
    """Reads needed for one expert once components that touch are merged (expert 0)."""
    spans = sorted((c.shard, c.offset, c.offset + c.stride) for c in components)
    pieces = 0
    last: tuple[str, int] | None = None
    for shard, start, end in spans:
        if last is None or last[0] != shard or last[1] != start:
            pieces += 1
        last = (shard, end)
    return pieces


def build_index(model_dir: Path) -> ExpertIndex:
    """Scan every shard header and map each MoE layer's experts to byte ranges."""
    model_dir = Path(model_dir)
    names = shard_names(model_dir)
    key = _index_key(model_dir, names)
    groups: dict[str, list[Component]] = {}
    num_experts: int | None = None
    resident = 0
    total = 0
    for name in names:
        path = model_dir / name
        header, data_start = read_header(path)
        file_size = path.stat().st_size
        for tname, meta in header.items():
            if tname == "__metadata__":
                continue
            try:
                dtype = meta["dtype"]
                shape = tuple(int(s) for s in meta["shape"])
                begin, end = (int(x) for x in meta["data_offsets"])
            except (KeyError, TypeError, ValueError) as e:
                raise ModelError(f"{path}: tensor {tname} has a malformed header entry") from e
            if dtype not in DTYPE_SIZES:
                raise ModelError(f"{path}: tensor {tname} has unknown dtype {dtype}")
            nbytes = end - begin
            expect = math.prod(shape) * DTYPE_SIZES[dtype]
            if nbytes != expect:
                raise ModelError(
                    f"{path}: tensor {tname} holds {nbytes} bytes but shape {list(shape)} x {dtype} needs {expect}"
                )
            if data_start + end > file_size or begin < 0:
                raise ModelError(
                    f"{path}: tensor {tname} lies past the end of the file (truncated shard?)"
                )
            total += nbytes
            m = EXPERT_RE.match(tname)
            if m is not None and "mtp" in m["prefix"].split("."):
                continue  # multi-token-prediction head: mlx-lm drops it, so do we
            if m is None:
                resident += nbytes
                continue
            if len(shape) < 2:
                raise ModelError(
                    f"{path}: expert tensor {tname} has shape {list(shape)}, expected (experts, ...)"
                )
            if num_experts is None:
                num_experts = shape[0]
            elif shape[0] != num_experts:
                raise ModelError(
                    f"{path}: expert tensor {tname} has {shape[0]} experts, other layers have {num_experts}"
                )
            groups.setdefault(m["prefix"], []).append(
                Component(
                    name=f"{m['proj']}.{m['part']}",
                    shard=name,
                    offset=data_start + begin,
                    stride=nbytes // shape[0],
                    shape=shape[1:],
                    dtype=dtype,
                )
            )
    if not groups or num_experts is None:
        raise UnsupportedModelError(
            f"{model_dir}: no stacked expert tensors (`*.switch_mlp.*`) found: not an MoE checkpoint in "
            "mlx-community layout (supported: qwen3_moe, qwen3_5_moe, nemotron_h; e.g. mlx-community/Qwen3-30B-A3B-4bit)"
        )
    layers = []
    layout = None
    for prefix in sorted(groups, key=_layer_sort_key):
        comps = sorted(
            groups[prefix],
            key=lambda c: (_PROJ_ORDER[c.name.split(".")[0]], _PART_ORDER[c.name.split(".")[1]]),
        )
        this_layout = tuple((c.name, c.shape, c.dtype) for c in comps)
        if layout is None:
            layout = this_layout
        elif this_layout != layout:
            raise UnsupportedModelError(
                f"{model_dir}: MoE layer {prefix} has a different expert layout from the first layer"
            )
        if not any(c.name.endswith(".weight") for c in comps):
            raise ModelError(f"{model_dir}: MoE layer {prefix} has no expert weight tensors")
        layers.append(MoELayer(prefix=prefix, components=tuple(comps)))
    expert_bytes = sum(c.stride for c in layers[0].components)
    return ExpertIndex(
        key=key,
        num_experts=num_experts,
        layers=tuple(layers),
        shards=tuple(names),
        expert_bytes=expert_bytes,
        expert_pieces=_coalesced_pieces(list(layers[0].components), num_experts),
        resident_bytes=resident,
        total_bytes=total,
    )


def _to_json(index: ExpertIndex) -> str:
    return json.dumps({"version": INDEX_VERSION, "index": asdict(index)})


def _from_json(text: str) -> ExpertIndex:
    d = json.loads(text)
    if d.get("version") != INDEX_VERSION:
        raise ValueError("stale index version")
    i = d["index"]
    layers = tuple(
        MoELayer(
            prefix=layer["prefix"],
            components=tuple(
                Component(**{**c, "shape": tuple(c["shape"])}) for c in layer["components"]
            ),
        )
        for layer in i["layers"]
    )
    return ExpertIndex(**{**i, "layers": layers, "shards": tuple(i["shards"])})


def load_index(model_dir: Path, use_cache: bool = True) -> tuple[ExpertIndex, bool]:
    """Return (index, from_cache). The cache entry is valid while shard sizes/mtimes match."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"model folder not found: {model_dir}")
    names = shard_names(model_dir)
    key = _index_key(model_dir, names)
    cached = cache_dir() / "index" / f"{key}.json"
    if use_cache and cached.exists():
        try:
            index = _from_json(cached.read_text())
            if index.key == key:
                for n in index.shards:  # re-validate file sizes cheaply
                    if not (model_dir / n).exists():
                        raise ValueError
                return index, True
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            pass
    index = build_index(model_dir)
    if use_cache:
        try:
            atomic_write_text(cached, _to_json(index))
        except OSError:
            pass  # a read-only cache dir only costs a rebuild next time
    return index, False
