"""KV checkpoints of a conversation: mlx-lm prompt caches saved as safetensors.

One file per checkpoint, `kv-<n_tokens>.safetensors` in the conversation's folder,
written by mlx-lm's `save_prompt_cache` to a temp file that is fsynced and renamed
into place (a crash leaves the previous checkpoint intact). The safetensors metadata
carries the model fingerprint, the number of tokens covered, a SHA-256 of their ids,
a CRC-32 of the tensor bytes, and the format version. A checkpoint is only ever
loaded when all of them match; otherwise it is skipped with a one-line reason and
the caller rebuilds the context from the conversation's token ids.

Checkpoints are taken at turn boundaries (hybrid models' recurrent state cannot be
rolled back, so a mid-turn checkpoint would be useless for the next turn). Disk use
is bounded per conversation and globally; the oldest checkpoints go first.
conversation.json is never touched here.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import time
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, QuantizedKVCache, load_prompt_cache, save_prompt_cache

from ssdmoe_tui.atomic import STALE_TEMP_S, atomic_write_via, remove_orphan_temps
from ssdmoe_tui.checkpoint.header import HeaderError, read_header
from ssdmoe_tui.errors import SsdmoeError
from ssdmoe_tui.units import human_bytes
from ssdmoe_tui.user_files import RefusedFile, check_regular

FORMAT_VERSION = "1"
PREFIX = "kv-"
SUFFIX = ".safetensors"
_NAME = re.compile(r"^kv-(\d{1,12})\.safetensors$")

DEFAULT_KEEP = 2  # newest checkpoints kept per conversation
DEFAULT_SESSION_BUDGET = 4 << 30  # bytes of checkpoints per conversation
DEFAULT_GLOBAL_BUDGET = 16 << 30  # bytes of checkpoints across all conversations

# Test hook: called with the finished temp file just before it is renamed into place.
_before_rename: Callable[[Path], None] | None = None


class CheckpointInvalid(SsdmoeError):
    """A checkpoint that must not be used; the message is one line naming the file."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NoCheckpoint(CheckpointInvalid):
    """No checkpoint applies to these tokens (none saved yet, or all are for other
    tokens): nothing is wrong, the context is simply computed."""


