"""The model tests' fake checkpoints (tests/helpers/fakes.py) are real safetensors."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.fakes import fake_config, write_checkpoint


def test_fake_checkpoint_is_loadable_safetensors(tmp_path: Path) -> None:
    """The builder's files are real safetensors that the reference reader accepts."""
    from safetensors import safe_open

    info = write_checkpoint(tmp_path / "m", fake_config(), shards=2)
    seen = {}
    for shard in sorted((tmp_path / "m").glob("*.safetensors")):
        with safe_open(str(shard), "np") as f:
            for name in f.keys():
                seen[name] = f.get_tensor(name).nbytes
    assert seen == info["tensors"]
