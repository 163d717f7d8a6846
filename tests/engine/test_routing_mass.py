"""The cost of K: router mass kept per token (every architecture), `ssdmoe eval`, the panel."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest

from ssdmoe_tui.checkpoint.arch import ARCHITECTURES
from ssdmoe_tui.cli import main
from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.run.runner import Runner
from tests.helpers.cli_runner import main_json

TEXT = (
    "Mixture-of-experts models send every token to a few experts. Fewer experts per token "
    "read fewer bytes, and keep less of what the router wanted. "
) * 4


def _masses(sm, k: int, tokens: int = 4) -> list[float]:
    sm.measure_routing_mass()
    runner = Runner(sm)
    runner.k = k
    sm.tokenizer.eos_token_ids = set()  # exactly `tokens` tokens
    res = runner.generate(list(range(3, 14)), max_tokens=tokens)
    assert res.stats.k_per_token == [k] * tokens
    assert len(res.stats.mass_per_token) == tokens
    return res.stats.mass_per_token


MEASURED = [a for a, e in ARCHITECTURES.items() if e.streamed and e.routing != "none"]


@pytest.mark.parametrize("arch", MEASURED)
def test_mass_is_one_at_trained_k_and_below_one_under_it(checkpoints, arch):
    sm = load_streamed(checkpoints(arch), expert_cache="1")
    try:
        trained = sm.trained_k
        assert _masses(sm, trained) == pytest.approx([1.0] * 4, abs=1e-5)
        lower = _masses(sm, max(1, trained // 2))
        assert all(0.0 < m < 0.999 for m in lower), lower
        if trained // 2 > 1:
            assert sum(_masses(sm, 1)) < sum(lower)  # fewer experts keep less
    finally:
        sm.close()


def test_mass_matches_the_router_computed_by_hand(checkpoints):
    """qwen3_moe, first MoE layer, one decode step: softmax of the gate, top-K over top-trained-K."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1")
    try:
        sm.set_k(2)
        block = sm.blocks[0]
        x = mx.random.normal((1, 1, sm.config["hidden_size"]))
        meter = sm.measure_routing_mass()
        meter.clear()
        block(x)
        got = meter.take()
        # only layer 0 ran: its own ratio
        p = mx.softmax(block.gate(x).astype(mx.float32), axis=-1)[0, 0]
        meter.clear()
        top = sorted(p.tolist(), reverse=True)
        assert got.item() == pytest.approx(sum(top[:2]) / sum(top[:4]), rel=1e-5)
    finally:
        sm.close()


def test_generate_json_and_bench_record_the_mass(checkpoints, capsys):
    rc = main(
        [
            "generate", "--model", str(checkpoints("mixtral")), "--k", "1", "--raw",
            "--prompt", "hello there", "--max-tokens", "3", "--json",
        ]
    )  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < out["stats"]["routing_mass"] < 1
    assert out["stats"]["routing_mass_min"] <= out["stats"]["routing_mass"]


