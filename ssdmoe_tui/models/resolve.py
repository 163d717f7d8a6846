"""Turn `--model` into a local folder: a path, or a Hub repo id found in / fetched into the HF cache.

All cache handling is huggingface_hub's (`snapshot_download`, `local_files_only=True`
first), so HF_HOME, HF_HUB_CACHE and HF_HUB_OFFLINE mean what they mean everywhere
else in the MLX ecosystem. A download fetches only what the engine reads, reports
bytes / speed / ETA through a callback, and resumes after an interruption (the hub
keeps `.incomplete` blobs and continues them with HTTP range requests).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ssdmoe_tui.errors import BadValueError, ModelError, SsdmoeError
from ssdmoe_tui.models import registry
from ssdmoe_tui.models.scan import missing_shards, read_config
from ssdmoe_tui.units import human_bytes

#: What a checkpoint needs: weights, configs + tokenizer.json, templates, tokenizer files and
#: the small remote-code files. The same list as mlx-lm's `DEFAULT_ALLOW_PATTERNS`, so a model
#: fetched by `mlx_lm.generate` is complete for ssdmoe and vice versa (the hub's offline
#: completeness check filters by these patterns).
ALLOW_PATTERNS: list[str] = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


@dataclass(frozen=True)
class DownloadProgress:
    """A snapshot of a running download; `total_bytes` is 0 while unknown."""

    repo_id: str
    downloaded_bytes: int
    total_bytes: int
    files_done: int
    files_total: int
    bytes_per_s: float
    eta_s: float | None
    done: bool = False

    @property
    def fraction(self) -> float:
        if self.total_bytes <= 0:
            return 1.0 if self.done else 0.0
        return min(1.0, self.downloaded_bytes / self.total_bytes)


ProgressCallback = Callable[[DownloadProgress], None]


class DownloadCancelled(SsdmoeError):
    """The caller set the cancel event; finished files stay in the cache for next time."""


DEMO_NAME = "demo"  # `--model demo`: the embedded demo model


@dataclass(frozen=True)
class ModelSpec:
    """A parsed `--model`: exactly one of `path` / `repo_id` is set (neither: the demo)."""

    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        if self.repo_id is None:
            return DEMO_NAME
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def _looks_like_path(spec: str) -> bool:
    head = spec.partition("@")[0]  # a revision may contain "/" (refs/pr/1)
    return (
        spec.startswith(("/", "./", "../", "~", "."))
        or "\\" in spec
        or head.count("/") >= 2
        or head.endswith((".gguf", ".safetensors", ".json"))
    )


def parse_spec(spec: str | None) -> ModelSpec:
    """Local folder if one exists at `spec`, else `org/name[@revision]`."""
    spec = (spec or "").strip()
    if not spec or spec == DEMO_NAME:
        return ModelSpec()  # "demo": what `ssdmoe models` lists it as (./demo: a folder)
    local = Path(spec).expanduser()
    if local.exists():
        return ModelSpec(path=Path(os.path.abspath(local)))
    if _looks_like_path(spec):
        raise ModelError(f"--model {spec}: no such file or folder")
    repo_id, _, revision = spec.partition("@")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        raise BadValueError(
            f"--model {spec!r}: not a folder and not a Hub repo id (org/name[@revision])"
        ) from None
    if "@" in spec and not revision:
        raise BadValueError(f"--model {spec!r}: empty revision after '@'")
    if revision:
        check_revision(revision, spec)
    return ModelSpec(repo_id=repo_id, revision=revision or None)


_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REF_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]*$")


def check_revision(revision: str, spec: str = "") -> str:
    """A revision the hub cache can hold: a 40-hex commit, or a branch/tag name as git
    allows it (parts of letters, digits, `._+-`, joined by single `/`: `main`, `v1.0`,
    `refs/pr/1`). Anything else (`..`, a leading `/`, `\\`, control characters) could name
    a path outside the cache, so it is refused before any file is read."""
    shown = spec or revision
    if _COMMIT.match(revision):
        return revision
    parts = revision.split("/")
    ok = (
        len(revision) <= 255
        and all(_REF_PART.match(p) for p in parts)
        and ".." not in revision
        and not revision.endswith((".lock", "."))
    )
    if not ok:
        raise BadValueError(
            f"--model {shown!r}: {revision[:60]!r} is not a revision (a branch or tag name, "
            "or a 40-hex commit)"
        )
    return revision


def _inside_cache(folder: Path, spec: ModelSpec, cache_dir) -> Path:
    """`folder` if it is a snapshot of `spec`'s repo in the hub cache; a planted ref file
    (refs/<branch> naming `../../x`) cannot send the resolution elsewhere."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    root = Path(cache_dir or constants.HF_HUB_CACHE)
    snapshots = root / repo_folder_name(repo_id=spec.repo_id or "", repo_type="model") / "snapshots"
    real = Path(os.path.realpath(folder))
    if real.parent != Path(os.path.realpath(snapshots)) or not _COMMIT.match(real.name):
        raise ModelError(
            f"--model {spec}: the Hugging Face cache ref points outside {snapshots} "
            f"(to {folder}); refusing it"
        )
    return folder


