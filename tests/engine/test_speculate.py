"""Speculative decoding (engine/spec): greedy tokens with prompt-lookup and oracle drafts
equal those without (and mlx-lm's), for every architecture, with the KV cache holding
exactly the tokens it says; sampling keeps the standard acceptance rule; the governor
prices rounds; bad values are one line."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load, stream_generate

from ssdmoe_tui.engine.model.loader import cast_model, load_streamed
from ssdmoe_tui.engine.policy import trace_routing
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.engine.spec.drafts import NgramDrafter, OracleDrafter
from ssdmoe_tui.engine.spec.governor import AUTO_DEPTH, Acceptance, Choice, CostModel, Governor
from ssdmoe_tui.engine.spec.mtp import check_mtp
from ssdmoe_tui.engine.spec.verify import verify_chunk
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.options import (
    Speculation,
    parse_depth_list,
    parse_draft_depth,
    parse_speculate,
    parse_speculate_list,
)

ARCHS = ["qwen3_moe", "qwen3_5_moe", "nemotron_h", "mixtral"]
# a prompt that repeats itself: prompt lookup finds matches and drafts from them
PROMPT = [5, 6, 7, 8, 9, 10, 11, 12] * 6
N = 24


def _mlx_lm(path, prompt):
    model, tok = load(str(path))
    cast_model(model, mx.float32)
    return [r.token for r in stream_generate(model, tok, mx.array(prompt), max_tokens=N)]


def _kv_offset(cache) -> int | None:
    offsets = [c.offset for c in cache if hasattr(c, "offset") and not hasattr(c, "cache")]
    return offsets[0] if offsets else None


@pytest.mark.parametrize("budget", ["1G", "1"])  # every expert, and the minimum cache
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_without_speculation(checkpoints, arch, budget):
    path = checkpoints(arch)
    sm = load_streamed(path, expert_cache=budget)
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    plain = runner.generate(PROMPT, max_tokens=N)
    assert len(set(plain.tokens)) > 3, "random checkpoint should not be degenerate"
    hybrid = arch in ("qwen3_5_moe", "nemotron_h")
    for spec in [
        Speculation("oracle", None, 1.0),
        Speculation("oracle", 3, 0.5),
        Speculation("ngram"),
        Speculation("none"),  # the bench's: never drafts, every round the plain step
    ]:
        res = runner.generate(PROMPT, max_tokens=N, speculate=spec, draft_reference=plain.tokens)
        assert res.tokens == plain.tokens, (spec, res.tokens, plain.tokens)
        sp = res.stats.spec
        assert sp.tokens == N - 1 and len(res.stats.k_per_token) == N
        # The cache holds the prompt and every generated token but the last: no more.
        assert res.covered_generated == N - 1
        off = _kv_offset(res.cache)
        assert off is None or off == len(PROMPT) + N - 1
        if spec.mode == "oracle":
            assert sp.verify_passes > 0, spec
        if spec.mode == "none":
            assert sp.verify_passes == sp.given_back == 0 and sp.depths == {0: N - 1}
        if spec.mode == "oracle" and spec.p == 0.5:
            assert 0 < sp.accepted < sp.drafted
            assert (sp.rerun_passes > 0) == hybrid  # recurrent state: restored and re-run
    # Prompt lookup with drafts on offer: the prompt holds the model's own continuation
    # (these two checkpoints then repeat parts of it: drafts are made and verified).
    echo = PROMPT + plain.tokens + PROMPT
    again = runner.generate(echo, max_tokens=N)
    res = runner.generate(echo, max_tokens=N, speculate=Speculation("ngram", 3))
    assert res.tokens == again.tokens
    if arch in ("qwen3_moe", "nemotron_h"):
        assert res.stats.spec.drafted > 0 and res.stats.spec.accepted > 0
    if budget == "1G" and arch in ("qwen3_moe", "nemotron_h"):
        assert plain.tokens == _mlx_lm(path, PROMPT)
    sm.close()


@pytest.mark.parametrize("arch", ["qwen3_moe", "nemotron_h"])
def test_penalties_see_the_same_tokens(checkpoints, arch):
    """With mlx-lm's logits processors (a repetition penalty) the processors see, at each
    position, the tokens they see without speculation: verify positions one by one, a
    given-back pipelined step unseen."""
    from mlx_lm.sample_utils import make_logits_processors

    sm = load_streamed(checkpoints(arch), expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    procs = make_logits_processors(repetition_penalty=1.5, repetition_context_size=20)
    plain = runner.generate(PROMPT, max_tokens=N, logits_processors=procs)
    given_back = 0
    # the governor at 100 %: at 80 % it rightly stops drafting on this tiny CPU model
    # once a verify round also pays for the pipelined step it gives back (governor.py)
    for spec in (Speculation("oracle", None, 1.0), Speculation("oracle", 2, 0.5)):
        res = runner.generate(PROMPT, max_tokens=N, logits_processors=procs, speculate=spec,
                              draft_reference=plain.tokens)  # fmt: skip
        assert res.tokens == plain.tokens, spec
        assert res.stats.spec.verify_passes > 0
        given_back += res.stats.spec.given_back
    # every expert held: the first round's d = 0 step was pipelined, and given back when
    # the next round drafted
    assert given_back > 0
    sm.close()


@pytest.mark.parametrize("arch", ["qwen3_moe", "nemotron_h"])
def test_cache_after_a_speculative_turn_continues_exactly(checkpoints, arch):
    """The next turn reuses the cache a speculative turn left (trimmed, or state put back
    and re-run): its tokens equal a fresh run over the whole history."""
    path = checkpoints(arch)
    sm = load_streamed(path, expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    plain = runner.generate(PROMPT, max_tokens=N)
    res = runner.generate(
        PROMPT, max_tokens=N, speculate=Speculation("oracle", 3, 0.5),
        draft_reference=plain.tokens,
    )  # fmt: skip
    history = res.covered_tokens + [res.tokens[-1], 40, 41, 42]
    resumed = runner.generate(history, max_tokens=8, cache=res.cache,
                              reused_tokens=len(res.covered_tokens))  # fmt: skip
    fresh = runner.generate(history, max_tokens=8)
    assert resumed.tokens == fresh.tokens
    sm.close()


def test_trace_routed_chunks_follow_the_trace(checkpoints, tmp_path):
    """Under --routing-trace a verify chunk routes its tokens to consecutive decode steps
    and the kept ones advance the trace: tokens equal the plain trace-routed run's."""
    from tests.helpers.traces import QWEN, cut_trace, shaped_checkpoint

    path = shaped_checkpoint(tmp_path / "q" / "ckpt", 12, 6)
    trace = cut_trace(QWEN, tmp_path / "cut.jsonl", 12, 40)
    sm = load_streamed(path, expert_cache="1G")
    routing = trace_routing.attach(sm, trace)
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm, prefill_step_size=64)
    prompt = list(range(3, 19))

    def run(**kw):
        routing.position, routing.phase, routing.wraps = -1, "prefill", 0
        return runner.generate(prompt, max_tokens=30, **kw)

    plain = run()
    pos = routing.position
    res = run(speculate=Speculation("oracle", 3, 0.6), draft_reference=plain.tokens)
    assert res.tokens == plain.tokens
    assert res.stats.spec.verify_passes > 0 and routing.position == pos
    sm.close()


