"""A conversation's expert working set on disk, for a warm resume.

`experts.json` sits next to the KV checkpoints in the conversation's folder: the expert
cache's working set at the end of the last turn (per MoE layer, expert ids, most
recently used first; `ExpertCache.working_set`), with the model's fingerprint and
shape. On resume the app reads it back and asks the engine to warm those experts
(`WarmExperts`), so the first reply runs on a warm cache.

Written atomically and 0600 (`ssdmoe_tui.atomic`), at most `MAX_IDS` ids. Read back
only when it is whole and for this model: a file that is too big, not JSON, of another
format, model or shape, or with an id out of range is ignored with one line naming
it (the resume is then only colder). Read through `user_files.read_regular` (a FIFO, a
device or a link to /dev/zero is refused without blocking or reading past the cap).
No MLX here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.user_files import RefusedFile, read_regular

FILE = "experts.json"
FORMAT = "ssdmoe-experts"
VERSION = 1
MAX_IDS = 1 << 20  # far above any cache's slots (a 64 GiB cache of 1.7 MB experts: 40k)
MAX_FILE_BYTES = 16 << 20

WorkingSet = tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Loaded:
    """A working set read back (None: none to warm) and the line saying why not."""

    working_set: WorkingSet | None
    warning: str = ""


def save_working_set(
    folder: Path, working_set: Sequence[tuple[int, Sequence[int]]], info: Any
) -> Path:
    """Write `experts.json` (atomic, 0600), cut to `MAX_IDS` ids (most recent kept)."""
    layers, total = [], 0
    depth = max((len(ids) for _, ids in working_set), default=0)
    cut = {layer: 0 for layer, _ in working_set}
    for rank in range(depth):  # keep the most recent of every layer when cutting
        for layer, ids in working_set:
            if rank < len(ids) and total < MAX_IDS:
                cut[layer] += 1
                total += 1
    for layer, ids in working_set:
        if cut[layer]:
            layers.append([int(layer), [int(e) for e in ids[: cut[layer]]]])
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "fingerprint": info.fingerprint,
        "num_layers": info.num_layers,
        "num_experts": info.num_experts,
        "layers": layers,
    }
    path = Path(folder) / FILE
    atomic_write_text(path, json.dumps(doc, separators=(",", ":")))
    return path


def load_working_set(folder: Path, info: Any) -> Loaded:
    """The saved working set if it is sound and for this model (`info`: the loaded
    model's ModelInfo); no file: nothing, silently."""
    path = Path(folder) / FILE
    try:
        doc = json.loads(read_regular(path, MAX_FILE_BYTES))
    except FileNotFoundError:
        return Loaded(None)
    except RefusedFile as e:
        return _ignored(e.reason)
    except OSError as e:
        return _ignored(f"unreadable ({e.strerror or e})")
    except (ValueError, RecursionError):
        return _ignored("corrupt (not JSON)")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return _ignored("not an ssdmoe expert working set")
    version = doc.get("version")
    if type(version) is not int or version != VERSION:  # `true == 1` is no version
        return _ignored(f"version {doc.get('version')!r}, this version reads {VERSION}")
    if doc.get("fingerprint") != info.fingerprint:
        return _ignored("made with another model (fingerprint differs)")
    layers = doc.get("layers")
    if not isinstance(layers, list):
        return _ignored("corrupt (layers)")
    out: list[tuple[int, tuple[int, ...]]] = []
    seen: set[int] = set()
    total = 0
    for entry in layers:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
            return _ignored("corrupt (a layer entry)")
        layer, ids = entry
        if not _in_range(layer, info.num_layers) or layer in seen:
            return _ignored(f"layer {layer!r} out of range for {info.num_layers} MoE layers")
        bad = next((e for e in ids if not _in_range(e, info.num_experts)), None)
        if bad is not None or len(set(ids)) != len(ids):
            what = f"expert {bad!r} out of range" if bad is not None else "an expert twice"
            return _ignored(f"layer {layer}: {what} for {info.num_experts} experts")
        total += len(ids)
        if total > MAX_IDS:
            return _ignored(f"over {MAX_IDS:,} ids")
        seen.add(layer)
        out.append((layer, tuple(ids)))
    return Loaded(tuple(out))


def _in_range(v: object, n: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n


def _ignored(reason: str) -> Loaded:
    return Loaded(None, f"expert working set ignored: {FILE}: {reason}")