def _check_folder(folder: Path, check: bool) -> Path:
    if folder.is_file():
        if folder.suffix == ".gguf":
            raise registry.refuse_gguf(folder)
        if folder.name == "config.json":
            folder = folder.parent
        else:
            raise ModelError(f"{folder}: a file, not a model folder")
    if not folder.is_dir() and folder.exists():
        raise ModelError(f"{folder}: not a file or a folder (a FIFO or a device?)")
    cfg = folder / "config.json"
    if not cfg.exists() and not cfg.is_symlink():  # a FIFO or a folder: read_config says so
        ggufs = sorted(folder.glob("*.gguf"))
        if ggufs:
            raise registry.refuse_gguf(ggufs[0])
        raise ModelError(f"{folder}: no config.json (not a Hugging Face / MLX model folder)")
    if check or not cfg.is_file():
        registry.check_supported(read_config(folder), folder)
    return folder


def resolve_model(
    spec: str | None,
    progress: ProgressCallback | None = None,
    *,
    cache_dir: Path | str | None = None,
    endpoint: str | None = None,
    check: bool = True,
    cancel: threading.Event | None = None,
) -> Path | None:
    """The folder holding the model `spec` names, downloading it if needed and allowed.

    None or "" means the demo model: its folder when `ssdmoe_tui.models.demo` can make
    it, else None (the caller decides). With `check`, the model must be one the engine
    streams (`registry.check_supported`). `cache_dir` / `endpoint` default to the hub's
    (HF_HUB_CACHE / HF_ENDPOINT). Setting `cancel` (from another thread) stops a download
    within one chunk (`DownloadCancelled`). Raises `SsdmoeError`s with one-line messages.
    """
    parsed = parse_spec(spec)
    if parsed.path is not None:
        return _check_folder(parsed.path, check)
    if parsed.repo_id is None:
        try:
            from ssdmoe_tui.models.demo import ensure_demo_model
        except ImportError:
            return None
        return _check_folder(Path(ensure_demo_model()), check)
    folder = _from_hub(parsed, progress, cache_dir, endpoint, cancel)
    return _check_folder(folder, check)


# --------------------------------------------------------------------------- hub


#: The way in without the Hub: a model folder copied from a machine that has it.
COPY_HINT = (
    "copy the model folder from a machine that has it and run `ssdmoe --model /path/to/folder`"
)


def _offline() -> bool:
    from huggingface_hub import constants

    is_offline = getattr(constants, "is_offline_mode", None)
    return bool(is_offline() if callable(is_offline) else constants.HF_HUB_OFFLINE)


def _cache_label(cache_dir: Path | str | None) -> str:
    from huggingface_hub import constants

    return str(cache_dir or constants.HF_HUB_CACHE)


def _complete(folder: Path) -> str | None:
    """Why a cached snapshot cannot be used yet, or None when it can."""
    if not (folder / "config.json").is_file():
        return "config.json missing"
    missing = missing_shards(folder)
    if missing:
        return f"{len(missing)} shard(s) missing, e.g. {missing[0]}"
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.gguf")):
        return "no safetensors weights"
    return None


