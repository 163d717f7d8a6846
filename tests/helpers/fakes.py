"""Builders for the model tests: small but valid MLX-layout checkpoints and a hand-made hub cache.

The checkpoints are real safetensors files (written with `safetensors.numpy`) with the
tensor names mlx-lm's converters write (`...switch_mlp.{proj}.{weight,scales,biases}`),
quantized-layout shapes (uint32-packed weights, 16-bit scales/biases per group) and a
config.json carrying MLX's `quantization` block. The hub cache mirrors huggingface_hub's
layout: `models--org--name/{blobs/<sha>, refs/<ref>, snapshots/<commit>/<file> -> blob}`.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

QWEN_PROJ = ("gate_proj", "up_proj", "down_proj")
NEMOTRON_PROJ = ("fc1", "fc2")


def _quantized(experts: int, rows: int, cols: int, bits: int, group: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "weight": rng.integers(0, 2**32, size=(experts, rows, cols * bits // 32), dtype=np.uint32),
        "scales": rng.standard_normal((experts, rows, cols // group)).astype(np.float16),
        "biases": rng.standard_normal((experts, rows, cols // group)).astype(np.float16),
    }


def fake_config(
    model_type: str = "qwen3_moe",
    *,
    layers: int = 2,
    experts: int = 4,
    k: int = 2,
    hidden: int = 64,
    inter: int = 32,
    bits: int = 4,
    group: int = 32,
    quantized: bool = True,
) -> dict:
    if model_type == "nemotron_h":
        cfg = {
            "model_type": "nemotron_h",
            "hybrid_override_pattern": "".join("E" if i % 2 else "M" for i in range(layers)),
            "n_routed_experts": experts,
            "moe_intermediate_size": inter,
        }
    else:
        cfg = {
            "model_type": "qwen3_moe" if model_type == "qwen3_5_moe" else model_type,
            "num_experts": experts,
            "moe_intermediate_size": inter,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
        }
    cfg |= {"num_hidden_layers": layers, "num_experts_per_tok": k, "hidden_size": hidden}
    if model_type == "qwen3_5_moe":
        cfg = {"model_type": "qwen3_5_moe", "text_config": cfg | {"model_type": "qwen3_5_moe_text"}}
    if quantized:
        cfg["quantization"] = {"group_size": group, "bits": bits, "mode": "affine"}
        cfg["quantization_config"] = dict(cfg["quantization"])
    return cfg


def write_checkpoint(folder: Path, config: dict, *, shards: int = 2, seed: int = 0) -> dict:
    """Write config.json, tokenizer-ish files, the safetensors shards and their index.

    Returns {"bytes_per_expert": {layer: bytes}, "tensors": {name: nbytes}} computed from
    the arrays actually written.
    """
    folder.mkdir(parents=True, exist_ok=True)
    mt = config["model_type"]
    tc = config.get("text_config", config)
    q = config.get("quantization")
    bits, group = (q["bits"], q["group_size"]) if q else (16, 1)
    hidden, inter, experts = tc["hidden_size"], tc["moe_intermediate_size"], None
    experts = tc.get("num_experts") or tc.get("n_routed_experts")
    if mt == "nemotron_h":
        prefix, block, projs = "backbone.layers", "mixer", NEMOTRON_PROJ
        moe_layers = [i for i, c in enumerate(tc["hybrid_override_pattern"]) if c == "E"]
    else:
        prefix = "language_model.model.layers" if mt == "qwen3_5_moe" else "model.layers"
        block, projs = "mlp", QWEN_PROJ
        moe_layers = list(range(tc["num_hidden_layers"]))
    tensors: dict[str, np.ndarray] = {
        "model.embed_tokens.weight": np.zeros((16, hidden), dtype=np.float16)
    }
    per_expert: dict[int, int] = {}
    for layer in range(tc["num_hidden_layers"]):
        tensors[f"{prefix}.{layer}.input_layernorm.weight"] = np.ones(hidden, dtype=np.float16)
        if layer not in moe_layers:
            continue
        tensors[f"{prefix}.{layer}.{block}.gate.weight"] = np.zeros(
            (experts, hidden), dtype=np.float16
        )
        total = 0
        for proj in projs:
            rows, cols = (hidden, inter) if proj in ("down_proj", "fc2") else (inter, hidden)
            if q:
                parts = _quantized(experts, rows, cols, bits, group, seed + layer)
            else:
                parts = {"weight": np.zeros((experts, rows, cols), dtype=np.float16)}
            for part, arr in parts.items():
                tensors[f"{prefix}.{layer}.{block}.switch_mlp.{proj}.{part}"] = arr
                total += arr.nbytes
        per_expert[layer] = total // experts
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        shard_names = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in shard_names}, str(folder / fname))
        weight_map |= {n: fname for n in shard_names}
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return {"bytes_per_expert": per_expert, "tensors": {n: tensors[n].nbytes for n in names}}


def hub_repo_dir(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def add_to_hub_cache(
    cache: Path,
    repo_id: str,
    source: Path,
    *,
    commit: str | None = None,
    refs: tuple[str, ...] = ("main",),
    skip: tuple[str, ...] = (),
) -> Path:
    """Lay `source`'s files out as huggingface_hub does; returns the snapshot folder."""
    repo = hub_repo_dir(cache, repo_id)
    commit = commit or hashlib.sha1(repo_id.encode()).hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for f in sorted(source.iterdir()):
        if not f.is_file() or f.name in skip:
            continue
        data = f.read_bytes()
        blob = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / blob).write_bytes(data)
        link = snap / f.name
        link.symlink_to(os.path.relpath(repo / "blobs" / blob, snap))
    (repo / "refs").mkdir(exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)  # the hub writes no trailing newline
    return snap
