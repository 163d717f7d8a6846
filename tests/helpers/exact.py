"""The two sides of every exactness test: plain mlx-lm's greedy tokens and the streamed
engine's, on the same checkpoint, prompt, K and dtype."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm import load, stream_generate

from ssdmoe_tui.engine.model.loader import cast_model, load_streamed, set_model_k
from ssdmoe_tui.engine.run.runner import Runner

PROMPT = [
    {
        "role": "user",
        "content": "Tell me about mixtures of experts and streaming weights from disk, please.",
    }
]
MAX_TOKENS = 24


def reference_tokens(path, k: int | None, dtype, prompt):
    model, tok = load(str(path))
    if dtype != mx.bfloat16:
        cast_model(model, dtype)
    if k is not None:
        set_model_k(model, k)
    return [r.token for r in stream_generate(model, tok, prompt, max_tokens=MAX_TOKENS)]


def engine_tokens(path, k, budget, dtype=None):
    sm = load_streamed(path, expert_cache=budget, dtype=dtype)
    runner = Runner(sm)
    if k is not None:
        runner.set_k(k)
    prompt = sm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    res = runner.generate(prompt, max_tokens=MAX_TOKENS)
    return sm, prompt, res
