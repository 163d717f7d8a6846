"""The `reuse` policy (next-token reuse learned online) against the default on real traces.

Its parameters were fitted on the Qwen3-30B-A3B trace only; gpt-oss-120b and OLMoE are
held out. Measured margins over cycle-lfu (docs/cache-policy.md): gpt-oss +1.3 / +0.9
points at 1xK / 2xK per layer, OLMoE +2.5 at 3xK. The asserted margins sit well below.
"""

from __future__ import annotations

import pytest

from ssdmoe_tui.bench.trace_replay import replay
from ssdmoe_tui.engine.policy.traces import read_trace
from tests.helpers.fixture_paths import TRACES

GPTOSS = TRACES / "bigmoeonedge-route-trace" / "2026-07-15-route-trace" / "gptoss.route.csv"
OLMOE = TRACES / "olmoe-1b-7b-vllm-layer0" / "moe_routes.jsonl"


@pytest.mark.parametrize(
    ("path", "per_layer", "margin"), [(GPTOSS, 2, 0.6), (GPTOSS, 4, 0.4), (OLMOE, 24, 1.5)]
)
def test_reuse_beats_cycle_lfu_on_held_out_traces(path, per_layer, margin) -> None:
    trace = read_trace(path)
    slots = per_layer * max(1, trace.meta.num_layers)
    base = replay(trace, "cycle-lfu", slots)
    new = replay(trace, "reuse", slots)
    assert new.lookups == base.lookups > 0
    assert 100 * (new.hit_rate - base.hit_rate) >= margin, (new.hit_rate, base.hit_rate)