def _from_hub(
    spec: ModelSpec,
    progress: ProgressCallback | None,
    cache_dir,
    endpoint: str | None,
    cancel: threading.Event | None = None,
) -> Path:
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo = str(spec)
    problem = "not in the Hugging Face cache"
    try:
        folder = Path(
            snapshot_download(
                spec.repo_id,
                revision=spec.revision,
                cache_dir=cache_dir,
                allow_patterns=ALLOW_PATTERNS,
                local_files_only=True,
            )
        )
        folder = _inside_cache(folder, spec, cache_dir)
        why = _complete(folder)
        if why is None:
            return folder
        problem = f"only partly in the Hugging Face cache ({why})"
    except LocalEntryNotFoundError as e:
        incomplete = getattr(hf_errors, "IncompleteSnapshotError", None)
        if incomplete is not None and isinstance(e, incomplete):
            problem = "only partly in the Hugging Face cache"
    if _offline():
        raise ModelError(
            f"{repo} is {problem} ({_cache_label(cache_dir)}) and HF_HUB_OFFLINE=1 forbids "
            f"downloading: fetch it with `HF_HUB_OFFLINE=0 ssdmoe models fetch {repo}`, or "
            + COPY_HINT
        )
    return download_model(
        spec, progress, cache_dir=cache_dir, endpoint=endpoint, problem=problem, cancel=cancel
    )


def _hub_error(exc: Exception, spec: ModelSpec, cache_dir, problem: str) -> SsdmoeError:
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo = str(spec)
    if isinstance(exc, GatedRepoError):
        return ModelError(
            f"{spec.repo_id} is gated on the Hub: accept its terms on huggingface.co and "
            "log in with `hf auth login`"
        )
    if isinstance(exc, RevisionNotFoundError):
        return ModelError(f"{spec.repo_id} has no revision {spec.revision!r} on the Hub")
    if isinstance(exc, RepositoryNotFoundError):
        return ModelError(
            f"no model {spec.repo_id} on the Hub (check the spelling; private repos need "
            "`hf auth login`)"
        )
    if isinstance(exc, OfflineModeIsEnabled):
        return ModelError(
            f"{repo} is {problem} ({_cache_label(cache_dir)}) and HF_HUB_OFFLINE=1 forbids "
            f"downloading: fetch it with `HF_HUB_OFFLINE=0 ssdmoe models fetch {repo}`, or "
            + COPY_HINT
        )
    reason = " ".join(str(exc).split())[:80] or type(exc).__name__
    failed = isinstance(exc, HfHubHTTPError | OSError) and not _is_transport(exc)
    if failed and not isinstance(exc, LocalEntryNotFoundError):
        return ModelError(
            f"downloading {repo} failed ({reason}); run `ssdmoe models fetch {repo}` again "
            "to resume (finished files are kept)"
        )
    return ModelError(
        f"{repo} is {problem} ({_cache_label(cache_dir)}) and the Hub is unreachable: "
        + COPY_HINT
        + f", or connect and try again ({reason})"
    )


def _is_transport(exc: BaseException) -> bool:
    """Connection / timeout errors of the HTTP stack (they share no base class we can import)."""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    root = type(exc).__module__.split(".")[0]
    return root in ("httpx", "httpx2", "httpcore", "requests", "urllib3")


