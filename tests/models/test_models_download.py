"""Downloads through huggingface_hub against a local HTTP server that speaks the Hub API.

The server serves a real fake-checkpoint folder the way huggingface.co does for plain
(non-Xet) files: model info with file metadata, the recursive tree listing, and
`resolve/<rev>/<file>` with HEAD metadata (X-Repo-Commit, ETag) and byte ranges. It can
cut a response short once (a dropped connection) or fail a file (an interrupted run),
and it records every request, so the tests see exactly what was fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from ssdmoe_tui.errors import ModelError, UnsupportedModelError
from ssdmoe_tui.models.resolve import DownloadProgress, format_progress, resolve_model
from tests.helpers.cli_runner import run_cli
from tests.helpers.fakes import fake_config, write_checkpoint

ROOT = Path(__file__).resolve().parents[2]
REPO = "test-org/Tiny-MoE-4bit"


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str

    def sha256(self, name: str) -> str:
        return hashlib.sha256(self.files[name]).hexdigest()

    def sha1(self, name: str) -> str:
        data = self.files[name]
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    cut_once: dict[str, int] = field(default_factory=dict)  # file -> bytes sent before a drop
    fail: set[str] = field(default_factory=set)  # files answered with 500
    delay_s: float = 0.0  # per 64 KiB chunk, so progress has time to be seen
    slow: dict[str, float] = field(default_factory=dict)  # per-file delay_s
    log: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    url: str = ""

    def gets(self, suffix: str = "") -> list[tuple[str, str, str | None]]:
        return [
            e for e in self.log if e[0] == "GET" and "/resolve/" in e[1] and e[1].endswith(suffix)
        ]


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _json(self, obj, status: int = 200) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _not_found(self) -> None:
            body = b'{"error": "Repository not found"}'
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("X-Error-Message", "Repository not found")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _repo(self, parts: list[str]) -> tuple[str, FakeRepo | None]:
            repo_id = "/".join(parts[:2])
            return repo_id, hub.repos.get(repo_id)

        def do_HEAD(self) -> None:
            self._serve(head=True)

        def do_GET(self) -> None:
            self._serve(head=False)

        def _serve(self, head: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.log.append(("HEAD" if head else "GET", path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"]:
                repo_id, repo = self._repo(parts[2:])
                if repo is None:
                    return self._not_found()
                rest = parts[4:]
                if not rest or rest[0] == "revision":
                    return self._json(
                        {
                            "id": repo_id,
                            "sha": repo.commit,
                            "private": False,
                            "siblings": [
                                {
                                    "rfilename": n,
                                    "size": len(d),
                                    "blobId": repo.sha1(n),
                                    "lfs": {
                                        "size": len(d),
                                        "sha256": repo.sha256(n),
                                        "pointerSize": 134,
                                    },
                                }
                                for n, d in sorted(repo.files.items())
                            ],
                        }
                    )
                if rest[0] == "tree":
                    return self._json(
                        [
                            {
                                "type": "file",
                                "path": n,
                                "size": len(d),
                                "oid": repo.sha1(n),
                                "lfs": {"oid": repo.sha256(n), "size": len(d), "pointerSize": 134},
                            }
                            for n, d in sorted(repo.files.items())
                        ]
                    )
                return self._not_found()
            # /{org}/{name}/resolve/{rev}/{file}
            repo_id, repo = self._repo(parts)
            if repo is None or len(parts) < 5 or parts[2] != "resolve":
                return self._not_found()
            name = "/".join(parts[4:])
            if name not in repo.files:
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = repo.files[name]
            if not head and name in hub.fail:
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            rng = self.headers.get("Range")
            if rng and not head:
                start = int(rng.split("=")[1].split("-")[0])
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{repo.sha256(name)}"')
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if head:
                return
            body = data[start:]
            cut = hub.cut_once.pop(name, None)
            if cut is not None:
                body = body[:cut]
            delay = hub.slow.get(name, hub.delay_s)
            try:
                for i in range(0, len(body), 1 << 16):
                    self.wfile.write(body[i : i + (1 << 16)])
                    if delay:
                        time.sleep(delay)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (cancelled)
                return
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True  # drop: fewer bytes than Content-Length

    return Handler


@pytest.fixture
def fake_hub(tmp_path: Path):
    hub = FakeHub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield hub
    server.shutdown()
    server.server_close()


def _publish(hub: FakeHub, repo_id: str, folder: Path, extra: dict[str, bytes] | None = None):
    files = {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
    files |= extra or {}
    hub.repos[repo_id] = FakeRepo(files, hashlib.sha1(repo_id.encode()).hexdigest())
    return hub.repos[repo_id]


def _publish_in_chunks(hub: FakeHub, src: Path, shards: int, monkeypatch) -> FakeRepo:  # noqa: ANN001
    """A 16-expert checkpoint published as REPO, downloaded in 64 KiB chunks (the hub
    writes 10 MiB ones and resumes or stops only at a chunk's end: small ones let a
    shard of a few MB show it)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    write_checkpoint(src, fake_config(experts=16, hidden=256, inter=128), shards=shards)
    return _publish(hub, REPO, src)