class NotApplicable(CheckpointInvalid):
    """A sound checkpoint for other tokens (longer, or another branch): skipped silently."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    n_tokens: int
    size: int
    mtime_ns: int


@dataclass
class SaveResult:
    path: Path | None  # None: not written (see skipped)
    nbytes: int
    seconds: float
    evicted: list[Path] = field(default_factory=list)
    skipped: str = ""


# --------------------------------------------------------------------------- hashing


def tokens_sha256(tokens: Sequence[int]) -> str:
    buf = array("I", (int(t) for t in tokens))
    if sys.byteorder != "little":
        buf.byteswap()
    return hashlib.sha256(buf.tobytes()).hexdigest()


def _as_saved(value: Any) -> mx.array:
    """The array `save_prompt_cache` writes for a state leaf (it maps scalars the same way)."""
    if isinstance(value, mx.array):
        return value
    if isinstance(value, (bool, int, float)):
        return mx.array(value)
    if isinstance(value, str):
        return mx.array([ord(c) for c in value])
    if value is None:
        return mx.array([])
    raise ValueError(f"KV cache state is not serializable: {type(value).__name__}")


def _state_checksum(cache: list[Any]) -> str:
    """CRC-32 over every tensor the checkpoint holds (name, dtype, shape, bytes). It guards
    against torn or flipped bytes, not against tampering, and runs at memory speed
    (SHA-256 was ~3x slower: ~0.5 s per 384 MiB checkpoint on the engine thread)."""
    crc = 0
    for name, value in tree_flatten([c.state for c in cache]):
        arr = mx.contiguous(_as_saved(value))  # one tensor at a time: small transient copies
        mx.eval(arr)
        crc = zlib.crc32(f"{name}|{arr.dtype}|{tuple(arr.shape)}|".encode(), crc)
        if arr.size:
            crc = zlib.crc32(
                memoryview(arr if arr.dtype != mx.bfloat16 else arr.view(mx.uint16)), crc
            )
    return f"{crc:08x}"


# --------------------------------------------------------------------------- files


def checkpoint_path(session_dir: Path, n_tokens: int) -> Path:
    return Path(session_dir) / f"{PREFIX}{int(n_tokens):08d}{SUFFIX}"


def list_checkpoints(
    session_dir: Path, on_skip: Callable[[str], None] | None = None
) -> list[CheckpointInfo]:
    """Checkpoint files of one conversation (by name; contents unchecked), most tokens first.
    An entry named like one that is not a regular file (a FIFO, a link, a folder: never
    opened) is left out, and `on_skip` is told which and what it is."""
    found = []
    try:
        entries = list(os.scandir(session_dir))
    except OSError:
        return []
    for entry in entries:
        m = _NAME.match(entry.name)
        try:
            if not m:
                continue
            if not entry.is_file(follow_symlinks=False):
                if on_skip is not None:
                    on_skip(f"{entry.name}: {_not_regular(Path(entry.path))}")
                continue
            st = entry.stat(follow_symlinks=False)
        except OSError:  # evicted meanwhile (saves run on the engine thread)
            continue
        found.append(CheckpointInfo(Path(entry.path), int(m.group(1)), st.st_size, st.st_mtime_ns))
    found.sort(key=lambda c: (c.n_tokens, c.mtime_ns), reverse=True)
    return found


def _not_regular(path: Path) -> str:
    """What a checkpoint-named entry that is no regular file is, in words."""
    try:
        check_regular(path)
    except RefusedFile as e:
        return e.reason
    except OSError as e:
        return f"unreadable ({e.strerror or e})"
    return f"a symbolic link to {os.readlink(path)}, not a regular file (links are not followed)"


def remove_stale_temps(session_dir: Path, older_than_s: float = STALE_TEMP_S) -> int:
    """Delete the temp files killed saves left in this conversation's folder (their
    writer's pid is gone, or they are `older_than_s` old). Returns how many."""
    return len(remove_orphan_temps(Path(session_dir), depth=0, stale_s=older_than_s))


def _compact(cache: list[Any]) -> list[Any]:
    """A view of `cache` without the unused tail of preallocated (or trimmed) KV buffers,
    so a checkpoint holds exactly `offset` tokens. The cache itself is not changed."""
    out = []
    for c in cache:
        if type(c) is KVCache and c.keys is not None and c.keys.shape[2] != c.offset:
            n = c.offset
            out.append(KVCache.from_state((c.keys[..., :n, :], c.values[..., :n, :], n)))
        elif type(c) is QuantizedKVCache and c.keys is not None and c.keys[0].shape[2] != c.offset:
            n = c.offset
            keys = tuple(a[..., :n, :] for a in c.keys)
            values = tuple(a[..., :n, :] for a in c.values)
            out.append(QuantizedKVCache.from_state((keys, values, n, c.group_size, c.bits)))
        else:
            out.append(c)
    return out


# --------------------------------------------------------------------------- save


def _metadata(view: list[Any], tokens: Sequence[int], fingerprint: str) -> dict[str, str]:
    """The header a checkpoint is checked against when loaded: format, model, the exact
    tokens it covers, a checksum of its tensors and the cache classes to rebuild."""
    return {
        "ssdmoe_format": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "n_tokens": str(len(tokens)),
        "tokens_sha256": tokens_sha256(tokens),
        "state_crc32": _state_checksum(view),
        "mlx_lm_classes": ",".join(type(c).__name__ for c in view),
    }