def test_sampling_keeps_the_standard_acceptance_rule(checkpoints):
    """A point-mass draft d is accepted with probability p(d), and a rejection samples from
    p without d: the emitted token's distribution is the model's own."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    runner = Runner(sm)
    cache = runner.make_cache()
    ctx = mx.array([PROMPT[:-1]], dtype=mx.uint32)
    sm.model(ctx, cache=cache)
    temp = 1.5
    logits = sm.model(mx.array([[PROMPT[-1]]], dtype=mx.uint32), cache=cache)[0, -1]
    for c in cache:
        c.trim(1)
    p = np.array(mx.softmax(logits / temp, axis=-1))
    draft = int(np.argmax(p))
    mx.random.seed(7)

    def sampler(logprobs):
        return mx.random.categorical(logprobs * (1 / temp))

    n, counts = 600, np.zeros(p.size)
    accepted = 0
    for _ in range(n):
        v = verify_chunk(sm.model, cache, PROMPT[-1], [draft, 3], sampler)
        first = v.tokens[0]
        counts[first] += 1
        accepted += v.accepted > 0
        for c in cache:
            c.trim(v.kept)  # back to the context, for the next trial
    sd = math.sqrt(p[draft] * (1 - p[draft]) / n)
    assert abs(accepted / n - p[draft]) < 4 * sd + 1e-3
    top = np.argsort(p)[::-1][:3]
    for t in top:  # the emitted token follows p
        sd = math.sqrt(p[t] * (1 - p[t]) / n)
        assert abs(counts[t] / n - p[t]) < 4 * sd + 1e-3
    sm.close()


def test_ngram_drafter_proposes_the_latest_continuation():
    d = NgramDrafter()
    d.extend([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8])
    assert d.propose(3) == []  # suffix (4, 7, 8)/(7, 8) never seen before
    d.extend([2, 3, 4])
    assert d.propose(2) == [7, 8]  # the latest occurrence of (2, 3, 4) wins
    d.extend([1])
    assert d.propose(4) == []


def _latest_continuation(seq: list[int], depth: int) -> list[int]:
    """What prompt lookup proposes, by a search of the whole sequence: after the latest
    earlier occurrence of its last 3 tokens, else of its last 2."""
    for n in (3, 2):
        if len(seq) < n:
            continue
        for at in range(len(seq) - 1, n - 1, -1):
            if seq[at - n : at] == seq[-n:]:
                return seq[at : at + depth]
    return []


def test_ngram_drafter_equals_a_search_of_the_sequence():
    """The index, whose keys are kept from the last tokens, against a plain search, over
    sequences fed in pieces of 0-3 tokens (small alphabets: many repeats)."""
    rng = np.random.default_rng(5)
    for case in range(60):
        alphabet = int(rng.choice([2, 3, 8, 40]))
        seq = [int(t) for t in rng.integers(0, alphabet, int(rng.integers(0, 30)))]
        d = NgramDrafter()
        d.extend(seq)
        for _ in range(120):
            piece = [int(t) for t in rng.integers(0, alphabet, int(rng.integers(0, 4)))]
            d.extend(piece)
            seq += piece
            depth = int(rng.integers(-1, 7))
            want = _latest_continuation(seq, depth) if depth > 0 else []
            assert d.propose(depth) == want, (case, len(seq), depth)


def test_cost_model_folds_deferred_steps_as_measured_one_by_one():
    """The cost model keeps pipelined one-token rounds (CostModel.note_step) and folds
    them when a price is built or another figure measured: the same figures as measuring
    each as it ran, whatever the number kept (fewer or more than a window's)."""
    rng = np.random.default_rng(2)
    for count in (3, 15, 16, 40, 150):
        seconds, lookups = rng.uniform(1e-3, 4e-3, count), rng.integers(0, 9, count)
        steps = [(float(s), int(k)) for s, k in zip(seconds, lookups, strict=True)]
        one, folded = CostModel(128, 8, 1 << 20), CostModel(128, 8, 1 << 20)
        for c in (one, folded):
            c.measure(1, 0.002, 0.0, 8, 0, 0)
            c.measure(3, 0.005, 0.0, 20, 0, 0)
        half = count // 2
        for s, k in steps[:half]:
            one.measure(1, s, 0.0, k, 0, 0)
            folded.note_step(s, k)
        one.measure_cold(0.004)  # another figure: the kept rounds are folded before it
        folded.measure_cold(0.004)
        for s, k in steps[half:]:
            one.measure(1, s, 0.0, k, 0, 0)
            folded.note_step(s, k)
        governor = Governor(folded, Acceptance())
        governor.choose(2)  # a price is built: every kept round is folded first
        assert folded.pace == one.pace and folded.version == one.version, count
        for n in (1, 2, 3, 5):
            assert folded.compute(n) == one.compute(n), (count, n)
        assert folded.pipeline_loss() == one.pipeline_loss()
        assert list(folded.passes[1]._samples) == list(one.passes[1]._samples)


def test_oracle_drafts_are_wrong_at_rate_one_minus_p():
    ref = list(range(2000))
    o = OracleDrafter(ref, 0.7, vocab=5000, seed=1)
    o.extend([0])  # the prompt
    o.extend([ref[0]])
    drafts = o.propose(1999)
    right = sum(a == b for a, b in zip(drafts, ref[1:], strict=False))
    assert abs(right / len(drafts) - 0.7) < 0.05
    assert all(0 <= t < 5000 for t in drafts)
    assert o.propose(2) == drafts[:2]  # a position is drafted alike every time


def test_governor_prices_rounds_and_falls_back_to_zero():
    costs = CostModel(num_experts=128, k=8, expert_bytes=1 << 20)
    costs.measure(1, 0.010, 0.0, 48 * 8, 0, 0)
    costs.measure(3, 0.012, 0.0, 48 * 20, 0, 0)
    costs.measure(5, 0.014, 0.0, 48 * 30, 0, 0)
    good = Governor(costs, Acceptance(hits=9, trials=10))
    assert good.choose(4).depth >= 2
    assert good.choose(0).depth == 0
    bad = Governor(costs, Acceptance(hits=0, trials=10))
    assert bad.choose(4).depth == 0
    # the same acceptance, but every extra expert is a disk read: drafting loses
    disk = CostModel(num_experts=128, k=8, expert_bytes=1 << 20, disk_bytes_s=1e9)
    disk.measure(1, 0.006, 0.004, 48 * 8, 4, 4 << 20)
    disk.measure(3, 0.005, 0.025, 48 * 20, 25, 25 << 20)
    assert Governor(disk, Acceptance(hits=6, trials=10)).choose(4).depth == 0
    assert Governor(disk, Acceptance(hits=6, trials=10), fixed=2).choose(4).depth == 2


class _CountingGovernor(Governor):
    """A governor that counts its price-table builds at measured prices (not a probe's)."""

    builds = 0

    def _build(self, pending, pass_s):  # noqa: ANN001, ANN202
        self.builds += pass_s == self.costs.pass_s
        return super()._build(pending, pass_s)


def test_kept_price_tables_choose_as_fresh_ones():
    """Price tables kept by conditions (pending, chains) and across offers of 1-4 drafts
    choose as a governor built afresh each round, at every acceptance; while the
    acceptance is far from paying they are not rebuilt every REPRICE rounds."""
    costs = CostModel(num_experts=128, k=8, expert_bytes=1 << 20, all_held=True)
    costs.measure(1, 0.001, 0.0, 48 * 8, 0, 0)  # a chunk costs about a step per row
    costs.measure(3, 0.0026, 0.0, 48 * 20, 0, 0)
    costs.measure(5, 0.0042, 0.0, 48 * 30, 0, 0)
    costs.measure_cold(0.0011)
    costs.measure_waste(0.0009)
    acceptance = Acceptance(hits=0.0, trials=10.0)
    kept = _CountingGovernor(costs, acceptance)
    rng = np.random.default_rng(7)
    chosen = set()
    for i in range(600):
        costs.note_step(0.001, 48 * 8)  # the same step: prices do not move
        if i < 300:  # far from paying, then rising to 100 %
            acceptance.observe(0, 1)
        else:
            acceptance.observe(1, 1)
        if i == 299:
            assert kept.builds <= 4  # one per set of conditions, not one per 8 rounds
        offered, pending = int(rng.integers(1, 6)), bool(rng.integers(0, 2))
        kept.chains = bool(rng.integers(0, 2))
        fresh = Governor(costs, acceptance, chains=kept.chains)
        want = fresh.choose(offered, pending)
        got = kept.choose(offered, pending)
        if got.probe:  # a probe re-measures (a governor's own wait, not its prices)
            continue
        assert (got.depth, got.expected_tokens) == (want.depth, want.expected_tokens), i
        assert got.depth <= min(offered, AUTO_DEPTH)
        chosen.add(got.depth)
    assert 0 in chosen and len(chosen) > 1  # both sides of paying were met


def test_acceptance_falls_with_rejections():
    a = Acceptance()
    for _ in range(40):
        a.observe(0, 1)
    assert a.rate < 0.1
    for _ in range(40):
        a.observe(3, 3)
    assert a.rate > 0.9


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("7", "--speculate '7': use one of off, auto, ngram, mtp"),
        ("oracle", "--speculate 'oracle': use one of"),  # the bench's only
        ("none", "--speculate 'none': use one of off, auto, ngram, mtp"),  # the bench's only
    ],
)
def test_bad_speculate_is_one_line(text, msg):
    with pytest.raises(BadValueError, match=msg.replace("(", r"\(")):
        parse_speculate(text)


