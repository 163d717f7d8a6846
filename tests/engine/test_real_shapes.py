"""Real model shapes: checkpoints built from the real config.json files in tests/fixtures/models.

Depth is cut to one MoE layer (plus one layer of each other kind the architecture
needs) and the vocabulary to 2048 (both only shrink the resident
part): every expert keeps its real width, count, quantization (4-bit, group 64, routers
at 8 bits), so the index and the streamed compute see real expert geometry.
"""

from __future__ import annotations

import json
import shutil

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm import load, stream_generate
from mlx_lm.models.cache import make_prompt_cache

from ssdmoe_tui.checkpoint.arch import family, lazy_model, moe_geometry
from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.model.loader import cast_model, load_streamed, set_model_k
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.models import registry
from ssdmoe_tui.models.registry import check_supported, expert_bytes_from_config
from tests.helpers.fixture_paths import MODELS
from tests.helpers.live_checks import PROMPT, STEPS, checkpoint_resumes, k_changed_live
from tests.helpers.live_checks import greedy as _greedy
from tests.helpers.real_shapes import CASES, SAME_SHAPE, SHAPES, build_shape, routed

# qwen3_moe's real shape runs in `make test`; the other two (a 256-expert and a hybrid
# checkpoint, the suite's two longest builds) in `make test-slow`.
ARCHS = [pytest.param(a, marks=pytest.mark.slow) if a != "qwen3_moe" else a for a in CASES]


@pytest.mark.parametrize("arch", ARCHS)
def test_real_shape_index_and_exact_generation(real_checkpoints, arch):
    path, config = real_checkpoints(arch)
    _, experts, trained_k = CASES[arch]
    index = build_index(path)
    assert index.num_experts == experts
    assert index.expert_bytes == expert_bytes_from_config(config)
    qcfg = json.loads((path / "config.json").read_text())["quantization"]
    if arch != "nemotron_h":  # nemotron's router is a plain weight, never quantized by mlx-lm
        assert any(isinstance(v, dict) and v.get("bits") == 8 for v in qcfg.values()), (
            "router at 8 bits"
        )

    sm = load_streamed(path, expert_cache="1")
    assert sm.trained_k == trained_k
    runner = Runner(sm)
    prompt = list(range(5, 37))
    res = runner.generate(prompt, max_tokens=6)
    assert res.stats.requested_bytes == res.stats.misses * index.expert_bytes

    model, tok = load(str(path))
    cast_model(model, mx.float32)
    ref = [r.token for r in stream_generate(model, tok, mx.array(prompt), max_tokens=6)]
    assert res.tokens == ref


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["full", "compact"])
def test_real_shape_pipelined_layer_is_exact(
    real_checkpoints, monkeypatch, tmp_path_factory, arch, mode
):
    """The pipelined layer (hits queued before the misses are read) at real expert
    widths, with both partial-call shapes, on K + 4 slots: layers have hits and misses
    together (nemotron_h's builder leaves its router zero: random here)."""
    from ssdmoe_tui.engine.model.streamed import PIPELINE_ENV

    monkeypatch.setenv(PIPELINE_ENV, mode)
    path, _ = real_checkpoints(arch)
    if arch == "nemotron_h":
        path = routed(path, tmp_path_factory.getbasetemp() / "real-nemotron_h-routed")
    index = build_index(path)
    # K + 4 slots: each token evicts some of the last ones' experts and keeps others
    slots = CASES[arch][2] + 4
    sm = load_streamed(path, expert_cache=str(slots * slot_memory_bytes(index, mx.float32)))
    runner = Runner(sm)
    prompt = list(range(5, 37))
    res = runner.generate(prompt, max_tokens=8)
    assert sm.times.pipelined_calls > 0, sm.cache.counters
    model, tok = load(str(path))
    cast_model(model, mx.float32)
    ref = [r.token for r in stream_generate(model, tok, mx.array(prompt), max_tokens=8)]
    assert res.tokens == ref
    sm.close()


# --------------------------------------------------------------------------- the giants


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """name -> folder of `SHAPES[name]`'s reduced checkpoint, built once per module and
    removed after it (hundreds of MB to 10 GB each)."""
    root = tmp_path_factory.mktemp("shapes")
    made: dict = {}

    def get(name: str):
        if name not in made:
            for other in list(made):  # one at a time on disk: the largest is 9.5 GB
                shutil.rmtree(made.pop(other), ignore_errors=True)
            made[name] = build_shape(name, root / name)
        return made[name]

    yield get
    shutil.rmtree(root, ignore_errors=True)