@pytest.fixture
def online(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


def test_download_fetches_only_needed_files_with_progress(fake_hub, tmp_path: Path, online):
    src = tmp_path / "src"
    write_checkpoint(src, fake_config(layers=4, experts=16, hidden=256, inter=128), shards=3)
    repo = _publish(
        fake_hub,
        REPO,
        src,
        extra={"README.md": b"# card", "pytorch_model.bin": b"\0" * 4096, "x.gguf": b"GGUF"},
    )
    fake_hub.delay_s = 0.02
    events: list[DownloadProgress] = []
    cache = tmp_path / "hub"
    folder = resolve_model(REPO, events.append, cache_dir=cache, endpoint=fake_hub.url)

    assert folder is not None and folder.name == repo.commit
    wanted = {n for n in repo.files if n.endswith((".safetensors", ".json", ".jinja"))}
    assert {p.name for p in folder.iterdir()} == wanted
    for n in wanted:
        assert (folder / n).read_bytes() == repo.files[n]
    fetched = {e[1].rsplit("/", 1)[1] for e in fake_hub.gets()}
    assert fetched == wanted  # README, .bin and .gguf never requested

    assert events and events[-1].done
    last = events[-1]
    big = sum(len(repo.files[n]) for n in wanted if n != "config.json")
    assert last.downloaded_bytes == last.total_bytes == big  # config.json came first, alone
    assert last.files_done == last.files_total == len(wanted)
    assert last.fraction == 1.0 and last.eta_s == 0.0
    seen = [e.downloaded_bytes for e in events]
    assert seen == sorted(seen)
    assert any(0 < e.downloaded_bytes < big and e.bytes_per_s > 0 for e in events)
    assert all(e.total_bytes == big for e in events)
    assert REPO in format_progress(last) and "100%" in format_progress(last)

    # Now cached: resolving again is offline and makes no request.
    n_requests = len(fake_hub.log)
    assert resolve_model(REPO, cache_dir=cache, endpoint=fake_hub.url) == folder
    assert len(fake_hub.log) == n_requests


def test_dropped_connection_resumes_with_a_range_request(
    fake_hub, tmp_path: Path, online, monkeypatch
):
    repo = _publish_in_chunks(fake_hub, tmp_path / "src", 1, monkeypatch)
    shard = "model-00001-of-00001.safetensors"
    cut = (len(repo.files[shard]) // 2) & ~0xFFFF  # on a chunk boundary
    fake_hub.cut_once[shard] = cut
    folder = resolve_model(REPO, cache_dir=tmp_path / "hub", endpoint=fake_hub.url)
    assert (folder / shard).read_bytes() == repo.files[shard]
    ranges = [r for _, _, r in fake_hub.gets(shard)]
    assert ranges == [None, f"bytes={cut}-"]


def test_interrupted_download_resumes_without_refetching(fake_hub, tmp_path: Path, online):
    src = tmp_path / "src"
    write_checkpoint(src, fake_config(), shards=3)
    _publish(fake_hub, REPO, src)
    cache = tmp_path / "hub"
    fake_hub.fail = {"model-00003-of-00003.safetensors"}
    with pytest.raises(ModelError) as e:
        resolve_model(REPO, cache_dir=cache, endpoint=fake_hub.url)
    assert REPO in str(e.value) and "\n" not in str(e.value)
    assert "again to resume" in str(e.value)
    done_first = {e[1].rsplit("/", 1)[1] for e in fake_hub.gets()}
    assert "model-00001-of-00003.safetensors" in done_first

    # Offline, the partial snapshot is named as such.
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = True
    try:
        with pytest.raises(ModelError, match="only partly"):
            resolve_model(REPO, cache_dir=cache)
    finally:
        constants.HF_HUB_OFFLINE = False

    failed, fake_hub.fail = fake_hub.fail, set()
    fake_hub.log.clear()
    folder = resolve_model(REPO, cache_dir=cache, endpoint=fake_hub.url)
    assert (folder / "model-00003-of-00003.safetensors").is_file()
    second = [e[1].rsplit("/", 1)[1] for e in fake_hub.gets()]
    assert "model-00003-of-00003.safetensors" in second
    # Finished files are not fetched again. Which files the first try began besides the
    # first shard is a race: when one download fails the hub cancels those its threads
    # have not started yet (hf_thread_map), and those are fetched now.
    assert not set(second) & (done_first - failed), second


def test_unsupported_repos_are_refused_before_downloading(fake_hub, tmp_path: Path, online):
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text('{"model_type": "qwen3", "hidden_size": 64}')
    (dense / "model.safetensors").write_bytes(b"\0" * 1024)
    _publish(fake_hub, "test-org/Dense", dense)
    with pytest.raises(UnsupportedModelError, match="dense"):
        resolve_model("test-org/Dense", cache_dir=tmp_path / "hub", endpoint=fake_hub.url)
    assert [e[1] for e in fake_hub.gets()] == [
        "/test-org/Dense/resolve/" + fake_hub.repos["test-org/Dense"].commit + "/config.json"
    ]

    gguf = tmp_path / "gguf"
    gguf.mkdir()
    (gguf / "Model-Q4_K_M.gguf").write_bytes(b"GGUF")
    _publish(fake_hub, "test-org/Model-GGUF", gguf)
    fake_hub.log.clear()
    with pytest.raises(UnsupportedModelError, match="GGUF"):
        resolve_model("test-org/Model-GGUF", cache_dir=tmp_path / "hub", endpoint=fake_hub.url)
    assert fake_hub.gets() == []

    with pytest.raises(ModelError, match="no model test-org/Nope on the Hub"):
        resolve_model("test-org/Nope", cache_dir=tmp_path / "hub", endpoint=fake_hub.url)


def test_cli_fetch_shows_progress_and_prints_the_folder(fake_hub, tmp_path: Path):
    src = tmp_path / "src"
    write_checkpoint(src, fake_config(experts=16, hidden=256, inter=128), shards=2)
    repo = _publish(fake_hub, REPO, src)
    env = {"HF_ENDPOINT": fake_hub.url, "HF_HUB_CACHE": str(tmp_path / "hub")}
    r = run_cli(["models", "fetch", REPO], env=env, drop_env=("HF_",), timeout=60)
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).name == repo.commit
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(REPO) and "100%" in last and "files" in last and "/s" in last


def test_cancel_event_stops_the_download_and_keeps_finished_files(
    fake_hub, tmp_path: Path, online, monkeypatch
):
    """The TUI's cancel: set from another thread, it stops the hub's workers within one chunk."""
    import threading

    from ssdmoe_tui.models.resolve import DownloadCancelled

    repo = _publish_in_chunks(fake_hub, tmp_path / "src", 3, monkeypatch)
    slow = ["model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    fake_hub.slow = dict.fromkeys(slow, 0.5)
    cache = tmp_path / "hub"
    cancel = threading.Event()
    first = "model-00001-of-00003.safetensors"

    def on_progress(p: DownloadProgress) -> None:
        if p.downloaded_bytes >= len(repo.files[first]) and p.files_done >= 5:
            cancel.set()

    t0 = time.monotonic()
    with pytest.raises(DownloadCancelled) as e:
        resolve_model(REPO, on_progress, cache_dir=cache, endpoint=fake_hub.url, cancel=cancel)
    assert time.monotonic() - t0 < 10  # the slow shards alone would take ~8 s each
    assert "resume" in str(e.value)
    assert not list(cache.rglob("*.incomplete"))  # partial files were removed

    fake_hub.slow = {}
    fake_hub.log.clear()
    folder = resolve_model(REPO, cache_dir=cache, endpoint=fake_hub.url)
    assert sorted(e[1].rsplit("/", 1)[1] for e in fake_hub.gets()) == slow
    for name in slow:
        assert (folder / name).read_bytes() == repo.files[name]


def test_ctrl_c_in_cli_fetch_stops_promptly(fake_hub, tmp_path: Path):
    import signal

    src = tmp_path / "src"
    write_checkpoint(src, fake_config(experts=16, hidden=256, inter=128), shards=2)
    _publish(fake_hub, REPO, src)
    slow = "model-00002-of-00002.safetensors"
    fake_hub.slow = {slow: 0.5}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_ENDPOINT": fake_hub.url, "HF_HUB_CACHE": str(tmp_path / "hub")}
    # The hub's 10 MiB read chunk is larger than this whole file; use the CLI with 64 KiB.
    code = (
        "import sys; from huggingface_hub import constants; "
        "constants.DOWNLOAD_CHUNK_SIZE = 1 << 16; "
        "from ssdmoe_tui.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "models", "fetch", REPO],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not fake_hub.gets(slow) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert time.monotonic() - t0 < 5
    assert f"run `ssdmoe models fetch {REPO}` again to resume" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "hub").rglob("*.incomplete"))
