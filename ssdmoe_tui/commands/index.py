"""`ssdmoe index`: build or validate the expert byte-offset index and summarise it;
`--verify` hashes every tensor and says which ones changed since the last verify."""

from __future__ import annotations

import argparse
import json

from ssdmoe_tui.commands.common import resolve_model_path
from ssdmoe_tui.units import human_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="build/validate the expert index of a model")
    p.add_argument("--model", default="", help="model folder or Hub repo id (default: demo model)")
    p.add_argument("--rebuild", action="store_true", help="ignore the cached index")
    p.add_argument(
        "--verify",
        action="store_true",
        help="hash every tensor (reads the whole model) and name those that changed",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def summary(index, config: dict) -> dict:
    from ssdmoe_tui.checkpoint.arch import trained_k as config_trained_k

    trained_k = config_trained_k(config) or None
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

    from ssdmoe_tui.engine.experts.index import build_index, load_index
    from ssdmoe_tui.engine.model.loader import _load_config

    path = resolve_model_path(args.model, quiet=args.json)
    if args.verify:
        return run_verify(path, as_json=args.json)
    config = _load_config(path)
    t0 = time.perf_counter()
    if args.rebuild:
        index, cached = build_index(path), False
        load_index(path, use_cache=True)  # refresh the cache entry
    else:
        index, cached = load_index(path)
    s = summary(index, config)
    s["from_cache"] = cached
    s["note"] = index.note
    s["seconds"] = round(time.perf_counter() - t0, 4)
    if args.json:
        print(json.dumps(s))
        return 0
    mib = 2**20
    print(f"{path}")
    if s["note"]:
        print(f"  warning: {s['note']}")
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
    # the figures --json gives, every digit of them (`:g` kept 6 digits: 1817.754 -> 1817.75)
    print("  MiB per token    " + ", ".join(f"K={k}: {v}" for k, v in s["mib_per_token"].items()))
    return 0


def run_verify(path, *, as_json: bool) -> int:
    from dataclasses import asdict

    from ssdmoe_tui.checkpoint.verify import verify
    from ssdmoe_tui.paths import cache_dir

    r = verify(path, cache_dir())
    if as_json:
        print(json.dumps(asdict(r) | {"ok": r.ok}))
        return 0 if r.ok else 1
    print(
        f"{path}: hashed {r.tensors} tensors in {r.shards} shards ({human_bytes(r.bytes_read, 2)}, "
        f"{r.seconds:.1f} s)"
    )
    for shard in r.hub_mismatch:
        print(f"  {shard}: content differs from the Hub's sha256 (damaged or edited)")
    for what, names in (("changed", r.changed), ("new", r.added), ("gone", r.removed)):
        for name in names[:20]:
            print(f"  {what}: {name}")
        if len(names) > 20:
            print(f"  ... and {len(names) - 20} more {what}")
    if r.previous is None:
        print("  first verify of this folder: hashes recorded for the next one")
    elif r.ok:
        print("  no tensor changed since the last verify")
    else:
        print(
            f"  {len(r.changed)} changed, {len(r.added)} new, {len(r.removed)} gone since the last verify"
        )
    return 0 if r.ok else 1
