"""The repository stands alone: tests read tests/fixtures/, and nothing reads the sibling
development folder that a user's clone does not have."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP
from mlx_lm.utils import _get_classes

from tests.helpers.fixture_paths import FIXTURES, MODELS

ROOT = Path(__file__).resolve().parents[2]
# The sibling folder by relative path (either separator), by the development machine's
# absolute path, or joined as a path part (parents[N] / its name, .parent / its name).
SIBLING = re.compile(r"\.\.[/\\]shared\b|/work/shared\b|/\s*[\"']shared[\"']|[\"']shared[\"']\s*/")


def test_nothing_references_the_sibling_shared_folder() -> None:
    offenders = []
    for top in ("ssdmoe_tui", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix not in {".py", ".c", ".h", ".toml", ".tcss"}:
                continue
            for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if SIBLING.search(line) and path != Path(__file__).resolve():
                    offenders.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_fixture_copies_match_their_recorded_checksums() -> None:
    text = (FIXTURES / "SOURCES.md").read_text()
    sums = re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.M)
    assert len(sums) >= 20
    for digest, rel in sums:
        assert hashlib.sha256((FIXTURES / rel).read_bytes()).hexdigest() == digest, rel
    # every data file has its source noted (a checksum line in SOURCES.md)
    listed = {rel for _, rel in sums}
    files = {
        str(p.relative_to(FIXTURES))
        for p in FIXTURES.rglob("*")
        if p.is_file() and p.suffix != ".md" and p.name != ".gitattributes"
    }
    assert files <= listed, f"fixtures without a SOURCES.md entry: {sorted(files - listed)}"


# What the pinned mlx-lm builds from each real config under models/ (models/SOURCES.md records
# the same figures): module, layers, MoE layers, routed experts, expert width, K. A config added
# there needs its row here, so a fixture nobody checked against mlx-lm cannot slip in.
REAL_CONFIG_SHAPES = {
    "deepseek-r1/config.json": ("deepseek_v3", 61, 58, 256, 2048, 8),
    "deepseek-v3/config.json": ("deepseek_v3", 61, 58, 256, 2048, 8),
    "deepseek-v3.1/config.json": ("deepseek_v3", 61, 58, 256, 2048, 8),
    "gemma-4-26b-a4b/config.json": ("gemma4", 30, 30, 128, 704, 8),
    "glm-4.5-air/config.json": ("glm4_moe", 46, 45, 128, 1408, 8),
    "gpt-oss-120b/config.json": ("gpt_oss", 36, 36, 128, 2880, 4),
    "gpt-oss-20b/config.json": ("gpt_oss", 24, 24, 32, 2880, 4),
    "kimi-k2/config.json": ("deepseek_v3", 61, 60, 384, 2048, 8),
    "llama-4-scout/derived-not-genuine/trimmed-config.json": ("llama4", 48, 48, 16, 8192, 1),
    "mixtral-8x7b-v0.1/config.json": ("mixtral", 32, 32, 8, 14336, 2),
    "nemotron-3-nano-30b-a3b/config.json": ("nemotron_h", 52, 23, 128, 1856, 6),
    "qwen3-235b-a22b/config.json": ("qwen3_moe", 94, 94, 128, 1536, 8),
    "qwen3-30b-a3b/config.json": ("qwen3_moe", 48, 48, 128, 768, 8),
    "qwen3-next-80b-a3b/config.json": ("qwen3_next", 48, 48, 512, 512, 10),
    "qwen3.5-35b-a3b/config.json": ("qwen3_5_moe", 40, 40, 256, 512, 8),
    "qwen3.5-35b-a3b/config.reconstructed.json": ("qwen3_5_moe", 40, 40, 256, 512, 8),
}
K_KEYS = ("num_experts_per_tok", "top_k_experts")  # gemma4 names K top_k_experts


def _shape_mlx_lm_builds(config: dict) -> tuple[str, int, int, int, int, int]:
    """Build the model lazily (no weight is evaluated, so the 671B shape costs nothing) and
    read the experts from its SwitchGLU/SwitchMLP modules, as the engine will."""
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    switches = []
    for layer in model.layers:
        found = [m for _, m in layer.named_modules() if isinstance(m, (SwitchGLU, SwitchMLP))]
        switches.extend(found[:1])
    first = switches[0]
    stacked = (first.up_proj if isinstance(first, SwitchGLU) else first.fc1).weight.shape
    text = config.get("text_config", config)
    k = next(text[key] for key in K_KEYS if key in text)
    module = model_class.__module__.rsplit(".", 1)[-1]
    return module, len(model.layers), len(switches), stacked[0], stacked[1], k


def test_real_configs_load_in_the_pinned_mlx_lm() -> None:
    configs = sorted([*MODELS.glob("*/config*.json"), *MODELS.glob("*/derived-not-genuine/*.json")])
    shapes = {
        str(p.relative_to(MODELS)): _shape_mlx_lm_builds(json.loads(p.read_bytes()))
        for p in configs
    }
    assert shapes == REAL_CONFIG_SHAPES
