"""Exact verify (`--exact-verify`, engine/spec/exact.py): a verify chunk computed in
one-token decode's shapes. On this CPU in bfloat16 Nemotron-H's Mamba mixer is the
device-dependence in miniature: its chunk of 2-5 tokens gives logits up to 0.44 away
from one-token decode and a speculative reply leaves plain greedy (as every verify does
on MLX-CUDA); exact verify gives decode's logits bit for bit and plain greedy's tokens.
The flag is refused in one line where it does nothing."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from ssdmoe_tui.engine.model.loader import load_streamed
from ssdmoe_tui.engine.run.protocol import Generate
from ssdmoe_tui.engine.run.runner import Runner
from ssdmoe_tui.engine.spec.exact import ExactVerify
from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.options import Speculation

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12] * 6
N = 32


def _chunk_and_steps(model, tokens, exact):  # noqa: ANN001, ANN202
    """The logits of `tokens` fed as one chunk after PROMPT, and fed one at a time."""
    cache = make_prompt_cache(model)
    model(mx.array(PROMPT)[None], cache=cache)
    x = mx.array(tokens)[None]
    if exact is None:
        chunk = model(x, cache=cache)[0]
    else:
        with exact.rows():
            chunk = model(x, cache=cache)[0]
    cache = make_prompt_cache(model)
    model(mx.array(PROMPT)[None], cache=cache)
    steps = mx.concatenate([model(x[:, i : i + 1], cache=cache)[0] for i in range(len(tokens))])
    return chunk, steps


def _exact_as_decode(sm, ex, p: float) -> None:  # noqa: ANN001
    """A chunk split by `ex` is decode bit for bit, and an oracle turn at acceptance `p`
    with exact verify gives plain greedy's tokens; closes `sm`."""
    chunk, steps = _chunk_and_steps(sm.model, [13, 14, 15], ex)
    assert mx.array_equal(chunk, steps).item()
    plain = Runner(sm).generate(PROMPT, max_tokens=N)
    res = Runner(sm).generate(PROMPT, max_tokens=N, draft_reference=plain.tokens,
                              speculate=Speculation("oracle", 3, p, exact=True))  # fmt: skip
    assert res.tokens == plain.tokens and res.stats.spec.verify_passes > 0
    sm.close()


@pytest.mark.parametrize("budget", ["1G", "1"])  # every expert, and the minimum cache
def test_exact_verify_keeps_greedy_tokens_where_a_chunk_differs(checkpoints, budget):
    sm = load_streamed(checkpoints("nemotron_h"), expert_cache=budget, dtype="bfloat16")
    sm.tokenizer.eos_token_ids = set()
    runner = Runner(sm)
    # the chunk itself: plain differs from decode here, exact is decode bit for bit
    tokens = [13, 14, 15, 16, 17]
    chunk, steps = _chunk_and_steps(sm.model, tokens, None)
    assert float(mx.max(mx.abs(chunk - steps)).item()) > 0
    chunk, steps = _chunk_and_steps(sm.model, tokens, ExactVerify(sm.model))
    assert mx.array_equal(chunk, steps).item()
    # a speculating turn: the oracle drafts plain greedy's own tokens
    plain = runner.generate(PROMPT, max_tokens=N)
    inexact = runner.generate(PROMPT, max_tokens=N, speculate=Speculation("oracle", 4, 1.0),
                              draft_reference=plain.tokens)  # fmt: skip
    assert inexact.tokens != plain.tokens  # the near-tie flip exact verify is for
    for spec in (Speculation("oracle", 4, 1.0, exact=True),
                 Speculation("oracle", 2, 0.5, exact=True)):  # fmt: skip
        res = runner.generate(PROMPT, max_tokens=N, speculate=spec, draft_reference=plain.tokens)
        assert res.tokens == plain.tokens, spec
        assert res.stats.spec.verify_passes > 0 and res.stats.spec.accepted > 0
        assert res.covered_generated == N - 1
    # the model runs mlx-lm's own classes again after a round
    assert all(not type(m).__name__.startswith("Exact") for _, m in sm.model.named_modules())
    sm.close()