def save_checkpoint(
    session_dir: Path,
    cache: list[Any],
    tokens: Sequence[int],
    fingerprint: str,
    *,
    keep: int = DEFAULT_KEEP,
    session_budget: int = DEFAULT_SESSION_BUDGET,
    global_budget: int = DEFAULT_GLOBAL_BUDGET,
) -> SaveResult:
    """Write a checkpoint of `cache`, which covers exactly `tokens`, then enforce the
    disk budgets. Atomic: until the final rename, the previous checkpoints are untouched.
    Run it on the engine thread (it reads the cache's MLX arrays)."""
    start = time.perf_counter()
    session_dir = Path(session_dir)
    for layer in cache:
        offset = getattr(layer, "offset", None)
        if isinstance(offset, int) and offset != len(tokens):
            raise ValueError(f"KV cache covers {offset} tokens but {len(tokens)} were given")
    view = _compact(cache)
    nbytes = sum(
        _as_saved(v).nbytes for _, v in tree_flatten([c.state for c in view]) if v is not None
    )
    for budget, what in ((session_budget, "per-conversation"), (global_budget, "global")):
        if nbytes > budget:
            return SaveResult(
                None,
                nbytes,
                time.perf_counter() - start,
                skipped=f"KV checkpoint not saved: {human_bytes(nbytes, 2)} is over the {what} "
                f"budget of {human_bytes(budget, 2)}",
            )
    metadata = _metadata(view, tokens, fingerprint)
    path = checkpoint_path(session_dir, len(tokens))

    def write(tmp: Path) -> None:
        # mx.save_safetensors appends ".safetensors" to other names: write there, move back.
        staged = tmp.with_name(tmp.name + SUFFIX)
        try:
            save_prompt_cache(str(staged), view, metadata)
            os.replace(staged, tmp)
        finally:
            staged.unlink(missing_ok=True)
        if _before_rename is not None:
            _before_rename(tmp)

    # Room for the tensors plus the JSON header: a full disk says how much it needed.
    atomic_write_via(path, write, suffix=SUFFIX, needed=nbytes + (1 << 16))
    evicted = enforce_budgets(
        session_dir,
        keep=keep,
        session_budget=session_budget,
        global_budget=global_budget,
        protect=path,
    )
    return SaveResult(path, path.stat().st_size, time.perf_counter() - start, evicted)


def enforce_budgets(
    session_dir: Path,
    *,
    keep: int = DEFAULT_KEEP,
    session_budget: int = DEFAULT_SESSION_BUDGET,
    global_budget: int = DEFAULT_GLOBAL_BUDGET,
    protect: Path | None = None,
) -> list[Path]:
    """Delete the oldest checkpoints until this conversation keeps at most `keep`
    within `session_budget`, and all conversations (the folders next to this one)
    stay within `global_budget`. `protect` (the one just written) is never deleted."""
    session_dir = Path(session_dir)
    evicted: list[Path] = []

    def drop(info: CheckpointInfo) -> None:
        try:
            info.path.unlink()
            evicted.append(info.path)
        except FileNotFoundError:
            pass

    mine = sorted(list_checkpoints(session_dir), key=lambda c: (c.mtime_ns, c.n_tokens))
    total = sum(c.size for c in mine)
    count = len(mine)
    for info in mine:  # oldest first
        if count <= max(keep, 1) and total <= session_budget:
            break
        if protect is not None and info.path == protect:
            continue
        drop(info)
        count -= 1
        total -= info.size

    everyone = sorted(_all_checkpoints(session_dir.parent), key=lambda c: c.mtime_ns)
    total = sum(c.size for c in everyone)
    for info in everyone:
        if total <= global_budget:
            break
        if protect is not None and info.path == protect:
            continue
        drop(info)
        total -= info.size
    return evicted


def _all_checkpoints(root: Path) -> Iterator[CheckpointInfo]:
    try:
        folders = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for folder in folders:
        yield from list_checkpoints(Path(folder))


# --------------------------------------------------------------------------- load