def download_model(
    spec: ModelSpec | str,
    progress: ProgressCallback | None = None,
    *,
    cache_dir: Path | str | None = None,
    endpoint: str | None = None,
    problem: str = "not in the Hugging Face cache",
    cancel: threading.Event | None = None,
) -> Path:
    """Fetch the files the engine needs into the hub cache (resuming partial files).

    The repo's config is fetched and checked first, so an unsupported model is refused
    before gigabytes move.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import filter_repo_objects

    if isinstance(spec, str):
        spec = parse_spec(spec)
    if spec.repo_id is None:
        raise BadValueError(f"--model {spec}: downloads need a Hub repo id (org/name)")
    repo_id = spec.repo_id
    try:
        info = _checked_repo(repo_id, spec.revision, cache_dir, endpoint)
        wanted = list(
            filter_repo_objects(
                info.siblings or [], allow_patterns=ALLOW_PATTERNS, key=lambda s: s.rfilename
            )
        )
        total = sum(
            int(s.size or 0)
            for s in wanted
            if not _cached(repo_id, s.rfilename, info.sha, cache_dir)
        )
        tracker = _Tracker(repo_id, progress, total, cancel)
        folder = snapshot_download(
            repo_id,
            revision=spec.revision,
            cache_dir=cache_dir,
            endpoint=endpoint,
            allow_patterns=ALLOW_PATTERNS,
            tqdm_class=tracker.bar_class(),  # type: ignore[arg-type]
        )
        tracker.finish()
    except SsdmoeError:
        raise
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise _hub_error(e, spec, cache_dir, problem) from None
    except Exception as e:  # noqa: BLE001 - transport errors (connect, timeout) have no common base
        if _is_transport(e):
            raise _hub_error(e, spec, cache_dir, problem) from None
        raise
    folder_path = _inside_cache(Path(folder), spec, cache_dir)
    why = _complete(folder_path)
    if why is not None:
        raise ModelError(f"{repo_id}: download finished but the snapshot is incomplete ({why})")
    return folder_path


def _checked_repo(repo_id: str, revision: str | None, cache_dir, endpoint: str | None):  # noqa: ANN001, ANN202 - huggingface_hub's ModelInfo
    """The repo's file list, refused unless it has safetensors weights and a config.json
    of a supported model (fetched and checked before any weight moves)."""
    import json

    from huggingface_hub import HfApi, hf_hub_download

    info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    names = [s.rfilename for s in info.siblings or []]
    if not any(n.endswith(".safetensors") for n in names):
        ggufs = [n for n in names if n.endswith(".gguf")]
        if ggufs:
            raise registry.refuse_gguf(Path(f"{repo_id}/{ggufs[0]}"))
        raise ModelError(f"{repo_id} has no safetensors weights on the Hub")
    if "config.json" not in names:
        raise ModelError(f"{repo_id} has no config.json on the Hub")
    cfg_path = hf_hub_download(
        repo_id, "config.json", revision=info.sha, cache_dir=cache_dir, endpoint=endpoint
    )
    try:
        config = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
    except ValueError as e:
        raise ModelError(f"{repo_id}: config.json on the Hub is not valid JSON ({e})") from None
    registry.check_supported(config)
    return info


def _cached(repo_id: str, filename: str, revision: str | None, cache_dir) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    return isinstance(found, str)


# --------------------------------------------------------------------------- progress


class _Tracker:
    """Collects huggingface_hub's progress-bar updates into `DownloadProgress` callbacks.

    `snapshot_download(tqdm_class=...)` instantiates the class for its aggregate byte bars
    (`unit="B"`) and for its files bar; we count bytes written to disk and files done.
    """

    WINDOW_S = 5.0
    MIN_INTERVAL_S = 0.1

    def __init__(
        self,
        repo_id: str,
        callback: ProgressCallback | None,
        total_bytes: int,
        cancel: threading.Event | None = None,
    ):
        self.repo_id = repo_id
        self.cancel = cancel
        self.callback = callback
        self.total = total_bytes
        self.bar_total = 0
        self.done_bytes = 0
        self.files_done = 0
        self.files_total = 0
        self.samples: deque[tuple[float, int]] = deque()
        self.lock = threading.Lock()
        self.last_emit = 0.0
        self.started = time.monotonic()

    def _rate(self, now: float) -> float:
        while len(self.samples) > 1 and now - self.samples[0][0] > self.WINDOW_S:
            self.samples.popleft()
        if len(self.samples) < 2:
            elapsed = now - self.started
            return self.done_bytes / elapsed if elapsed > 0.5 else 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0

    def snapshot(self, done: bool = False) -> DownloadProgress:
        now = time.monotonic()
        total = max(self.total, self.bar_total, self.done_bytes if done else 0)
        rate = self._rate(now)
        left = max(0, total - self.done_bytes)
        eta = 0.0 if done else (left / rate if rate > 0 and total else None)
        return DownloadProgress(
            repo_id=self.repo_id,
            downloaded_bytes=self.done_bytes,
            total_bytes=total,
            files_done=self.files_done,
            files_total=self.files_total,
            bytes_per_s=rate,
            eta_s=eta,
            done=done,
        )

    def _emit(self, force: bool = False, done: bool = False) -> None:
        if self.callback is None:
            return
        now = time.monotonic()
        if not force and now - self.last_emit < self.MIN_INTERVAL_S:
            return
        self.last_emit = now
        self.callback(self.snapshot(done))

    def check_cancel(self) -> None:
        """Raised inside the hub's download threads: the partial file is removed, the
        finished ones stay, and `snapshot_download` re-raises it to the caller."""
        if self.cancel is not None and self.cancel.is_set():
            self._abort_xet()
            raise DownloadCancelled(
                f"download of {self.repo_id} cancelled; run `ssdmoe models fetch "
                f"{self.repo_id}` to resume (finished files are kept)"
            )

    def _abort_xet(self) -> None:
        """Xet transfers run in Rust and report through callbacks; stop them too (what the
        hub itself does on KeyboardInterrupt). Private hub API, so best effort."""
        if getattr(self, "_xet_aborted", False):
            return
        self._xet_aborted = True
        try:
            from huggingface_hub.utils._xet import abort_xet_session
        except ImportError:
            return
        try:
            abort_xet_session()
        except Exception:  # noqa: BLE001 - never let the abort mask the cancellation
            pass

    def add_bytes(self, n: float) -> None:
        with self.lock:
            self.done_bytes += int(n)
            self.samples.append((time.monotonic(), self.done_bytes))
            self._emit()

    def add_file(self, n: float) -> None:
        with self.lock:
            self.files_done += int(n)
            self._emit(force=True)

    def finish(self) -> None:
        with self.lock:
            self._emit(force=True, done=True)

    def bar_class(self) -> type:
        tracker = self

        class _Bar:
            """Mimics the parts of tqdm that huggingface_hub calls; renders nothing."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.desc = str(kwargs.get("desc") or "")
                self.unit = kwargs.get("unit", "it")
                self.n = 0
                self._total = kwargs.get("total") or 0
                # Bytes written to disk ("Reconstructing..."); the transfer bar counts network
                # bytes of the same data, so it is ignored.
                self.kind = (
                    "files"
                    if self.unit != "B"
                    else ("transfer" if self.desc.startswith("Downloading") else "bytes")
                )
                if self.kind == "files":
                    with tracker.lock:
                        tracker.files_total = int(self._total)
                if kwargs.get("initial"):
                    self.update(kwargs["initial"])

            @property
            def total(self) -> float:
                return self._total

            @total.setter
            def total(self, value: float) -> None:
                self._total = value or 0
                if self.kind == "bytes":
                    tracker.bar_total = int(self._total)

            def update(self, n: float | None = 1) -> None:
                tracker.check_cancel()
                n = n or 0
                self.n += n
                if self.kind == "bytes":
                    tracker.add_bytes(n)
                elif self.kind == "files":
                    tracker.add_file(n)

            def __enter__(self) -> _Bar:
                return self

            def __exit__(self, *exc: object) -> None:
                self.close()

            def close(self) -> None:
                pass

            def __getattr__(self, name: str) -> Callable[..., None]:
                # refresh, set_description(_str), set_postfix_str, clear, ...: nothing to draw.
                if name.startswith("__"):
                    raise AttributeError(name)
                return lambda *a, **k: None

        return _Bar