def test_eval_runs_end_to_end_and_matches_plain_mlx_lm(checkpoints, tmp_path, capsys):
    from mlx_lm import load as mlx_load

    from ssdmoe_tui.bench.quality import measure_quality, text_tokens
    from ssdmoe_tui.engine.model.loader import cast_model

    path = checkpoints("qwen3_moe")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    printed, res = main_json(
        [
            "eval", "--model", str(path), "--text", str(text), "--k", "4,2,1",
            "--max-tokens", "40", "--chunk", "16",
        ],
        tmp_path / "eval.json",
        capsys,
    )  # fmt: skip
    assert "perplexity" in printed and "only mean something on a trained model" in printed
    assert res["conditions"]["trained_k"] == 4 and res["conditions"]["text_tokens"] == 40
    by_k = res["by_k"]
    assert set(by_k) == {"4", "2", "1"}
    t = by_k["4"]
    assert t["agreement_with_trained_k"] == 1.0 and t["kl_from_trained_k"] == 0.0
    assert t["routing_mass"] == pytest.approx(1.0, abs=1e-4)
    assert 0 < by_k["1"]["routing_mass"] < by_k["2"]["routing_mass"] < 1
    for q in by_k.values():
        assert q["positions"] == 39 and q["perplexity"] > 1

    # Teacher forcing is chunking-independent and is plain mlx-lm's perplexity at trained K.
    sm = load_streamed(path, expert_cache="1")
    try:
        ids = text_tokens(sm.tokenizer, text, 40)
        one = measure_quality(sm, ids, [4], chunk=64)[4]
    finally:
        sm.close()
    assert one["perplexity"] == pytest.approx(t["perplexity"], rel=1e-4)
    model, _ = mlx_load(str(path))
    cast_model(model, mx.float32)
    logits = model(mx.array(ids[:-1])[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(lp, mx.array(ids[1:])[:, None], axis=-1).mean().item()
    assert one["mean_nll"] == pytest.approx(nll, rel=1e-4)


def test_eval_bad_text_is_one_line(checkpoints, tmp_path, capsys):
    rc = main(["eval", "--model", str(checkpoints("qwen3_moe")), "--text", str(tmp_path / "no")])
    assert rc != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("ssdmoe: error: --text: file not found") and "Traceback" not in err


async def test_panel_shows_the_mass_live_with_a_sparkline(checkpoints):
    """The app on a real engine at K below the trained K: the panel shows the mass."""
    from textual.widgets import Sparkline

    from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
    from tests.helpers.pilot import loaded, send

    app = SsdmoeApp(ChatSettings(model=str(checkpoints("qwen3_moe")), k=2, max_tokens=12))
    async with app.run_test(size=(120, 40)) as pilot:
        await loaded(pilot, app)
        samples = []
        show = app.panel.show_sample
        app.panel.show_sample = lambda s: (samples.append(s), show(s))
        await send(pilot, "hi")
        await pilot.pause(0.1)
        last = samples[-1]
        assert last.k == 2 and last.routing_mass is not None and last.routing_mass < 1
        assert app.panel.shown["mass"] == f"{last.routing_mass * 100:.1f} %"
        spark = app.panel.query_one("#spark-mass", Sparkline)
        assert spark.data and all(0 < v < 1 for v in spark.data)


def test_nemotron_mass_uses_plain_sigmoids_over_the_biased_selection(checkpoints):
    """nemotron_h: selection ranks sigmoid + correction bias; the mass sums plain sigmoids."""
    import numpy as np

    sm = load_streamed(checkpoints("nemotron_h"), expert_cache="1")
    try:
        sm.set_k(2)
        block = sm.blocks[0]
        gate = block.gate
        n, hidden = gate.weight.shape
        gate.weight = mx.random.normal((n, hidden), key=mx.random.key(1)) * 0.2
        gate.e_score_correction_bias = mx.random.normal((n,), key=mx.random.key(2)) * 0.3
        x = mx.random.normal((1, 1, hidden), key=mx.random.key(3))
        meter = sm.measure_routing_mass()
        meter.clear()
        block(x)
        got = meter.take().item()
        logits = np.array((x @ gate.weight.T)[0, 0], dtype=np.float64)
        sig = 1 / (1 + np.exp(-logits))
        order = np.argsort(-(sig + np.array(gate.e_score_correction_bias)))
        want = sig[order[:2]].sum() / sig[order[:4]].sum()
        assert got == pytest.approx(want, rel=1e-4)
        assert 0 < got < 1
    finally:
        sm.close()


def test_a_long_unread_turn_resolves_in_bounded_batches(checkpoints, monkeypatch):
    """The log resolves itself past MAX_PENDING_ROWS: same figures, bounded references."""
    from ssdmoe_tui.engine.model import routing_mass

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1")
    try:
        whole = _masses(sm, 2, tokens=6)
        monkeypatch.setattr(routing_mass, "MAX_PENDING_ROWS", 4)  # 3 layers: every 2 tokens
        runner = Runner(sm)
        runner.k = 2
        stream = runner.stream(list(range(3, 14)), max_tokens=6)
        seen, last = 0, None
        for ev in stream:
            stats = getattr(ev, "stats", None)
            if stats is not None and stats.mass_log is not None:
                seen, last = max(seen, len(stats.mass_log._pending)), stats
        assert last is not None and seen <= 2
        assert last.mass_per_token == pytest.approx(whole, rel=1e-6)
        # a model without a consumer keeps mlx-lm's gates: no probe, no mass
        sm.measure_routing_mass(False)
        assert type(sm.blocks[0].gate).__name__ in ("Linear", "QuantizedLinear")
        assert runner.generate(list(range(3, 14)), max_tokens=3).stats.mass_per_token == []
    finally:
        sm.close()