def test_bench_lists_and_depths():
    specs = parse_speculate_list("oracle:0.3,0.5,70%,ngram,none")
    assert [(s.mode, s.p) for s in specs] == [
        ("oracle", 0.3), ("oracle", 0.5), ("oracle", 0.7), ("ngram", 1.0), ("none", 1.0)
    ]  # fmt: skip
    assert parse_depth_list("auto,1,4") == [None, 1, 4]
    for bad in ("oracle:1.5", "oracle:x", "off"):
        with pytest.raises(BadValueError, match="--speculate"):
            parse_speculate_list(bad)
    with pytest.raises(BadValueError, match=r"--draft-depth 9 is out of range 1\.\.8"):
        parse_draft_depth("9")
    with pytest.raises(BadValueError, match="--draft-depth"):
        parse_draft_depth("0")


def test_mtp_names_why_not(checkpoints, tmp_path):
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    with pytest.raises(BadValueError, match="qwen3_moe has no MTP head"):
        check_mtp(sm.config, sm.path)
    cfg = dict(sm.config, model_type="qwen3_5_moe", mtp_num_hidden_layers=1)
    with pytest.raises(BadValueError, match="carries none of its weights"):
        check_mtp(cfg, sm.path)
    runner = Runner(sm)
    with pytest.raises(BadValueError, match="no MTP head"):
        runner.generate(PROMPT, max_tokens=4, speculate=Speculation("mtp"))
    sm.close()


