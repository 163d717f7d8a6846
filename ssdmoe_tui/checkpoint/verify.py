"""Full content check of a checkpoint: sha256 of every tensor and every shard.

`ssdmoe index --verify` reads every byte once, compares each tensor's hash with the one
recorded by the previous verify of the same folder (so a shard edited in place, even with
its size and mtime restored, shows which tensors changed), and compares each Hub-cache
shard with the sha256 the Hub named its blob by. Then it records the new hashes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.checkpoint.header import read_header
from ssdmoe_tui.checkpoint.layout import shard_names
from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.user_files import INDEX_CACHE_MAX, open_regular, read_regular

CHUNK = 8 << 20
_SHA = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class VerifyResult:
    shards: int = 0
    tensors: int = 0
    bytes_read: int = 0
    seconds: float = 0.0
    previous: float | None = None  # time of the verify compared against (None: first one)
    changed: list[str] = field(default_factory=list)  # "shard: tensor" whose bytes differ
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    hub_mismatch: list[str] = field(default_factory=list)  # shards unlike their Hub blob

    @property
    def ok(self) -> bool:
        return not (self.changed or self.added or self.removed or self.hub_mismatch)


def hash_shard(path: Path) -> tuple[str, dict[str, str]]:
    """(sha256 of the whole file, {tensor: sha256 of its bytes}), reading it once."""
    header = read_header(path)
    whole = hashlib.sha256()
    spans = sorted(
        (header.data_start + t.begin, header.data_start + t.end, name)
        for name, t in header.tensors.items()
    )
    digests = {name: hashlib.sha256() for _, _, name in spans}
    with open_regular(path) as f:
        fd, pos, i = f.fileno(), 0, 0
        while pos < header.file_size:
            chunk = os.pread(fd, min(CHUNK, header.file_size - pos), pos)
            if not chunk:
                raise ModelError(f"{path}: shorter than its header says (changed while reading?)")
            end = pos + len(chunk)
            whole.update(chunk)
            while i < len(spans) and spans[i][1] <= pos:
                i += 1
            j = i
            while j < len(spans) and spans[j][0] < end:
                lo, hi, name = spans[j]
                digests[name].update(chunk[max(lo, pos) - pos : min(hi, end) - pos])
                j += 1
            pos = end
    return whole.hexdigest(), {name: h.hexdigest() for name, h in digests.items()}


def _record_path(folder: Path, cache: Path) -> Path:
    key = hashlib.sha256(os.path.realpath(folder).encode()).hexdigest()[:32]
    return cache / "verify" / f"{key}.json"


def _hub_sha(path: Path) -> str | None:
    """The Hub cache stores LFS files as blobs/<sha256>: the name is the expected hash."""
    if not path.is_symlink():
        return None
    name = Path(os.path.realpath(path)).name
    return (
        name if _SHA.match(name) and Path(os.path.realpath(path)).parent.name == "blobs" else None
    )


def verify(folder: Path, cache: Path) -> VerifyResult:
    folder = Path(folder)
    t0 = time.perf_counter()
    result = VerifyResult()
    record_file = _record_path(folder, cache)
    try:
        old = json.loads(read_regular(record_file, INDEX_CACHE_MAX))
        previous, old_tensors = float(old["time"]), dict(old["tensors"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        previous, old_tensors = None, {}
    result.previous = previous
    new_tensors: dict[str, str] = {}
    for shard in shard_names(folder):
        path = folder / shard
        whole, tensors = hash_shard(path)
        result.shards += 1
        result.tensors += len(tensors)
        result.bytes_read += path.stat().st_size
        expected = _hub_sha(path)
        if expected is not None and expected != whole:
            result.hub_mismatch.append(shard)
        for name, digest in tensors.items():
            new_tensors[f"{shard}: {name}"] = digest
    if previous is not None:
        for key, digest in new_tensors.items():
            if key not in old_tensors:
                result.added.append(key)
            elif old_tensors[key] != digest:
                result.changed.append(key)
        result.removed = sorted(set(old_tensors) - set(new_tensors))
    try:
        atomic_write_text(
            record_file,
            json.dumps({"folder": str(folder), "time": time.time(), "tensors": new_tensors}),
        )
    except OSError:
        pass  # a read-only cache only loses the comparison next time
    result.seconds = time.perf_counter() - t0
    return result
