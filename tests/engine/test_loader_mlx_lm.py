"""The streamed loader reads a checkpoint the way `mlx_lm.load` does: the same EOS ids
(generation_config.json), the same quantization for every module (per-module overrides,
legacy `quantization_config`), the same tokenizer."""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from mlx_lm import load, stream_generate

from ssdmoe_tui.checkpoint.config import load_tokenizer
from ssdmoe_tui.engine.model.loader import cast_model, load_streamed
from ssdmoe_tui.engine.model.streamed import StreamedSwitch
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.models.demo import write_checkpoint
from tests.helpers.checkpoints import QWEN3_MOE


def quantization_of(model) -> dict[str, tuple]:
    """(bits, group size, mode) of every quantized module; streamed experts report theirs."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, StreamedSwitch):
            for proj, q in m._quant.items():
                out[f"{name}.{proj}"] = (q.bits, q.group_size, q.mode)
        elif hasattr(m, "bits") and hasattr(m, "group_size"):
            out[name] = (m.bits, m.group_size, getattr(m, "mode", "affine"))
    return out


def compare(path, prompt_len: int = 12) -> None:
    model, tok = load(str(path))
    sm = load_streamed(path, expert_cache="1")
    try:
        assert set(sm.tokenizer.eos_token_ids) == set(tok.eos_token_ids)
        ours, ref = quantization_of(sm.model), quantization_of(model)
        assert ours == ref and len(ref) > 10
        assert sm.tokenizer.vocab == tok.vocab and sm.tokenizer.chat_template == tok.chat_template
        text = "Hello <|im_end|> world, 12345"
        assert sm.tokenizer.encode(text) == tok.encode(text)
        prompt = list(range(5, 5 + prompt_len))
        cast_model(model, sm.dtype)
        ref_tokens = [r.token for r in stream_generate(model, tok, mx.array(prompt), max_tokens=4)]
        assert Runner(sm).generate(prompt, max_tokens=4).tokens == ref_tokens
    finally:
        sm.close()


def test_eos_ids_from_generation_config_match_mlx_lm(checkpoints, tmp_path):
    path = tmp_path / "m"
    shutil.copytree(checkpoints("qwen3_moe"), path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    _, tok = load(str(path))
    assert {7, 9} <= set(tok.eos_token_ids)  # mlx-lm takes them from generation_config.json
    # the one tokenizer loader (engine, bench, server) agrees without loading weights
    assert load_tokenizer(path).eos_token_ids == tok.eos_token_ids
    compare(path)


@pytest.mark.parametrize("mode", ["mxfp4"])
def test_legacy_quantization_config_loads_like_mlx_lm(tmp_path, mode):
    """An HF-style `quantization_config` (quant_method mxfp4, no MLX `quantization` block):
    mlx-lm turns it into the MLX mode; so does the streamed loader."""
    path = write_checkpoint(
        QWEN3_MOE | {"num_hidden_layers": 2}, tmp_path / "m", group_size=32, mode=mode
    )
    config = json.loads((path / "config.json").read_text())
    assert config.pop("quantization")["mode"] == mode
    config.pop("quantization_config", None)
    config["quantization_config"] = {"quant_method": mode}
    (path / "config.json").write_text(json.dumps(config))
    compare(path)


@pytest.mark.parametrize("arch", ["nemotron_h", "qwen3_5_moe"])
def test_other_architectures_quantize_like_mlx_lm(checkpoints, arch):
    """SwitchMLP (fc1/fc2, unquantized router) and the hybrid Qwen3.5 layout: every
    module's quantization and the generated tokens equal mlx_lm.load's."""
    compare(checkpoints(arch))
