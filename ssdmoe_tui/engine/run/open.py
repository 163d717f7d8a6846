"""The one way into the engine: `EngineOptions` -> a `Runner` over a streamed model.

Opening happens in two steps so that nothing is lost to a bad value:

1. `plan_engine(options)`: resolve the model spec to a folder (the demo model, a
   folder, or the Hugging Face cache, downloading if needed) and read its header-only
   expert index; check K and prefill K against its expert count. Cheap, no weights.
2. `load_engine(plan)`: build the streamed model and its Runner.

The chat service runs step 1 while the current model is still loaded, and drops that
model only once the plan is good, so a typo in a path, a K of 999 or a bad cache size
never costs the working model. `generate`, `bench`, `repack` and the service all
come through here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ssdmoe_tui.options import EngineOptions, check_k
from ssdmoe_tui.units import human_bytes

if TYPE_CHECKING:
    from ssdmoe_tui.engine.experts.index import ExpertIndex
    from ssdmoe_tui.engine.run.runner import Runner

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class EnginePlan:
    """A model that passed every check that needs no weights."""

    options: EngineOptions
    path: Path
    index: ExpertIndex  # header-only: layers, experts, expert bytes


def resolve_model_spec(
    spec: str,
    *,
    say: Say = _quiet,
    download: Callable | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """'' -> the embedded demo model (made on first use); a folder; a Hub repo id."""
    if not spec:
        from ssdmoe_tui.models.demo import ensure_demo_model

        return Path(ensure_demo_model(progress=say))
    from ssdmoe_tui.models.resolve import resolve_model

    return Path(resolve_model(spec, progress=download, cancel=cancel))


def plan_engine(
    options: EngineOptions,
    *,
    say: Say = _quiet,
    download: Callable | None = None,
    cancel: threading.Event | None = None,
) -> EnginePlan:
    """Step 1: everything that can fail on a typo, before any model is touched."""
    from ssdmoe_tui.engine.experts.index import load_index
    from ssdmoe_tui.engine.policy.policies import parse_policy

    parse_policy(options.policy)
    path = resolve_model_spec(options.model, say=say, download=download, cancel=cancel)
    index, _ = load_index(path)
    check_k(options.k, index.num_experts, "K")
    check_k(options.prefill_k, index.num_experts, "prefill K")
    return EnginePlan(options, path, index)


def memory_need(plan: EnginePlan, kv_budget_bytes: int = 0) -> int:
    """What a load of `plan` declares to the model lock: resident weights + expert cache
    (a set budget, or the `auto` rule's figure now) + KV budget. An estimate made before
    any weights are read (the cache's real floor, K x layers slots, may raise it)."""
    from ssdmoe_tui.engine.experts.cache import auto_budget

    index = plan.index
    all_experts = index.expert_bytes * index.num_experts * index.num_layers
    budget = plan.options.expert_cache
    if budget.auto:
        cache = auto_budget(index, index.resident_bytes, index.expert_bytes * index.num_layers)
    else:
        cache = min(budget.bytes or 0, all_experts)
    return index.resident_bytes + cache + max(0, kv_budget_bytes)


def load_engine(
    plan: EnginePlan, *, say: Say = _quiet, notice: Say = _quiet, distributed=None
) -> Runner:
    """Step 2: the streamed model and its Runner (the owner of K). `distributed`
    (`engine.distributed.Distributed`): this rank's share of an expert-parallel launch."""
    from ssdmoe_tui.engine.model.loader import load_streamed
    from ssdmoe_tui.engine.run.runner import Runner

    o = plan.options
    budget = o.expert_cache
    sm = load_streamed(
        plan.path,
        expert_cache="auto" if budget.auto else budget.bytes,
        k=o.k,
        dtype=o.dtype,
        reader_queue_depth=o.queue_depth,
        reader=o.reader,
        direct_io=o.direct_io,
        policy=o.policy,
        prefetch=o.prefetch,
        experts=o.experts,
        progress=say,
        distributed=distributed,
        index=plan.index,
    )
    try:
        runner = Runner(sm, o.prefill_step, k=o.k, prefill_k=o.prefill_k)
        if o.routing_trace:
            from ssdmoe_tui.engine.policy.trace_routing import attach, check_trace_k

            routing = attach(sm, o.routing_trace)
            check_trace_k("--k", o.k, routing.k)
            check_trace_k("--prefill-k", o.prefill_k, routing.k)
            runner.k = routing.k
    except BaseException:
        sm.close()
        raise
    got = sm.cache.budget_bytes
    if budget.bytes is not None and got > budget.bytes:
        notice(
            f"expert cache {budget.text} is below this model's minimum "
            f"({sm.cache.capacity} experts = trained K x {sm.index.num_layers} MoE layers): "
            f"using {human_bytes(got)} ({got:,} bytes)"
        )
    return runner


def open_engine(
    options: EngineOptions,
    *,
    say: Say = _quiet,
    notice: Say = _quiet,
    download: Callable | None = None,
    cancel: threading.Event | None = None,
    distributed=None,
) -> Runner:
    """Plan and load in one go (commands that hold no other model)."""
    plan = plan_engine(options, say=say, download=download, cancel=cancel)
    return load_engine(plan, say=say, notice=notice, distributed=distributed)
