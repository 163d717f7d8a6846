"""`ssdmoe bench --quick`: alternating rounds, medians, per-layer costs, one JSON."""

from __future__ import annotations

from ssdmoe_tui.cli import main
from tests.helpers.cli_runner import main_json


def test_quick_bench_alternates_and_reports_the_per_layer_costs(checkpoints, tmp_path, capsys):
    printed, r = main_json(
        [
            "bench", "--quick", "--model", str(checkpoints("qwen3_moe")), "--rounds", "3",
            "--prompt-tokens", "8", "--decode-tokens", "4",
        ],
        tmp_path / "quick.json",
        capsys,
    )  # fmt: skip
    assert "bench-quick:" in printed and "per MoE layer:" in printed
    assert r["kind"] == "bench-quick" and r["conditions"]["rounds"] == 3
    small, every = r["configs"]["small"], r["configs"]["every"]
    assert every["share_of_experts"] == 1.0 and every["hit_rate"] == 1.0
    assert every["ms_per_token"]["router_sync"] == 0.0  # held: no host sync
    for c in (small, every):
        assert len(c["decode_ratios"]) == 3 and c["decode_ratio_median"] > 0
        assert c["tokens_match_resident"] is True  # greedy output is mlx-lm's
    layer = r["per_moe_layer"]
    assert layer["sync_us"] > 0 and all(v > 0 for v in layer["build_us"].values())
    # the router-mass meter adds no node to the block's graph
    assert layer["kernels"]["streamed_held_mass_meter_on"] == layer["kernels"]["streamed_held"]


def test_quick_needs_three_rounds(checkpoints, capsys):
    rc = main(["bench", "--quick", "--model", str(checkpoints("qwen3_moe")), "--rounds", "2"])
    assert rc != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--rounds must be >= 3 (alternations for a median), got 2")