def read_metadata(path: Path) -> dict[str, str]:
    """The safetensors header's metadata, after checking the file is whole: the header
    passes checkpoint.header's checks and every tensor's bytes lie inside the file.
    Raises CheckpointInvalid naming the file."""
    name = Path(path).name
    try:
        header = read_header(path, label=name)
    except HeaderError as e:
        reason = e.reason
        if not reason.startswith(("truncated", "missing", "unreadable", "a ")):
            reason = f"corrupt header ({reason})"
        raise CheckpointInvalid(f"{name}: {reason}") from None
    # save_prompt_cache stores [our metadata, classes, scalars] flattened: ours is "0.<key>"
    meta = {k[2:]: v for k, v in header.metadata.items() if k.startswith("0.")}
    if meta.get("ssdmoe_format") is None:
        raise CheckpointInvalid(f"{name}: not an ssdmoe checkpoint")
    return meta


def check_checkpoint(path: Path, tokens: Sequence[int], fingerprint: str) -> int:
    """Validate a checkpoint's header against the model and the conversation's tokens;
    returns the number of tokens it covers. Raises CheckpointInvalid."""
    name = Path(path).name
    meta = read_metadata(path)
    if meta.get("ssdmoe_format") != FORMAT_VERSION:
        raise CheckpointInvalid(
            f"{name}: checkpoint format {meta.get('ssdmoe_format')!r}, this version reads "
            f"{FORMAT_VERSION!r}"
        )
    if meta.get("fingerprint") != fingerprint:
        raise CheckpointInvalid(f"{name}: made with another model (fingerprint differs)")
    try:
        n = int(meta.get("n_tokens", ""))
    except ValueError:
        raise CheckpointInvalid(f"{name}: corrupt metadata (n_tokens)") from None
    if n <= 0:
        raise CheckpointInvalid(f"{name}: corrupt metadata (n_tokens {n})")
    if n > len(tokens):
        raise NotApplicable(f"{name}: covers {n} tokens, the conversation has {len(tokens)}")
    if meta.get("tokens_sha256") != tokens_sha256(tokens[:n]):
        raise NotApplicable(f"{name}: its tokens differ from the conversation's")
    return n


