"""Issue 45 item 4: KV checkpoints replaced under a running server.

A conversation leaves its checkpoints in the server's cache; a fresh server starts on
that cache (its memory empty), and while it runs every checkpoint file is replaced by a
truncated one, a corrupted one (tensor bytes flipped, header intact), one made for
another model, a FIFO, a link to /dev/zero or a folder. The next turn is answered
exactly as before (the whole prompt computed: nothing cached), nothing hangs (the
client's deadline bounds it), and one stderr line per file names it and why it was
skipped; asked again, the same file is not reported twice."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from ssdmoe_tui.options import EngineOptions
from ssdmoe_tui.server.main import ServeOptions
from tests.helpers.server import TIMEOUT, Running


def _opts(model: Path, root: Path) -> ServeOptions:
    return ServeOptions(EngineOptions(model=str(model)), cache_root=root)


def _ask(srv: Running, messages: list[dict]):
    r = srv.client(timeout=TIMEOUT).chat.completions.create(
        model=srv.model, messages=messages, max_tokens=8, temperature=0
    )
    return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens


@pytest.fixture(scope="module")
def made(checkpoints, tmp_path_factory):
    """(model, a cache root holding one conversation's checkpoints, its next turn, the
    reply that turn gets)."""
    model = checkpoints("qwen3_moe")
    root = tmp_path_factory.mktemp("replaced") / "sc"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSDMOE_LOCK_DIR", str(root.parent / "locks"))
        srv = Running(_opts(model, root))
        try:
            messages = [{"role": "user", "content": "Tell me a long story about the tides."}]
            first, _ = _ask(srv, messages)
            messages += [{"role": "assistant", "content": first},
                         {"role": "user", "content": "Go on."}]  # fmt: skip
            want, _ = _ask(srv, messages)
        finally:
            srv.stop()
    assert list(root.rglob("kv-*.safetensors")), "the conversation left no checkpoint"
    return model, root, messages, want


def _other_model(path: Path) -> None:
    """The same checkpoint, its header saying it was made with another model."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header["__metadata__"]["0.fingerprint"] = "another-model"
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def _corrupt(path: Path) -> None:
    """Tensor bytes flipped in the middle of the data; the header untouched."""
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    mid = 8 + n + (len(raw) - 8 - n) // 2
    for i in range(mid, min(mid + 64, len(raw))):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def _replace(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def go(path: Path) -> None:
        path.unlink()
        make(path)

    return go


CASES = {
    "truncated": (lambda p: os.truncate(p, p.stat().st_size // 2), "truncated"),
    "corrupted": (_corrupt, "corrupt (tensor checksum mismatch)"),
    "other-model": (_other_model, "made with another model"),
    "fifo": (_replace(os.mkfifo), "a FIFO (named pipe), not a regular file"),
    "dev-zero": (
        _replace(lambda p: p.symlink_to("/dev/zero")),
        "a character device, not a regular file (a link to /dev/zero)",
    ),  # fmt: skip
    "folder": (_replace(lambda p: p.mkdir()), "a folder, not a file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_replaced_checkpoint_is_skipped_said_and_the_turn_recomputed(
    made, case, tmp_path, monkeypatch, capfd
):
    model, pristine, messages, want = made
    damage, why = CASES[case]
    root = tmp_path / "sc"
    shutil.copytree(pristine, root, symlinks=True)
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(tmp_path / "locks"))
    srv = Running(_opts(model, root))
    try:
        files = sorted(root.rglob("kv-*.safetensors"))
        assert files
        for f in files:  # replaced while the server runs
            damage(f)
        capfd.readouterr()
        got, cached = _ask(srv, messages)
        assert got == want
        assert cached == 0  # no damaged file served a token: the whole prompt was computed
        again, _ = _ask(srv, messages)
        assert again == want
    finally:
        srv.stop()
    err = capfd.readouterr().err
    assert "rebuilding the context" not in err, err  # the engine's fallback: not needed
    lines = [ln for ln in err.splitlines() if "checkpoint ignored" in ln]
    for f in files:
        said = [ln for ln in lines if f"{f}: " in ln]
        assert len(said) == 1, (f.name, lines)  # once, not once per request
        assert why in said[0], said[0]
        assert said[0].startswith("ssdmoe: checkpoint ignored: ")
        assert said[0].endswith("; what it held is computed again"), said[0]
    assert not any("Traceback" in ln or "Error" in ln for ln in lines), lines
