"""The tiny mlx-lm models (tests/helpers/tiny.py) build each cache kind, and the sizing
formula behind docs/sessions.md's "Sizes" (scripts/kv_sizes.py) matches their real caches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from tests.helpers.tiny import ARCHS, HYBRID, TINY, filled_cache

ROOT = Path(__file__).resolve().parents[2]


def kv_footprint(config: dict, dtype_bytes: int):  # noqa: ANN201 - the script's KVFootprint
    """scripts/kv_sizes.py's formula, loaded from the file `python scripts/...` runs."""
    spec = importlib.util.spec_from_file_location("kv_sizes", ROOT / "scripts" / "kv_sizes.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module.kv_footprint(config, dtype_bytes=dtype_bytes)


def test_tiny_models_build_their_cache_kinds():
    for arch in ARCHS:
        cache = filled_cache(arch, range(1, 9))
        kinds = {type(c).__name__ for c in cache}
        assert "KVCache" in kinds
        assert ("ArraysCache" in kinds) == HYBRID[arch]


def _state_bytes(cache: list) -> int:
    """Tensor bytes a checkpoint of `cache` holds (KV buffers cut to the used tokens)."""
    from mlx.utils import tree_flatten

    from ssdmoe_tui.sessions.checkpoints import _compact

    return sum(
        v.nbytes
        for _, v in tree_flatten([c.state for c in _compact(cache)])
        if isinstance(v, mx.array)
    )


def test_sizing_formula_matches_real_caches():
    for arch in ARCHS:
        fp = kv_footprint(TINY[arch], dtype_bytes=4)
        assert fp.hybrid == HYBRID[arch]
        for n in (5, 37):
            assert _state_bytes(filled_cache(arch, range(1, n + 1))) == fp.bytes_for(n), arch


def test_sizing_formula_bfloat16_recurrent_state_stays_float32():
    """Dense qwen3_5 and nemotron_h (no MoE: CPU GatherMM is float32-only) in bfloat16:
    conv windows and KV follow the activation dtype, SSM states stay float32."""
    from mlx_lm.models import nemotron_h, qwen3_5

    dense = {k: v for k, v in TINY["qwen3_5_moe"].items() if "expert" not in k}
    dense.update(model_type="qwen3_5", intermediate_size=128)
    for module, cfg in ((qwen3_5, dense), (nemotron_h, TINY["nemotron_h"])):
        model = module.Model(module.ModelArgs.from_dict(cfg))
        model.set_dtype(mx.bfloat16)
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([list(range(1, 12))]), cache=cache), [c.state for c in cache])
        assert _state_bytes(cache) == kv_footprint(cfg, dtype_bytes=2).bytes_for(11)