def _fmt_eta(s: float | None) -> str:
    if s is None:
        return "--:--"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def format_progress(p: DownloadProgress) -> str:
    """`mlx-community/X  1.2 GiB / 19.5 GiB  6%  45.3 MiB/s  ETA 06:52  3/14 files`."""
    total = human_bytes(p.total_bytes) if p.total_bytes else "?"
    pct = f"{p.fraction * 100:3.0f}%"
    files = f"{p.files_done}/{p.files_total} files" if p.files_total else ""
    return (
        f"{p.repo_id}  {human_bytes(p.downloaded_bytes)} / {total}  {pct}  "
        f"{human_bytes(p.bytes_per_s)}/s  ETA {_fmt_eta(p.eta_s)}  {files}"
    ).rstrip()


def cli_progress(stream: IO[str] | None = None) -> ProgressCallback:
    """A progress callback for terminals: one rewritten line on a TTY, a line per 5 s otherwise."""
    out = stream or sys.stderr
    tty = out.isatty()
    state = {"last": 0.0}

    def show(p: DownloadProgress) -> None:
        line = format_progress(p)
        if tty:
            out.write("\r\x1b[2K" + line + ("\n" if p.done else ""))
        else:
            now = time.monotonic()
            if not p.done and now - state["last"] < 5.0:
                return
            state["last"] = now
            out.write(line + "\n")
        out.flush()

    return show