#: The release's quantization of each shape's experts, as the registry's arithmetic takes it.
def _release_quant(shape) -> tuple[int, int, str]:
    return (4, 32, "mxfp4") if shape.quant == "mxfp4" else (4, 64, "affine")


SHAPE_PARAMS = [pytest.param(n, marks=pytest.mark.slow) if s.slow else n for n, s in SHAPES.items()]


@pytest.mark.parametrize("name", SHAPE_PARAMS)
def test_real_shape_streams_exactly_changes_k_live_and_resumes(shapes, tmp_path, name):
    """A reduced checkpoint of a giant model's real config: its experts have the real
    count, width and quantization (the index measures the registry's bytes per expert);
    greedy tokens equal mlx-lm's at the trained K and one lower with a cache of K x layers
    + 2 slots (every token reads), K changed live between two decode steps gives mlx-lm's
    tokens with K changed there, and a KV checkpoint of its caches resumes exactly."""
    shape = SHAPES[name]
    path = shapes(name)
    real = shape.real_config()
    geo = moe_geometry(real)
    index = build_index(path)
    assert (index.num_experts, index.expert_bytes) == (
        geo.num_experts,
        expert_bytes_from_config(real, *_release_quant(shape)),
    )
    ref_model, _ = load(str(path))
    cast_model(ref_model, mx.float32)
    trained = geo.trained_k
    slot = slot_memory_bytes(index, mx.float32)
    budget = str((trained * index.num_layers + 2) * slot)
    sm = load_streamed(path, expert_cache=budget)
    try:
        assert sm.trained_k == trained
        for k in sorted({trained, max(1, trained - 1)}):
            set_model_k(ref_model, k)
            ref = _greedy(ref_model, make_prompt_cache(ref_model), PROMPT, STEPS)
            sm.set_k(k)
            got = _greedy(sm.model, make_prompt_cache(sm.model), PROMPT, STEPS)
            assert got == ref, k
            assert sm.times.last_k == k
        assert sm.cache.counters.misses > 0, "the small cache never read"
        # K changed between two decode steps, on both sides at the same step
        got = k_changed_live(sm, ref_model, trained, max(1, trained - 1))
        assert len(set(got)) > 1, got  # a random model that repeats one token proves little
        checkpoint_resumes(sm, tmp_path)
    finally:
        sm.close()


@pytest.mark.parametrize("other", sorted(SAME_SHAPE))
def test_same_shape_configs_build_the_same_model(other):
    """DeepSeek-R1's config builds the model DeepSeek-V3's does (every parameter's name,
    shape and the geometry), so the DeepSeek-V3 checkpoint's test covers R1's shape."""
    rel, twin = SAME_SHAPE[other]
    a = json.loads((MODELS / rel).read_text())
    b = SHAPES[twin].real_config()
    assert moe_geometry(a) == moe_geometry(b)
    shapes_of = [{k: v.shape for k, v in tree_flatten(lazy_model(c).parameters())} for c in (a, b)]
    assert shapes_of[0] == shapes_of[1]


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_real_config_is_accepted_as_its_family(name):
    """Each release's genuine config, with the MLX quantization its test checkpoint has,
    is accepted as the family its architecture is (Kimi K2's `kimi_k2`: deepseek_v3)."""
    shape = SHAPES[name]
    real = shape.real_config()
    bits, group, mode = _release_quant(shape)
    info = check_supported(
        {**real, "quantization": {"bits": bits, "group_size": group, "mode": mode}}
    )
    assert info.architecture == family(real).model_type
    assert info.expert_bytes == expert_bytes_from_config(real, bits, group, mode)


def test_models_supported_claims_only_the_shapes_tested_here():
    """`ssdmoe models supported`'s shapes verified with random weights are the SHAPES
    streamed above (or a config of the same shape), each note the config's arithmetic."""
    tested = {s.model: (s.real_config(), s) for s in SHAPES.values()}
    for model, (rel, twin) in SAME_SHAPE.items():
        tested[model] = (json.loads((MODELS / rel).read_text()), SHAPES[twin])
    assert registry.VERIFIED_SHAPES
    for v in registry.VERIFIED_SHAPES:
        real, shape = tested[v.model]
        assert v.architecture == family(real).model_type, v.model
        assert v.note == registry.shape_note(real, *_release_quant(shape)), v.model
