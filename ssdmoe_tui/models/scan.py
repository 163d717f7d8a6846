"""Find MoE checkpoints on disk and measure their experts from safetensors headers.

Only headers are read (8-byte little-endian length, then JSON): listing a 20 GB model
costs a few kilobytes of I/O. Hub-cache models are found with huggingface_hub's own
`scan_cache_dir`, so HF_HOME / HF_HUB_CACHE are honoured exactly as the hub does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ssdmoe_tui.checkpoint.config import read_config
from ssdmoe_tui.checkpoint.layout import (
    ExpertMeasure,
    measure_experts,
    missing_shards,
)
from ssdmoe_tui.errors import ModelError, SsdmoeError
from ssdmoe_tui.models import registry
from ssdmoe_tui.paths import demo_model_dir

MODEL_DIRS_ENV = "SSDMOE_MODEL_DIRS"

# Measuring is checkpoint.layout's; these names stay importable from here for callers.
__all__ = ["ExpertMeasure", "measure_experts", "missing_shards", "read_config"]


# --------------------------------------------------------------------------- listing


@dataclass
class ModelEntry:
    """One row of `ssdmoe models`."""

    name: str  # repo id for hub models, folder name otherwise
    source: str  # "hub" or "dir"
    path: str
    architecture: str
    size_bytes: int
    # Read from the config, then measured from the headers, by `describe_folder`: 0 (False)
    # until then, and where it cannot (no geometry, unreadable headers: see `reason`).
    num_experts: int = 0
    trained_k: int = 0
    moe_layers: int = 0
    bytes_per_expert: int = 0
    mib_per_token: float = 0.0  # at trained K
    supported: bool = False
    reason: str | None = None  # why not supported (one line)
    revision: str | None = None  # hub commit
    known: bool = False  # one of registry.KNOWN_CHECKPOINTS

    def to_dict(self) -> dict:
        return asdict(self)


def model_dirs(extra: Iterable[Path | str] = ()) -> list[Path]:
    """Folders searched besides the hub cache: SSDMOE_MODEL_DIRS, the demo model, `extra`."""
    env = [p for p in os.environ.get(MODEL_DIRS_ENV, "").split(os.pathsep) if p.strip()]
    seen: set[Path] = set()
    out: list[Path] = []
    for raw in [*env, demo_model_dir(), *extra]:
        path = Path(raw).expanduser()
        if path not in seen:
            seen.add(path)
            out.append(path)
    return out


def _dir_size(folder: Path) -> int:
    seen: set[str] = set()
    total = 0
    for p in folder.rglob("*"):
        try:
            real = os.path.realpath(p)
            if real in seen or not os.path.isfile(real):
                continue
            seen.add(real)
            total += os.path.getsize(real)
        except OSError:
            continue
    return total


def describe_folder(
    folder: Path,
    *,
    name: str | None = None,
    source: str = "dir",
    size_bytes: int | None = None,
    revision: str | None = None,
) -> ModelEntry | None:
    """A listing row for a model folder; None when it is not a MoE model (dense, no config)."""
    folder = Path(folder)
    try:
        config = read_config(folder)
    except ModelError:
        return None
    entry = ModelEntry(
        name=name or folder.name,
        source=source,
        path=str(folder),
        architecture=registry.model_type(config) or "?",
        size_bytes=_dir_size(folder) if size_bytes is None else size_bytes,
        revision=revision,
        known=any(c.repo_id == name for c in registry.KNOWN_CHECKPOINTS),
    )
    try:
        geo = registry.moe_geometry(config)
    except SsdmoeError as e:
        entry.reason = str(e)
        return entry
    if geo is None:
        return None
    entry.num_experts, entry.trained_k, entry.moe_layers = (
        geo.num_experts,
        geo.trained_k,
        len(geo.moe_layers),
    )
    try:
        missing = missing_shards(folder)
        if missing:
            raise ModelError(
                f"incomplete: {len(missing)} shard(s) missing (e.g. {missing[0]}); "
                f"finish it with `ssdmoe models fetch {entry.name}`"
            )
        measured = measure_experts(folder)
        entry.bytes_per_expert = measured.bytes_per_expert
        entry.mib_per_token = round(measured.mib_per_token(geo.trained_k), 3)
        registry.check_supported(config, folder)
        entry.supported = True
    except SsdmoeError as e:
        entry.reason = str(e).removeprefix(f"{folder}: ")
    except OSError as e:
        entry.reason = f"{folder}: {e.strerror or e}"
    return entry


def _hub_entries(cache_dir: Path | str | None) -> list[ModelEntry]:
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        # The module attribute, read now (scan_cache_dir's default is bound at import).
        info = scan_cache_dir(cache_dir or constants.HF_HUB_CACHE)
    except CacheNotFound:
        return []
    out: list[ModelEntry] = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revs = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        rev = revs[-1]
        entry = describe_folder(
            rev.snapshot_path,
            name=repo.repo_id,
            source="hub",
            size_bytes=rev.size_on_disk,
            revision=rev.commit_hash,
        )
        if entry is not None:
            out.append(entry)
    return out


def _folder_candidates(root: Path) -> list[Path]:
    if (root / "config.json").is_file():
        return [root]
    if not root.is_dir():
        return []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    return [p for p in children if (p / "config.json").is_file()]


def scan_models(
    extra_dirs: Sequence[Path | str] = (), *, cache_dir: Path | str | None = None
) -> list[ModelEntry]:
    """MoE checkpoints in the hub cache, then in `model_dirs(extra_dirs)` (each a model
    folder or a folder of model folders)."""
    entries = _hub_entries(cache_dir)
    seen = {os.path.realpath(e.path) for e in entries}
    for root in model_dirs(extra_dirs):
        for folder in _folder_candidates(root):
            real = os.path.realpath(folder)
            if real in seen:
                continue
            seen.add(real)
            entry = describe_folder(folder)
            if entry is not None:
                out_name = "demo" if folder == demo_model_dir() else None
                if out_name:
                    entry.name = out_name
                entries.append(entry)
    return entries


def entries_json(entries: Sequence[ModelEntry]) -> str:
    return json.dumps([e.to_dict() for e in entries], indent=2)
