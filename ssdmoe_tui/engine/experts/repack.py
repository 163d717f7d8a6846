"""`ssdmoe repack`: one contiguous, page-aligned copy of every expert, next to the model.

The mlx-community layout stacks each component over the experts (`gate_proj.weight`
of all experts, then its scales, ...), so one expert is 6-9 scattered pieces. The
repacked file stores each expert's components back to back, every component and every
expert starting on a 4096-byte boundary (O_DIRECT-friendly), layer after layer:

    offset(layer, expert, component) = layer_offset[layer] + expert * expert_stride
                                       + component_offset[component]

Its manifest (`ssdmoe-experts.json`, written last and atomically) records the layout
and the size and mtime of every shard it was copied from; the engine uses the file
only while they still match, so an edited or re-downloaded model falls back to its
shards with a note. The copy costs the experts' bytes again on disk.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ssdmoe_tui import paths
from ssdmoe_tui.atomic import atomic_write_text, remove_orphan_temps
from ssdmoe_tui.engine.experts.index import ExpertIndex, MoELayer, shard_states
from ssdmoe_tui.engine.experts.reader import open_reader
from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.units import human_bytes
from ssdmoe_tui.user_files import MODEL_JSON_MAX, read_regular

MANIFEST = "ssdmoe-experts.json"
DATA = "ssdmoe-experts.bin"
FORMAT = "ssdmoe-repack"
VERSION = 1
ALIGN = 4096


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class PackedLayout:
    data: Path  # the repacked file
    component_offsets: tuple[int, ...]  # within one expert, in index component order
    expert_stride: int
    layer_offsets: tuple[int, ...]


def plan(index: ExpertIndex) -> tuple[tuple[int, ...], int]:
    """(component offsets within an expert, expert stride), all 4096-aligned."""
    offs, pos = [], 0
    for c in index.layers[0].components:
        offs.append(pos)
        pos = _align(pos + c.stride)
    return tuple(offs), pos


def _layer_offsets(index: ExpertIndex, stride: int) -> tuple[int, ...]:
    return tuple(i * index.num_experts * stride for i in range(index.num_layers))


def _fingerprint(model_dir: Path, index: ExpertIndex) -> dict[str, list]:
    """Size, mtime and content sample of each expert shard: a shard edited in place (even
    with its size and mtime kept) makes the repacked copy stale."""
    shards = sorted({c.shard for layer in index.layers for c in layer.components})
    return shard_states(model_dir, shards)  # what the index key is made of, per expert shard


def _layout_record(index: ExpertIndex) -> list:
    return [[c.name, list(c.shape), c.dtype, c.stride] for c in index.layers[0].components]


def default_out_dir(model_dir: Path, index: ExpertIndex) -> Path:
    """The model folder when it is a plain writable folder, else ssdmoe's data folder
    (a Hub snapshot is left as the Hub wrote it)."""
    model_dir = Path(model_dir)
    in_hub = "snapshots" in model_dir.resolve().parts or "snapshots" in model_dir.parts
    if not in_hub and os.access(model_dir, os.W_OK):
        return model_dir
    return paths.data_dir() / "repacked" / index.key


def candidates(model_dir: Path, index: ExpertIndex) -> list[Path]:
    return [Path(model_dir), paths.data_dir() / "repacked" / index.key]


def find_repacked(model_dir: Path, index: ExpertIndex) -> tuple[PackedLayout | None, str]:
    """The repacked file for this model when one is present and current, else (None, why)."""
    model_dir = Path(model_dir)
    note = ""
    for folder in candidates(model_dir, index):
        man = folder / MANIFEST
        if not man.is_file():
            continue
        try:
            m = json.loads(read_regular(man, MODEL_JSON_MAX))
            if m.get("format") != FORMAT or m.get("version") != VERSION:
                note = f"{man}: not a version-{VERSION} repack manifest"
                continue
            if m["layout"] != _layout_record(index) or m["num_experts"] != index.num_experts:
                note = f"{man}: expert layout differs from the model's"
                continue
            if m["layers"] != [layer.prefix for layer in index.layers]:
                note = f"{man}: MoE layers differ from the model's"
                continue
            offs, stride = plan(index)
            if (
                tuple(m["component_offsets"]) != offs
                or m["expert_stride"] != stride
                or tuple(m["layer_offsets"]) != _layer_offsets(index, stride)
                or m["bytes"] != index.num_layers * index.num_experts * stride
            ):
                note = f"{man}: offsets do not match this version's layout"
                continue
            if m["source"] != _fingerprint(model_dir, index):
                note = f"{man}: stale (the model's shards changed since the repack)"
                continue
            data = folder / m["data"]
            if not data.is_file() or data.stat().st_size != m["bytes"]:
                note = f"{data}: missing or not {m['bytes']} bytes"
                continue
            return (
                PackedLayout(
                    data=data,
                    component_offsets=tuple(m["component_offsets"]),
                    expert_stride=int(m["expert_stride"]),
                    layer_offsets=tuple(m["layer_offsets"]),
                ),
                "",
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            note = f"{man}: unreadable ({e})"
    return None, note


def packed_index(index: ExpertIndex, layout: PackedLayout) -> ExpertIndex:
    """The same experts, addressed in the repacked file (`Component.step` = expert stride)."""
    layers = tuple(
        MoELayer(
            prefix=layer.prefix,
            components=tuple(
                replace(
                    c,
                    shard=str(layout.data),
                    offset=base + off,
                    step=layout.expert_stride,
                )
                for c, off in zip(layer.components, layout.component_offsets, strict=True)
            ),
        )
        for layer, base in zip(index.layers, layout.layer_offsets, strict=True)
    )
    return replace(index, layers=layers, expert_pieces=len(layout.component_offsets))


def write_repacked(
    model_dir: Path,
    index: ExpertIndex,
    out_dir: Path | None = None,
    *,
    chunk_bytes: int = 256 << 20,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[Path, dict]:
    """Copy every expert into one aligned file; returns (manifest path, summary).

    Memory stays bounded by `chunk_bytes` (experts are copied a group at a time).
    The data file is written under a temporary name and renamed, then the manifest is
    written atomically: a crash leaves no manifest pointing at a partial file.
    """
    model_dir = Path(model_dir)
    out_dir = Path(out_dir) if out_dir else default_out_dir(model_dir, index)
    comp_offs, stride = plan(index)
    e = index.num_experts
    layer_offsets = _layer_offsets(index, stride)
    total = index.num_layers * e * stride
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_free(out_dir, total)
    data = out_dir / DATA
    (out_dir / MANIFEST).unlink(missing_ok=True)  # an old copy stops counting before we write
    remove_orphan_temps(out_dir, depth=0)  # a killed repack's partial copy (GBs), if any
    tmp = out_dir / f".{DATA}.p{os.getpid()}.tmp"  # the pid: start-up cleanup spares live writers
    rd = open_reader(queue_depth=16)
    t0 = time.perf_counter()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _copy_experts(
            model_dir, index, rd, fd, comp_offs, stride, layer_offsets, chunk_bytes, progress
        )
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        rd.close()
        raise
    os.close(fd)
    rd.close()
    os.replace(tmp, data)
    manifest = _manifest(model_dir, index, comp_offs, stride, layer_offsets, total)
    man = out_dir / MANIFEST
    atomic_write_text(man, json.dumps(manifest, indent=1))
    seconds = time.perf_counter() - t0
    return man, {
        "manifest": str(man),
        "data": str(data),
        "bytes": total,
        "expert_bytes": index.expert_bytes * e * index.num_layers,
        "padding_bytes": total - index.expert_bytes * e * index.num_layers,
        "seconds": round(seconds, 2),
        "gb_per_s": round(total / seconds / 1e9, 3) if seconds > 0 else None,
    }


def _manifest(
    model_dir: Path,
    index: ExpertIndex,
    comp_offs: tuple[int, ...],
    stride: int,
    layer_offsets: tuple[int, ...],
    total: int,
) -> dict:
    """The manifest of a repack: what `find_repacked` checks before it trusts the data
    file (its layout, and the source checkpoint's fingerprint)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "data": DATA,
        "bytes": total,
        "num_experts": index.num_experts,
        "layers": [layer.prefix for layer in index.layers],
        "layout": _layout_record(index),
        "component_offsets": list(comp_offs),
        "expert_stride": stride,
        "layer_offsets": list(layer_offsets),
        "source": _fingerprint(model_dir, index),
        "model": str(model_dir.resolve()),
    }