def test_bench_measures_both_verifies_in_the_same_rounds(checkpoints):
    """`bench --speculate oracle:1 --exact-verify`: each configuration twice, plain and
    exact verify, in every round; on Nemotron-H bf16 only the exact row keeps plain
    greedy's tokens."""
    from ssdmoe_tui.bench.speculate import run_speculate, table

    sm = load_streamed(checkpoints("nemotron_h"), expert_cache="1G", dtype="bfloat16")
    lines: list[str] = []
    res = run_speculate(Runner(sm), PROMPT, N, [Speculation("oracle", None, 1.0)], [4], 1,
                        lines.append, exact=True)  # fmt: skip
    sm.close()
    plain, exact = res["rows"]
    assert (plain["exact_verify"], exact["exact_verify"]) == (False, True)
    assert not plain["same_tokens"] and exact["same_tokens"]
    assert exact["acceptance"] == 1.0  # the oracle's drafts are plain greedy's: all kept
    assert "oracle:1 exact" in table(res)
    assert [ln.strip().split(":")[0] for ln in lines[1:]] == ["round 1/1", "oracle", "oracle"]


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_5_moe"])
def test_exact_verify_splits_mixers_dense_and_norms(checkpoints, arch):
    """Every token mixer (attention, gated delta), the router / shared expert / head
    matmuls and the norms outside them are split; the routed experts are not."""
    sm = load_streamed(checkpoints(arch), expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    ex = ExactVerify(sm.model)
    layers = len(sm.model.layers)
    assert ex.counts["mixers"] == layers
    assert ex.counts["norms"] == 2 * layers + 1  # input, post-attention, final
    assert ex.counts["dense"] >= layers  # a router per MoE layer (and a head or tied one)
    _exact_as_decode(sm, ex, 0.7)


def test_array_masks_and_refused_mixers(checkpoints):
    """DeepSeek-V3 passes its chunk an array mask (`return_array=True`): each token gets
    its row up to itself, or None where that row masks nothing, as decode does; in bf16
    its chunk is 5.6 off decode and exact verify makes it 0.0. A mixer that takes another
    per-chunk argument (Hunyuan's shared KV states) cannot be split: one line, naming it."""
    from ssdmoe_tui.errors import ModelError

    sm = load_streamed(checkpoints("deepseek_v3"), expert_cache="1G", dtype="bfloat16")
    chunk, steps = _chunk_and_steps(sm.model, [13, 14, 15, 16], None)
    assert float(mx.max(mx.abs(chunk - steps)).item()) > 0
    chunk, steps = _chunk_and_steps(sm.model, [13, 14, 15, 16], ExactVerify(sm.model))
    assert mx.array_equal(chunk, steps).item()
    sm.close()
    sm = load_streamed(checkpoints("hunyuan"), expert_cache="1G")
    with pytest.raises(ModelError, match=r"^--exact-verify: Attention also takes kv_states: "):
        ExactVerify(sm.model)
    sm.close()


def test_exact_verify_is_refused_without_speculation():
    with pytest.raises(BadValueError, match=r"--exact-verify .* needs --speculate"):
        Speculation("off", exact=True)
    # a request that turns speculation off turns exact verify off with it; one that names
    # a mode keeps the server's --exact-verify
    default = Speculation("ngram", exact=True)
    assert Generate("r", speculate="off").speculation(default) == Speculation("off")
    assert Generate("r", speculate="auto").speculation(default).exact
    assert Generate("r", draft_depth=2).speculation(default) == Speculation("ngram", 2, exact=True)
    assert str(Speculation("ngram", 3, exact=True)) == "ngram exact (depth 3)"


def test_auto_drafts_on_mlx_cuda_with_exact_verify(monkeypatch):
    from ssdmoe_tui.engine.experts import device_memory
    from ssdmoe_tui.engine.run.runner import auto_stands_down

    monkeypatch.setattr(device_memory, "is_cuda", lambda: True)
    assert auto_stands_down(Speculation("auto"))
    assert not auto_stands_down(Speculation("auto", exact=True))


def test_mlx_cuda_splits_the_routed_experts_too(checkpoints, monkeypatch):
    """On MLX-CUDA gather_qmm's kernel depends on the row count (tiled from 8 rows), so
    the experts are split there as well (the H100 probe: 1.78 logits off without, 0.0
    with); the split experts still give decode's logits and plain greedy's tokens."""
    from ssdmoe_tui.engine.experts import device_memory
    from ssdmoe_tui.engine.spec.exact import DEFAULT_PARTS, EXPERTS, device_parts

    assert device_parts() == DEFAULT_PARTS  # this CPU
    monkeypatch.setattr(device_memory, "is_cuda", lambda: True)
    assert EXPERTS in device_parts()
    sm = load_streamed(checkpoints("qwen3_moe"), expert_cache="1G")
    sm.tokenizer.eos_token_ids = set()
    ex = ExactVerify(sm.model)
    assert EXPERTS in ex.parts and ex.counts["experts"] == len(sm.model.layers)
    _exact_as_decode(sm, ex, 1.0)
