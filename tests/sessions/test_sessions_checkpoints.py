"""KV checkpoints with real mlx-lm caches of each kind: round trip (same logits as an
uninterrupted run), invalid checkpoints skipped with a one-line reason (missing,
truncated, corrupt, wrong model, other tokens, other format), fallback to an older
checkpoint, disk budgets, and a save killed between write and rename."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from ssdmoe_tui.sessions import checkpoints as ck
from ssdmoe_tui.sessions.checkpoints import (
    CheckpointInvalid,
    NoCheckpoint,
    checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from tests.helpers.tiny import ARCHS, feed, filled_cache, tiny_model

REPO = Path(__file__).resolve().parents[2]
T1 = list(range(20, 60))  # turn 1: 40 tokens
T2 = T1 + [300, 301, 302, 303, 304, 305]  # turn 2 extends it
FP = "fingerprint-A"


def session(tmp_path: Path) -> Path:
    d = tmp_path / "sessions" / "20261129-000000-aaaaaa"
    d.mkdir(parents=True)
    return d


@pytest.mark.parametrize("arch", ARCHS)
def test_roundtrip_continues_exactly(tmp_path, arch):
    d = session(tmp_path)
    cache = filled_cache(arch, T1)
    res = save_checkpoint(d, cache, T1, FP)
    assert res.path == checkpoint_path(d, len(T1)) and res.path.exists() and not res.skipped
    # the in-memory cache is untouched by the save (compaction works on a view)
    assert cache[[type(c).__name__ for c in cache].index("KVCache")].keys.shape[2] == 256
    loaded, n = load_checkpoint(d, T2, FP)
    assert n == len(T1)
    got = feed(arch, loaded, T2[n:])
    want = feed(arch, make_prompt_cache(tiny_model(arch)), T2)
    assert mx.allclose(got, want, atol=1e-4).item()


def test_checkpoint_holds_exactly_the_used_tokens(tmp_path):
    """A KVCache preallocates 256-token steps; the file holds only `offset` tokens."""
    d = session(tmp_path)
    res = save_checkpoint(d, filled_cache("qwen3_moe", T1), T1, FP)
    # qwen3_moe tiny: 4 layers x (K+V) x 2 kv heads x 32 dims x float32, 40 tokens
    assert res.nbytes - 4 * 2 * 2 * 32 * 4 * len(T1) < 4096  # + header and offsets


def corrupt_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def expect_invalid(d: Path, tokens, fp, match: str) -> str:
    skipped: list[str] = []
    with pytest.raises(CheckpointInvalid, match=match) as e:
        load_checkpoint(d, tokens, fp, on_skip=skipped.append)
    assert "\n" not in str(e.value)
    assert skipped == ([e.value.reason] if list_checkpoints(d) else [])
    return e.value.reason


@pytest.fixture
def saved(tmp_path):
    d = session(tmp_path)
    save_checkpoint(d, filled_cache("qwen3_5_moe", T1), T1, FP)
    return d, checkpoint_path(d, len(T1))


def test_missing(tmp_path):
    d = session(tmp_path)
    with pytest.raises(NoCheckpoint):
        load_checkpoint(d, T1, FP)
    with pytest.raises(CheckpointInvalid, match="kv-00000040.safetensors: missing"):
        ck.check_checkpoint(checkpoint_path(d, 40), T1, FP)


def test_wrong_model(saved):
    d, _ = saved
    reason = expect_invalid(d, T2, "fingerprint-B", "another model")
    assert reason.startswith("kv-00000040.safetensors:")


def test_checkpoints_for_other_tokens_are_skipped_silently(saved):
    """Sound checkpoints for other tokens (a longer one, another branch) are not errors."""
    d, path = saved
    for tokens in ([1] + T2[1:], T1[:10]):
        skipped: list[str] = []
        with pytest.raises(NoCheckpoint, match="no KV checkpoint for these tokens"):
            load_checkpoint(d, tokens, FP, on_skip=skipped.append)
        assert skipped == []
    with pytest.raises(CheckpointInvalid, match="tokens differ"):
        ck.check_checkpoint(path, [1] + T2[1:], FP)
    with pytest.raises(CheckpointInvalid, match="covers 40 tokens"):
        ck.check_checkpoint(path, T1[:10], FP)


def test_save_rejects_wrong_token_count(tmp_path):
    with pytest.raises(ValueError, match="covers 40 tokens but 39"):
        save_checkpoint(session(tmp_path), filled_cache("nemotron_h", T1), T1[:-1], FP)


@pytest.mark.parametrize("keep", [0, 5, 100, -1000, -8])
def test_truncated(saved, keep):
    d, path = saved
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:keep])
    expect_invalid(d, T2, FP, "truncated|corrupt")


def test_corrupt_tensor_bytes(saved):
    d, path = saved
    corrupt_byte(path, path.stat().st_size - 100)  # inside the tensor data
    expect_invalid(d, T2, FP, "checksum")


def test_corrupt_header(saved):
    d, path = saved
    corrupt_byte(path, 12)  # inside the JSON header
    expect_invalid(d, T2, FP, "corrupt")


def test_garbage_file(saved):
    d, path = saved
    path.write_bytes(os.urandom(5000))
    expect_invalid(d, T2, FP, "truncated|corrupt")


def test_other_format_version(saved, monkeypatch):
    d, _ = saved
    monkeypatch.setattr(ck, "FORMAT_VERSION", "2")
    expect_invalid(d, T2, FP, "format '1'")


def test_falls_back_to_older_checkpoint(tmp_path):
    d = session(tmp_path)
    save_checkpoint(d, filled_cache("nemotron_h", T1), T1, FP)
    save_checkpoint(d, filled_cache("nemotron_h", T2), T2, FP)
    newest = checkpoint_path(d, len(T2))
    corrupt_byte(newest, newest.stat().st_size - 10)
    skipped: list[str] = []
    cache, n = load_checkpoint(d, T2 + [7], FP, on_skip=skipped.append)
    assert n == len(T1) and len(skipped) == 1 and "checksum" in skipped[0]
    got = feed("nemotron_h", cache, (T2 + [7])[n:])
    want = feed("nemotron_h", make_prompt_cache(tiny_model("nemotron_h")), T2 + [7])
    assert mx.allclose(got, want, atol=1e-4).item()


def test_keep_and_session_budget(tmp_path):
    d = session(tmp_path)
    sizes = []
    for n in (10, 20, 30):
        res = save_checkpoint(d, filled_cache("qwen3_moe", T1[:n]), T1[:n], FP, keep=2)
        sizes.append(res.nbytes)
    assert [c.n_tokens for c in list_checkpoints(d)] == [30, 20]
    res = save_checkpoint(
        d, filled_cache("qwen3_moe", T1), T1, FP, keep=5, session_budget=sizes[2] + 1 + 40 * 1024
    )
    assert [c.n_tokens for c in list_checkpoints(d)] == [40]  # older ones evicted to fit
    assert len(res.evicted) == 2
    res = save_checkpoint(d, filled_cache("qwen3_moe", T2), T2, FP, session_budget=1000)
    assert res.path is None and "per-conversation budget" in res.skipped
    assert [c.n_tokens for c in list_checkpoints(d)] == [40]  # nothing lost by skipping


def test_global_budget_evicts_oldest_across_conversations(tmp_path):
    root = tmp_path / "sessions"
    dirs = [root / f"20261129-00000{i}-aaaaaa" for i in range(3)]
    sizes = []
    for i, d in enumerate(dirs):
        d.mkdir(parents=True)
        (d / "conversation.json").write_text("{}")
        tokens = [i + 1] + T1[1:]
        budget = sum(sizes) + 10**9 if i < 2 else int(sizes[0] * 2.5)
        res = save_checkpoint(
            d, filled_cache("qwen3_moe", tokens), tokens, FP, global_budget=budget
        )
        sizes.append(res.nbytes)
    assert list_checkpoints(dirs[0]) == []  # the oldest went
    assert len(list_checkpoints(dirs[1])) == 1 and len(list_checkpoints(dirs[2])) == 1
    assert all((d / "conversation.json").exists() for d in dirs)  # text never evicted


CHILD = """
import os, signal, sys
from pathlib import Path
from ssdmoe_tui.sessions import checkpoints as ck
from tests.helpers.tiny import filled_cache
d, n, mode = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
tokens = list(range(20, 20 + n))
def die(tmp):
    assert tmp.stat().st_size > 1000          # the new checkpoint is fully written...
    os.kill(os.getpid(), signal.SIGKILL)      # ...and the process dies before the rename