def test_auto_drafts_nothing_on_mlx_cuda(checkpoints, monkeypatch):
    """On MLX-CUDA a verify chunk's kernels differ from a one-token step's and changed the
    greedy tokens on the H200 (docs/engine.md): `auto` stands down there, an explicit mode
    still drafts. The device probe is the one thing set here: this CPU plays MLX-CUDA."""
    from ssdmoe_tui.engine.experts import device_memory

    path = checkpoints("qwen3_moe")
    sm = load_streamed(path, expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    plain = runner.generate(PROMPT, max_tokens=N)
    monkeypatch.setattr(device_memory, "is_cuda", lambda: True)
    auto = runner.generate(PROMPT, max_tokens=N, speculate=Speculation("auto"))
    assert auto.tokens == plain.tokens and auto.stats.spec is None  # no round drafted
    asked = runner.generate(
        PROMPT, max_tokens=N, speculate=Speculation("oracle", 2, 1.0), draft_reference=plain.tokens
    )
    assert asked.stats.spec is not None and asked.stats.spec.verify_passes > 0
    monkeypatch.setattr(device_memory, "is_cuda", lambda: False)
    cpu = runner.generate(PROMPT, max_tokens=N, speculate=Speculation("auto"))
    assert cpu.stats.spec is not None and cpu.tokens == plain.tokens
    sm.close()


def test_bench_rounds_alternate_and_none_never_drafts(checkpoints, tmp_path):
    """`ssdmoe bench --speculate none,oracle`: plain runs first in even rounds and last in
    odd ones (ABBA), every row pairs with its round's plain run, `none` never drafts, and
    greedy tokens stay the plain run's; scripts/spec_summary.py reads the JSON (what the
    GPU script prints: a line a row, the oracle's alignment, the target met or not)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from ssdmoe_tui.bench.speculate import run_speculate

    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    runner = Runner(sm)
    lines: list[str] = []
    specs = parse_speculate_list("none,oracle:1")
    res = run_speculate(runner, PROMPT, 12, specs, [None], 2, lines.append)
    sm.close()
    runs = [ln.strip().rsplit(":", 1)[0] for ln in lines[1:]]
    assert runs == ["round 1/2", "none", "oracle:1", "oracle:1", "none", "round 2/2"], lines
    assert res["rounds"] == 2 and res["plain_same_tokens"]
    none, oracle = res["rows"]
    assert none["depths"] == {"0": 2 * 11} and none["same_tokens"] and none["ratio"] > 0
    assert oracle["same_tokens"] and oracle["oracle_diverged_at"] == [None, None]
    assert "oracle" not in none and none["probes"] == 0
    (tmp_path / "spec-demo-oracle.json").write_text(json.dumps(res))
    script = Path(__file__).parents[2] / "scripts" / "spec_summary.py"
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "spec-demo-oracle.json")],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "oracle: left plain at [None, None], references 1" in out
    assert "target oracle:1 auto >= 1.8: " in out and "none       depth auto" in out


def test_a_chained_step_stands_when_every_draft_is_kept(checkpoints):
    """verify_chunk's `chain`: the next step built on the chunk's last sample is the
    next one-token step when every draft is kept (its token is greedy decode's), and is
    trimmed away with the rejected positions otherwise."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    ctx = PROMPT[:-1]
    plain = runner.generate(PROMPT, max_tokens=5).tokens  # greedy after PROMPT

    def greedy(lp):
        return mx.argmax(lp, axis=-1)

    for drafts, whole in ((plain[:3], True), ([plain[0], (plain[1] + 1) % 64, 3], False)):
        cache = runner.make_cache()
        sm.model(mx.array([ctx], dtype=mx.uint32), cache=cache)
        built: list = []

        def chain(last, cache=cache, built=built):
            y = greedy(sm.model(last[None], cache=cache)[0, -1])
            mx.async_eval(y)
            built.append(y)

        v = verify_chunk(sm.model, cache, PROMPT[-1], drafts, greedy, chain=chain)
        assert len(built) == 1 and v.chained == whole
        if whole:
            assert v.tokens == plain[:4] and int(built[0].item()) == plain[4]
            assert _kv_offset(cache) == len(PROMPT) + 4
        else:
            assert v.tokens == plain[:2] and _kv_offset(cache) == len(PROMPT) + 1
    sm.close()


def test_the_pace_prices_passes_at_todays_speed():
    """Samples are kept relative to the one-token pace: a machine twice as slow now
    prices a 3-token pass twice as high, measured before the slowdown."""
    costs = CostModel(num_experts=32, k=4, expert_bytes=1 << 16, all_held=True)
    costs.measure(1, 0.004, 0.0, 16, 0, 0)
    costs.measure(3, 0.008, 0.0, 40, 0, 0)
    assert costs.compute(3) == pytest.approx(0.008)
    for _ in range(40):
        costs.measure(1, 0.008, 0.0, 16, 0, 0)
    assert costs.compute(3) == pytest.approx(0.016, rel=0.01)


def test_oracle_follows_the_reply_not_the_position():
    """A reply that leaves the reference (a near-tie flipped on MLX-CUDA) is not drafted
    the reference's tokens by position from there on: the drafter follows a reference the
    reply still equals, else re-anchors on the longest suffix found in one, else drafts
    nothing, and says where the reply left."""
    ref = list(range(100, 140))
    o = OracleDrafter(ref, 1.0, vocab=500)
    o.extend([1, 2, 3])  # the prompt
    o.extend(ref[:5])
    assert o.propose(3) == ref[5:8] and o.diverged_at is None
    o.extend([7])  # the flip: the reply is another text from here
    assert o.diverged_at == 5
    assert o.propose(3) == []  # by position it would draft ref[6:9], all wrong now
    o.extend([8, 9])
    assert o.propose(2) == [] and o.unanchored == 2
    o.extend(ref[20:23])  # the reply meets the reference again: 3 tokens re-anchor it
    assert o.propose(3) == ref[23:26] and o.reanchored == 1
    # another run's reply that the reply still equals is drafted from, whole
    other = [*ref[:5], 7, 8, 9, *ref[20:30]]
    o2 = OracleDrafter(ref, 1.0, vocab=500, also=[other])
    o2.extend([1, 2, 3])
    o2.extend(other[:6])
    assert o2.propose(4) == other[6:10] and o2.diverged_at == 5
    assert o2.figures() == {"references": 2, "diverged_at": 5, "reanchored": 0, "unanchored": 0}


def test_oracle_drafts_the_reply_after_it_left_the_reference(checkpoints):
    """The CPU stand-in for the MLX-CUDA flip: a reference that leaves greedy decode at
    token 3 (another reply from there). Position-aligned drafts were then wrong for the rest
    of the reply (acceptance ~0 after token 3, the H100's 1.8 %); aligned by context the
    oracle stops drafting there, and drafts the greedy reply once a run of it is known."""
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    plain = runner.generate(PROMPT, max_tokens=N).tokens
    other = runner.generate(PROMPT[::-1], max_tokens=N).tokens
    flipped = [*plain[:3], (plain[3] + 1) % 64, *other[: N - 4]]
    spec = Speculation("oracle", 2, 1.0)
    alone = runner.generate(PROMPT, max_tokens=N, speculate=spec, draft_reference=flipped)
    assert alone.tokens == plain
    fig = alone.stats.spec
    assert fig.oracle["diverged_at"] == 3 and fig.drafted <= 4  # nothing drafted after
    both = runner.generate(
        PROMPT, max_tokens=N, speculate=spec, draft_reference=flipped, draft_also=[plain]
    )
    assert both.tokens == plain and both.stats.spec.oracle["diverged_at"] == 3
    assert both.stats.spec.acceptance > 0.8 and both.stats.spec.drafted > N // 2
    sm.close()


def _simulate(tokens, c1=0.0017, chunk_x=2.0, cold=0.0017, waste=0.0017, accept=True,
              first_chunk_s=0.0):  # fmt: skip
    """The spec loop's pricing on synthetic pass costs (the governor is a pure function of
    its measurements): every round has 4 drafts on offer, all right (`accept`) or all
    wrong; a d = 0 step costs c1 pipelined, c1 + cold after a verify round; a chunk of 5
    costs chunk_x * c1 (linear from c1 at 1), a given-back step `waste`; each chunk size's
    first pass costs `first_chunk_s` more (a shape compiling on MLX-CUDA). Returns the
    speedup over plain decode at c1 a token, the depths used and the probes."""
    costs = CostModel(num_experts=32, k=4, expert_bytes=1 << 16, all_held=True)
    acc = Acceptance()
    gov = Governor(costs, acc)
    pending, spent, made, depths, probes, compiled = False, 0.0, 0, {}, 0, set()
    while made < tokens:
        choice = gov.choose(4, pending) if made else Choice(0, 1.0, None)
        d = choice.depth
        probes += choice.probe
        depths[d] = depths.get(d, 0) + 1
        if d == 0:
            if pending or not made:
                costs.measure(1, c1, 0.0, 16, 0, 0)
                spent += c1
            else:
                costs.measure_cold(c1 + cold)
                spent += c1 + cold
            acc.observe(int(accept), 1)  # the shadow trial
            made, pending = made + 1, True
        else:
            if pending:
                costs.measure_waste(waste)
                spent += waste
            c = c1 * (1 + (chunk_x - 1) * d / 4) + (first_chunk_s if d not in compiled else 0)
            compiled.add(d)
            costs.measure(d + 1, c, 0.0, 16, 0, 0)
            spent += c
            acc.observe(d if accept else 0, d if accept else 1)
            made, pending = made + (d + 1 if accept else 1), False
    return made * c1 / spent, depths, probes


@pytest.mark.parametrize("chunk_x", [1.2, 1.5, 2.0])
def test_governor_drafts_at_h100_pass_costs(chunk_x):
    """The H100's demo figures: 1.7 ms a token, a chunk of 5 at 1.2-2x a token, the cold
    step after a verify round and a given-back step about a token each. At 100 %
    acceptance the governor must find depth 4 and pay >= 1.8x (issue 43 item 3), and
    give a built step back for it."""
    speedup, depths, probes = _simulate(200, chunk_x=chunk_x)
    assert speedup >= 1.8 and depths.get(4, 0) >= 35 and depths.get(0, 0) <= 3, depths
    costs = CostModel(num_experts=32, k=4, expert_bytes=1 << 16, all_held=True)
    for _ in range(15):
        costs.measure(1, 0.0017, 0.0, 16, 0, 0)
        costs.measure(5, 0.0017 * chunk_x, 0.0, 16, 0, 0)
        costs.measure_cold(0.0034)
        costs.measure_waste(0.0017)
    assert Governor(costs, Acceptance(hits=19, trials=20)).choose(4, pending=True).depth == 4


def test_governor_probes_a_stale_price_and_not_where_drafts_fail():
    """A chunk shape compiling (100 ms on its first pass) priced drafting out for good:
    the H100's {0: 194, 4: 1} at 0.78x. The governor re-measures after PROBE_EVERY
    refused rounds and drafts again; where drafts never match it never probes, and
    where a chunk is truly dear its probes back off (a round in hundreds)."""
    speedup, depths, probes = _simulate(200, first_chunk_s=0.1)
    assert probes >= 1 and depths.get(4, 0) >= 25 and speedup > 1.0, (speedup, depths)
    speedup, depths, probes = _simulate(1000, first_chunk_s=0.1)
    assert speedup >= 1.8, (speedup, depths)
    speedup, depths, probes = _simulate(300, accept=False)
    assert probes == 0 and depths.get(0, 0) >= 290 and speedup > 0.97, depths
    speedup, depths, probes = _simulate(1000, chunk_x=8.0, cold=0.0)
    assert probes <= 5 and speedup >= 0.97, (speedup, depths, probes)
