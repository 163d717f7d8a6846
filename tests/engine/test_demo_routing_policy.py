"""Cache policies on real routing: the embedded trained demo's own 4000-token recording
(tests/fixtures/traces/SOURCES.md, section 4). docs/cache-policy.md "Real routing: the
trained demo" has the full table over four prompts; this checks its two findings."""

from __future__ import annotations

from ssdmoe_tui.bench.trace_replay import replay
from ssdmoe_tui.engine.policy.traces import read_trace
from tests.helpers.fixture_paths import TRACES

DEMO = TRACES / "ssdmoe-demo-trained" / "grep-4000.jsonl.gz"
SLOTS = 32  # 2 x K per layer (K 4, 4 layers): a cache where the policy matters


def _hit(trace, policy: str) -> float:
    return 100 * replay(trace, policy, SLOTS).hit_rate


def test_the_recording_is_the_demos_long_routing():
    t = read_trace(DEMO)
    m = t.meta
    assert (m.k, m.num_layers, m.num_experts) == (4, 4, 32) and m.extra["ignore_eos"] is True
    assert t.decode_steps() == 4000


def test_more_history_narrows_the_gap_to_belady():
    """cycle-lfu's distance to the offline optimum over the first 256 decode tokens and
    over all 4000 (measured 12.7 and 11.2 points): the longer recording closes 1.6."""
    t = read_trace(DEMO)
    gaps = {}
    for n in (256, 4000):
        head = t.head(n)
        gaps[n] = _hit(head, "belady") - _hit(head, "cycle-lfu")
    assert 10.0 < gaps[4000] < gaps[256] - 1.0, gaps


def test_reuse_beats_cycle_lfu_on_real_routing():
    """Next-token reuse learns the demo's routing: +1.8 points at 2xK over 1024 tokens
    (68.2 vs 66.4 %; every prompt and budget of the doc's table gains 1.1-2.9)."""
    head = read_trace(DEMO).head(1024)
    assert _hit(head, "reuse") >= _hit(head, "cycle-lfu") + 1.0
