"""`ssdmoe index`: build or validate the expert byte-offset index and summarise it."""

from __future__ import annotations

import argparse
import json

from ssdmoe_tui.commands.common import resolve_model_path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build/validate the expert index of a model")
    p.add_argument("--model", default="", help="model folder or Hub repo id (default: demo model)")
    p.add_argument("--rebuild", action="store_true", help="ignore the cached index")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def summary(index, config: dict) -> dict:
    text = config.get("text_config", config)
    trained_k = text.get("num_experts_per_tok")
    ks = sorted({1, 2, 4, 8, *([trained_k] if trained_k else [])})
    return {
        "model_type": config.get("model_type"),
        "moe_layers": index.num_layers,
        "experts_per_layer": index.num_experts,
        "trained_k": trained_k,
        "expert_bytes": index.expert_bytes,
        "expert_components": [c.name for c in index.layers[0].components],
        "reads_per_expert": index.expert_pieces,
        "expert_bytes_total": index.expert_bytes * index.num_experts * index.num_layers,
        "resident_bytes": index.resident_bytes,
        "shards": len(index.shards),
        "mib_per_token": {str(k): round(index.mib_per_token(k), 3) for k in ks},
    }


def run(args: argparse.Namespace) -> int:
    import time

    from ssdmoe_tui.engine.index import build_index, load_index
    from ssdmoe_tui.engine.loader import _load_config

    path = resolve_model_path(args.model, quiet=args.json)
    config = _load_config(path)
    t0 = time.perf_counter()
    if args.rebuild:
        index, cached = build_index(path), False
        load_index(path, use_cache=True)  # refresh the cache entry
    else:
        index, cached = load_index(path)
    s = summary(index, config)
    s["from_cache"] = cached
    s["seconds"] = round(time.perf_counter() - t0, 4)
    if args.json:
        print(json.dumps(s))
        return 0
    mib = 2**20
    print(f"{path}")
    print(
        f"  architecture     {s['model_type']}  ({s['shards']} shards, index {'cached' if cached else 'built'} in {s['seconds']} s)"
    )
    print(
        f"  MoE layers       {s['moe_layers']} x {s['experts_per_layer']} experts, trained K = {s['trained_k']}"
    )
    print(
        f"  bytes / expert   {s['expert_bytes']:,} ({s['expert_bytes'] / mib:.3f} MiB; {len(s['expert_components'])} components, {s['reads_per_expert']} reads)"
    )
    print(f"  expert bytes     {s['expert_bytes_total'] / mib:,.1f} MiB on SSD")
    print(f"  resident bytes   {s['resident_bytes'] / mib:,.1f} MiB in memory")
    print("  MiB per token    " + ", ".join(f"K={k}: {v:g}" for k, v in s["mib_per_token"].items()))
    return 0