def _check_free(out_dir: Path, total: int) -> None:
    """One line when the folder's disk cannot hold the copy (plus 64 MiB of slack)."""
    free = shutil.disk_usage(out_dir).free
    if free < total + (64 << 20):
        raise ModelError(
            f"{out_dir}: {human_bytes(total, 2)} needed for the repacked experts, "
            f"{human_bytes(free, 2)} free"
        )


def _copy_experts(
    model_dir: Path,
    index: ExpertIndex,
    rd,  # noqa: ANN001 - an engine.experts.reader reader
    fd: int,
    comp_offs: tuple[int, ...],
    stride: int,
    layer_offsets: tuple[int, ...],
    chunk_bytes: int,
    progress: Callable[[str], None],
) -> None:
    """Read every layer's experts a group at a time (at most `chunk_bytes`) into one
    zero-padded buffer laid out as the copy is, and write each group at its offset."""
    e = index.num_experts
    per_chunk = max(1, min(e, chunk_bytes // stride))
    buf = np.zeros(per_chunk * stride, dtype=np.uint8)  # padding stays zero
    base = buf.ctypes.data
    comps = index.layers[0].components
    handles = {}
    for li, layer in enumerate(index.layers):
        for c in layer.components:
            if c.shard not in handles:
                handles[c.shard] = rd.open(model_dir / c.shard)
        for first in range(0, e, per_chunk):
            n = min(per_chunk, e - first)
            fds = np.tile(np.array([handles[c.shard] for c in layer.components]), n)
            offsets = layer.file_offsets(np.arange(first, first + n))
            lengths = np.tile(np.array([c.stride for c in comps], dtype=np.int64), n)
            dests = (
                base
                + (np.arange(n, dtype=np.int64) * stride)[:, None]
                + np.array(comp_offs, dtype=np.int64)[None, :]
            ).ravel()
            rd.read_batch(fds, offsets, lengths, dests)
            view = memoryview(buf)[: n * stride]
            pos = layer_offsets[li] + first * stride
            while view:
                wrote = os.pwrite(fd, view, pos)
                view, pos = view[wrote:], pos + wrote
        progress(f"repacked layer {li + 1}/{index.num_layers} ({layer.prefix})")


def remove_repacked(model_dir: Path, index: ExpertIndex) -> list[Path]:
    """Delete every repacked copy of this model ssdmoe knows of; returns what went."""
    gone = []
    for folder in candidates(model_dir, index):
        for name in (MANIFEST, DATA):  # manifest first: never a manifest without data
            p = folder / name
            if p.exists():
                p.unlink()
                gone.append(p)
    return gone
