"""Every MoE family of the pinned mlx-lm that the architecture table streams.

For each family, a random-weight checkpoint of a tiny config (tests/helpers/checkpoints.py)
is streamed and held against plain mlx-lm on the CPU, where both are bit-exact:
- the table's entry describes the module tree mlx-lm builds (switch attribute, router,
  K attributes, trained K, which caches cannot be trimmed);
- greedy tokens equal mlx-lm's at the trained K and one lower, with a cache that holds
  every expert and with one of K x layers + 2 slots (every token reads);
- K changed live, between two decode steps, gives mlx-lm's tokens with K changed there;
- a KV checkpoint of the family's caches (rotating windows, recurrent state included)
  saved and loaded continues exactly where the live cache would.
The ten families the issue names run in `make test`; the rest in `make test-slow` (CI
runs both), so the quick suite stays within its time.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ssdmoe_tui.checkpoint import arch
from ssdmoe_tui.engine.experts.cache import slot_memory_bytes
from ssdmoe_tui.engine.model.loader import cast_model, load_streamed, set_model_k
from tests.helpers.checkpoints import CONFIGS
from tests.helpers.live_checks import PROMPT, STEPS, checkpoint_resumes, k_changed_live
from tests.helpers.live_checks import greedy as _greedy

#: The families issue 42 asks in the quick suite (and the four streamed before it).
QUICK = {
    "gpt_oss", "deepseek_v3", "glm4_moe", "qwen3_next", "llama4", "minimax", "gemma4_text",
    "qwen2_moe", "olmoe", "granitemoe", "qwen3_moe", "mixtral",
}  # fmt: skip
STREAMED = sorted(f for f in CONFIGS if arch.family(CONFIGS[f]) is not None and f in arch.STREAMED)
FAMILIES = [f if f in QUICK else pytest.param(f, marks=pytest.mark.slow) for f in STREAMED]


def test_every_family_of_the_table_is_tested_or_refused():
    """Each streamed model type of the table has a tiny config here (so a test); each
    refused one says why in one line."""
    for mt, entry in arch.ARCHITECTURES.items():
        if entry.streamed:
            assert mt in CONFIGS, f"{mt}: streamed but no tiny config in tests/fixtures/families"
        else:
            assert "\n" not in entry.refused and len(entry.refused) < 200, mt


@pytest.mark.parametrize("family", STREAMED)
def test_table_entry_describes_mlx_lm_s_module_tree(family):
    config = CONFIGS[family]
    entry = arch.family(config)
    model = arch.lazy_model(config)
    sites = arch.switch_sites(model, entry)
    assert sites, "no SwitchGLU/SwitchMLP: the entry names a dense model"
    geo = arch.moe_geometry(config)
    assert geo is not None and geo.moe_layers == tuple(arch.layer_number(s.path) for s in sites)
    assert geo.projections == entry.projections
    assert entry.routing in arch.ROUTINGS
    for site in sites:
        assert site.attr == entry.switch
        assert getattr(site.block, entry.router, None) is not None, entry.router
        for path in entry.k_paths:
            assert arch.get_path(site.block, path) == geo.trained_k, path
    caches = model.make_cache() if hasattr(model, "make_cache") else make_prompt_cache(model)
    untrimmable = any(type(c) is not KVCache for c in caches)
    assert entry.hybrid == untrimmable, [type(c).__name__ for c in caches]


@pytest.fixture(scope="module")
def resident():
    """family -> (mlx-lm's model cast to float32, as the engine runs on the CPU)."""
    made = {}

    def get(path):
        if path not in made:
            model, _ = load(str(path))
            cast_model(model, mx.float32)
            made[path] = model
        return made[path]

    return get


def _budgets(sm) -> dict[str, str]:
    slot = slot_memory_bytes(sm.index, mx.float32)
    everything = sm.index.num_experts * sm.index.num_layers * slot
    small = (sm.trained_k * sm.index.num_layers + 2) * slot
    return {"every expert": str(everything), "K x layers + 2 slots": str(small)}


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_mlx_lm_at_trained_and_lower_k(checkpoints, resident, family):
    path = checkpoints(family)
    ref_model = resident(path)
    probe = load_streamed(path, expert_cache="1")
    trained, budgets = probe.trained_k, _budgets(probe)
    probe.close()
    for k in sorted({trained, max(1, trained - 1)}):
        set_model_k(ref_model, k)
        ref = _greedy(ref_model, make_prompt_cache(ref_model), PROMPT, STEPS)
        for name, budget in budgets.items():
            sm = load_streamed(path, expert_cache=budget)
            try:
                sm.set_k(k)
                got = _greedy(sm.model, make_prompt_cache(sm.model), PROMPT, STEPS)
                assert got == ref, (k, name)
                assert sm.times.last_k == k
                if name != "every expert":
                    assert sm.cache.counters.misses > 0, "the small cache never read"
            finally:
                sm.close()
    set_model_k(ref_model, trained)


@pytest.mark.parametrize("family", FAMILIES)
def test_k_changed_live_and_a_kv_checkpoint_resumes_exactly(
    checkpoints, resident, tmp_path, family
):
    path = checkpoints(family)
    ref_model = resident(path)
    sm = load_streamed(path, expert_cache="1")
    try:
        k, low = sm.trained_k, max(1, sm.trained_k - 1)
        # K changed between two decode steps, on both sides at the same step
        k_changed_live(sm, ref_model, k, low)
        # a checkpoint of the prompt's caches, saved and loaded, continues exactly
        checkpoint_resumes(sm, tmp_path)
    finally:
        sm.close()


def _rewrite(folder, edit) -> None:  # noqa: ANN001
    """Apply `edit(name, array) -> array` to every tensor of every shard of `folder`."""
    for shard in folder.glob("*.safetensors"):
        arrays = mx.load(str(shard))
        mx.save_safetensors(str(shard), {k: edit(k, v) for k, v in arrays.items()},
                            metadata={"format": "mlx"})  # fmt: skip


def test_bad_family_checkpoints_are_one_line(checkpoints, tmp_path):
    """A gpt-oss checkpoint whose tensors disagree with its config, a config whose MoE
    fields contradict each other, MXFP4 experts with scales of the wrong shape: each is one
    line naming the file or value, before anything is computed."""
    import json
    import shutil

    from ssdmoe_tui.errors import ModelError
    from ssdmoe_tui.models.demo import write_checkpoint

    def one_line(path, match: str) -> None:
        with pytest.raises(ModelError) as e:
            load_streamed(path, expert_cache="1")
        assert "\n" not in str(e.value) and match in str(e.value), str(e.value)

    mxfp4 = write_checkpoint(CONFIGS["gpt_oss"], tmp_path / "mxfp4", seed=3, group_size=32,
                             mode="mxfp4", random_routers=True)  # fmt: skip
    more = shutil.copytree(mxfp4, tmp_path / "more")
    config = json.loads((more / "config.json").read_text())
    config["num_local_experts"] = 16  # the tensors stack 8
    (more / "config.json").write_text(json.dumps(config))
    one_line(more, "hold 8 experts per layer, config.json makes 16")
    k99 = shutil.copytree(mxfp4, tmp_path / "k99")
    config = json.loads((k99 / "config.json").read_text())
    config["num_experts_per_tok"] = 99
    (k99 / "config.json").write_text(json.dumps(config))
    one_line(k99, "num_experts_per_tok = 99")
    scales = shutil.copytree(mxfp4, tmp_path / "scales")
    _rewrite(scales, lambda k, v: v[..., :-1] if k.endswith("experts.gate_proj.scales") else v)
    one_line(scales, "gate_proj")


def test_docs_list_every_model_type_streamed_or_why_not():
    """docs/models.md's family table has a row per model type of the table: ✓ where it is
    streamed, the refusal's reason where it is not."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            len(cells) == 7
            and cells[0].startswith("`")
            and cells[0].strip("`") in arch.ARCHITECTURES
        ):
            rows[cells[0].strip("`")] = cells[2]
    assert set(rows) == set(arch.ARCHITECTURES)
    for mt, entry in arch.ARCHITECTURES.items():
        assert rows[mt] == ("✓" if entry.streamed else f"no: {entry.refused}"), mt


def test_gpt_oss_stops_on_call_whatever_generation_config_lists(checkpoints, tmp_path):
    """gpt-oss-20b's first generation_config.json ends replies on <|return|> alone, so a
    tool call (which ends in <|call|>) ran on to max tokens in the app: the family's
    table entry adds its stop tokens to the tokenizer's set."""
    import json
    import shutil

    from ssdmoe_tui.checkpoint.config import load_tokenizer
    from tests.helpers.harmony_tokenizer import write_harmony_tokenizer

    folder = shutil.copytree(checkpoints("gpt_oss"), tmp_path / "goss")
    for f in folder.glob("tokenizer*"):
        f.unlink()
    ids = write_harmony_tokenizer(folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"]]})
    )
    tok = load_tokenizer(folder)
    assert {ids["<|call|>"], ids["<|return|>"]} <= tok.eos_token_ids
    assert ids["<|end|>"] not in tok.eos_token_ids  # a message's end is no reply's end
