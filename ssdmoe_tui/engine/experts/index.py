"""Byte-offset index of the stacked expert tensors in a checkpoint's safetensors shards.

Only headers are read (8-byte length + JSON), never tensor data. Expert tensors are
recognised by name pattern, not by model: any `<prefix>.<switch>.<proj>.<part>` with
switch one of the architecture table's attributes (switch_mlp, experts, switch_glu),
proj in gate/up/down_proj, fc1, fc2 and part in weight/scales/biases/bias. A stacked
tensor of shape (E, ...) holds expert e's bytes at `offset + e * stride`, so an
expert is one contiguous piece per component. Headers, the tensor-name pattern and
the limits on both live in `ssdmoe_tui.checkpoint`; this module turns them into read
plans. The index is cached under the platformdirs cache dir, keyed by the shards' names,
sizes, mtimes and a content sample (the header and a few 4 KiB blocks of each shard), so a
shard rewritten in place with the same size and mtime gets a new key.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.checkpoint import layout
from ssdmoe_tui.checkpoint.header import read_header_bytes
from ssdmoe_tui.errors import ModelError, UnsupportedModelError
from ssdmoe_tui.paths import cache_dir
from ssdmoe_tui.user_files import (
    INDEX_CACHE_MAX,
    MODEL_JSON_MAX,
    open_regular,
    read_regular,
    read_regular_text,
)

INDEX_VERSION = 4  # 4: expert stacks under any SwitchGLU attribute, projection biases
SAMPLE_BLOCK = 4096
SAMPLE_BLOCKS = 8  # evenly spaced over the data section, plus the last block


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
    note: str = ""  # a warning for the user (a shard edited in place); never cached

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def mib_per_token(self, k: int) -> float:
        return layout.mib_per_token(self.expert_bytes, k, self.num_layers)

    def is_expert_tensor(self, name: str) -> bool:
        return layout.is_expert_tensor(name)


def content_sample(path: Path) -> str:
    """sha256 of a shard's header and of SAMPLE_BLOCKS 4 KiB blocks spread over its data
    (plus the last one): a few reads that catch a shard rewritten with the same size/mtime."""
    raw, size = read_header_bytes(path)
    h = hashlib.sha256(raw)
    start = 8 + len(raw)
    span = max(size - start - SAMPLE_BLOCK, 0)
    points = sorted({start + span * i // SAMPLE_BLOCKS for i in range(SAMPLE_BLOCKS + 1)})
    with open_regular(path) as f:
        for pos in points:
            h.update(os.pread(f.fileno(), SAMPLE_BLOCK, pos))
    return h.hexdigest()


def shard_states(model_dir: Path, names: list[str]) -> dict[str, list]:
    """[size, mtime_ns, content sample] of each shard: what the index key is made of."""
    out = {}
    for n in names:
        st = (model_dir / n).stat()
        out[n] = [st.st_size, st.st_mtime_ns, content_sample(model_dir / n)]
    return out


def _index_key(model_dir: Path, names: list[str], states: dict[str, list] | None = None) -> str:
    states = shard_states(model_dir, names) if states is None else states
    h = hashlib.sha256(f"v{INDEX_VERSION}".encode())
    for n in names:
        size, mtime, sample = states[n]
        h.update(f"{n}:{size}:{mtime}:{sample}".encode())
    cfg = model_dir / "config.json"
    if cfg.exists():
        h.update(read_regular(cfg, MODEL_JSON_MAX))
    return h.hexdigest()[:32]


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
    names = layout.shard_names(model_dir)
    key = _index_key(model_dir, names)
    scan = layout.scan_experts(model_dir, names)
    groups = {
        prefix: [
            Component(
                name=e.component,
                shard=e.shard,
                offset=e.offset,
                stride=e.stride,
                shape=e.shape,
                dtype=e.dtype,
            )
            for e in tensors
        ]
        for prefix, tensors in scan.blocks.items()
    }
    if not groups:
        raise UnsupportedModelError(
            f"{model_dir}: no stacked expert tensors (`*.switch_mlp.*`, `*.experts.*`) found: not an "
            "MoE checkpoint in the mlx-lm layout (`mlx_lm.convert` writes it; e.g. "
            "mlx-community/Qwen3-30B-A3B-4bit)"
        )
    num_experts = scan.num_experts
    layers = []
    first = None
    for prefix, comps in groups.items():
        this_layout = tuple((c.name, c.shape, c.dtype) for c in comps)
        if first is None:
            first = this_layout
        elif this_layout != first:
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
        resident_bytes=scan.resident_bytes,
        total_bytes=scan.total_bytes,
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


def changed_in_place(model_dir: Path, states: dict[str, list]) -> list[str]:
    """Shards whose content sample differs from the last time this folder was indexed
    while their size and mtime did not (an in-place edit); records the states."""
    key = hashlib.sha256(os.path.realpath(model_dir).encode()).hexdigest()[:32]
    record = cache_dir() / "index" / "folders" / f"{key}.json"
    try:
        before = json.loads(read_regular(record, INDEX_CACHE_MAX))
    except (OSError, ValueError, RecursionError):
        before = {}
    if not isinstance(before, dict):  # a damaged record only costs this comparison
        before = {}
    changed = [
        n
        for n, (size, mtime, sample) in states.items()
        if isinstance(before.get(n), list)
        and before[n][:2] == [size, mtime]
        and before[n][2:] != [sample]
    ]
    if before != states:
        try:
            atomic_write_text(record, json.dumps(states))
        except OSError:
            pass
    return changed


def load_index(model_dir: Path, use_cache: bool = True) -> tuple[ExpertIndex, bool]:
    """Return (index, from_cache). The cache entry is valid while the shards' sizes,
    mtimes and content samples match. `index.note` says when a shard changed in place."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelError(f"model folder not found: {model_dir}")
    names = layout.shard_names(model_dir)
    states = shard_states(model_dir, names)
    key = _index_key(model_dir, names, states)
    changed = changed_in_place(model_dir, states) if use_cache else []
    note = (
        f"{model_dir / changed[0]}: content changed in place (same size and mtime) since it "
        "was last indexed; `ssdmoe index --verify` names the tensors"
        if changed
        else ""
    )
    cached = cache_dir() / "index" / f"{key}.json"
    if use_cache and cached.exists():
        try:
            index = _from_json(read_regular_text(cached, INDEX_CACHE_MAX))
            if index.key == key:
                for n in index.shards:  # re-validate file sizes cheaply
                    if not (model_dir / n).exists():
                        raise ValueError
                return index, True
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError):
            pass  # any unreadable cache file (damaged, nested, a FIFO...) is stale: rebuild
    index = build_index(model_dir)
    if use_cache:
        try:
            if cached.is_dir() and not cached.is_symlink():  # a folder in our cache's place
                shutil.rmtree(cached)
            atomic_write_text(cached, _to_json(index))
        except OSError:
            pass  # a read-only cache dir only costs a rebuild next time
    return (replace(index, note=note) if note else index), False