ck._before_rename = die
cache = filled_cache("qwen3_5_moe", tokens if mode == "same" else [9] * n)
ck.save_checkpoint(d, cache, tokens, "fingerprint-A")
"""


@pytest.mark.parametrize("mode", ["newer", "same"])
def test_killed_between_write_and_rename_keeps_previous(tmp_path, mode):
    d = session(tmp_path)
    (d / "conversation.json").write_text('{"kept": true}')
    save_checkpoint(d, filled_cache("qwen3_5_moe", T1), T1, FP)
    before = checkpoint_path(d, len(T1)).read_bytes()
    n = len(T2) if mode == "newer" else len(T1)  # "same": overwrite of the same file name
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(d), str(n), mode], env=env, cwd=REPO, timeout=120
    )
    assert proc.returncode == -9
    assert checkpoint_path(d, len(T1)).read_bytes() == before
    assert [c.n_tokens for c in list_checkpoints(d)] == [len(T1)]
    temps = [p for p in d.iterdir() if p.name.startswith(".kv-")]
    assert temps  # the orphan temp file is left, and ignored
    cache, got_n = load_checkpoint(d, T2, FP)
    assert got_n == len(T1)
    assert (d / "conversation.json").read_text() == '{"kept": true}'
    # load_checkpoint removed the orphan: its writer (the killed child) is gone.
    assert not [p for p in d.iterdir() if p.name.startswith(".kv-")]


def _reshape_first_keys(path: Path, new_shape) -> None:
    """Rewrite the header so the first attention keys tensor has `new_shape`: the same
    bytes, read as another shape, with the checksum made to match (a consistent file)."""
    import json
    import struct

    from mlx_lm.models.cache import load_prompt_cache

    def write(header: dict, data: bytes) -> None:
        raw = json.dumps(header).encode()
        raw += b" " * ((8 - len(raw) % 8) % 8)
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)

    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8 : 8 + n]), blob[8 + n :]
    name = next(k for k, v in header.items() if k != "__metadata__" and len(v["shape"]) == 4)
    header[name]["shape"] = new_shape(header[name]["shape"])
    write(header, data)
    header["__metadata__"]["0.state_crc32"] = ck._state_checksum(load_prompt_cache(str(path)))
    write(header, data)


@pytest.mark.parametrize(
    "reshape, why",
    [
        (lambda s: [s[0], s[1] * 2, s[2] // 2, s[3]], "do not pair|positions"),  # [1,4,T/2,32]
        (lambda s: [s[0], s[1], s[2] * 2, s[3] // 2], "do not pair|head size"),
    ],
)
def test_a_reshaped_checkpoint_is_refused_against_the_model(tmp_path, reshape, why):
    """Issue 23: `[1, 2, T, 32]` saved, read back as `[1, 4, T/2, 32]` (checksum untouched):
    refused by the model's numbers, naming the file, and never fed to the model."""
    from ssdmoe_tui.sessions.checkpoints import CacheShape
    from tests.helpers.tiny import TINY

    d = session(tmp_path)
    path = save_checkpoint(d, filled_cache("qwen3_moe", T1), T1, FP).path
    _reshape_first_keys(path, reshape)
    cfg = TINY["qwen3_moe"]
    shape = CacheShape(cfg["num_key_value_heads"], cfg.get("head_dim", 0), "float32")
    with pytest.raises(CheckpointInvalid, match=why) as e:
        load_checkpoint(d, T2, FP, shape=shape)
    assert e.value.reason.startswith("kv-00000040.safetensors: layer ")


def test_cache_shape_of_a_model_folder(checkpoints):
    from ssdmoe_tui.sessions.checkpoints import CacheShape

    shape = CacheShape.of_model(checkpoints("qwen3_moe"), "bfloat16")
    assert shape == CacheShape(2, 32, "bfloat16")