@dataclass(frozen=True)
class CacheShape:
    """What the model's attention caches hold per token: key/value heads, head size and
    dtype (0 / "": not known, not checked). A checkpoint whose bytes were reshaped
    (`[1, 2, T, 64]` as `[1, 4, T/2, 64]`: same bytes, same checksum) is refused by it."""

    kv_heads: int = 0
    head_dim: int = 0
    dtype: str = ""

    @classmethod
    def of_info(cls, info: Any) -> CacheShape:
        """From an engine's ModelInfo (its folder and dtype); nothing known: no checks."""
        folder, dtype = getattr(info, "path", ""), str(getattr(info, "dtype", "") or "")
        return cls.of_model(folder, dtype) if folder else cls(dtype=dtype)

    @classmethod
    def of_model(cls, folder: str | Path, dtype: str = "") -> CacheShape:
        """From the model folder's config.json (text_config when nested)."""
        from ssdmoe_tui.checkpoint.arch import text_config
        from ssdmoe_tui.checkpoint.config import read_config

        try:
            tc = text_config(read_config(Path(folder)))
        except SsdmoeError:
            return cls(dtype=dtype)

        def num(key: str) -> int:
            v = tc.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0

        heads = num("num_attention_heads")
        head_dim = num("head_dim") or (num("hidden_size") // heads if heads else 0)
        return cls(num("num_key_value_heads") or heads, head_dim, dtype)


def check_shapes(cache: list[Any], shape: CacheShape, n_tokens: int, name: str) -> None:
    """Each attention layer's keys and values: [batch, heads, >= n_tokens, head size] of
    the model's numbers and dtype; CheckpointInvalid naming the file otherwise."""
    for i, layer in enumerate(cache):
        if type(layer).__name__ != "KVCache":
            continue  # quantized KV, recurrent state: their own layouts (checksum-checked)
        keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
        if keys is None or values is None:
            continue
        why = ""
        if keys.ndim != 4 or values.ndim != 4 or keys.shape[:3] != values.shape[:3]:
            why = f"keys {list(keys.shape)} and values {list(values.shape)} do not pair"
        elif keys.shape[2] < n_tokens:
            why = f"holds {keys.shape[2]} positions for {n_tokens} tokens"
        elif shape.kv_heads and keys.shape[1] != shape.kv_heads:
            why = f"{keys.shape[1]} key/value heads, the model has {shape.kv_heads}"
        elif shape.head_dim and keys.shape[3] != shape.head_dim:
            why = f"head size {keys.shape[3]}, the model's is {shape.head_dim}"
        elif shape.dtype and str(keys.dtype).rsplit(".", 1)[-1] != shape.dtype:
            why = f"dtype {str(keys.dtype).rsplit('.', 1)[-1]}, the model runs {shape.dtype}"
        if why:
            raise CheckpointInvalid(f"{name}: layer {i} does not fit this model ({why})")


def load_checkpoint(
    session_dir: Path,
    tokens: Sequence[int],
    fingerprint: str,
    *,
    on_skip: Callable[[str], None] | None = None,
    shape: CacheShape | None = None,
) -> tuple[list[Any], int]:
    """Load the checkpoint that covers the longest prefix of `tokens`.

    Returns (cache, n_tokens): feed `tokens[n_tokens:]` next. A checkpoint that is
    truncated, corrupt, from another model or format, or for other tokens is skipped
    (its one-line reason goes to `on_skip`) and the next one is tried. Raises
    CheckpointInvalid with the best candidate's reason if none is usable, or NoCheckpoint
    if none applies (none saved, or only sound ones for other tokens: not reported)."""
    session_dir = Path(session_dir)
    remove_stale_temps(session_dir)
    reasons: list[str] = []
    for info in list_checkpoints(session_dir, on_skip):
        try:
            n = check_checkpoint(info.path, tokens, fingerprint)
            cache, _ = _load_verified(info.path, n)
            check_shapes(cache, shape or CacheShape(), n, info.path.name)
        except NotApplicable:
            continue
        except CheckpointInvalid as e:
            reasons.append(e.reason)
            if on_skip is not None:
                on_skip(e.reason)
            continue
        return cache, n
    if not reasons:
        raise NoCheckpoint(f"no KV checkpoint for these tokens in {session_dir.name}")
    raise CheckpointInvalid(reasons[0])


def checkpoint_covers(session_dir: Path, tokens: Sequence[int], fingerprint: str) -> int:
    """How many tokens `load_checkpoint` would most likely serve, from the headers alone
    (a checkpoint whose tensors turn out corrupt is skipped by the load); 0: none."""
    for info in list_checkpoints(Path(session_dir)):
        try:
            return check_checkpoint(info.path, tokens, fingerprint)
        except (CheckpointInvalid, OSError):
            continue
    return 0


def _load_verified(path: Path, n_tokens: int) -> tuple[list[Any], dict[str, str]]:
    name = path.name
    try:
        cache, meta = load_prompt_cache(str(path), return_metadata=True)
    except Exception as e:  # noqa: BLE001 - any failure to parse means "corrupt"
        raise CheckpointInvalid(f"{name}: corrupt ({type(e).__name__})") from None
    try:
        digest = _state_checksum(cache)
    except Exception as e:  # noqa: BLE001
        raise CheckpointInvalid(f"{name}: corrupt ({type(e).__name__})") from None
    if digest != meta.get("state_crc32"):
        raise CheckpointInvalid(f"{name}: corrupt (tensor checksum mismatch)")
    for layer in cache:
        offset = getattr(layer, "offset", None)
        if isinstance(offset, int) and offset != n_tokens:
            raise CheckpointInvalid(
                f"{name}: corrupt (a layer holds {offset} tokens, not {n_tokens})"
            )
    return cache, meta
