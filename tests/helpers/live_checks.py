"""Checks a family's test and a real shape's test make the same way, on the streamed
engine against plain mlx-lm: greedy tokens decoded step by step, K changed live between
two decode steps, and a KV checkpoint of the prompt's caches saved, loaded, continued."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ssdmoe_tui.engine.model.loader import set_model_k
from ssdmoe_tui.sessions.checkpoints import load_checkpoint, save_checkpoint

PROMPT = list(range(5, 29))
STEPS = 6


def greedy(model, cache, prompt: list[int], steps: int, k_after=None) -> list[int]:  # noqa: ANN001
    """Greedy tokens decoded one by one; `k_after`: (step, set_k) called before that step."""
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for i in range(steps):
        if k_after is not None and i == k_after[0]:
            k_after[1]()
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
        logits = model(mx.array([[tok]]), cache=cache)
    return out


def k_changed_live(sm, ref_model, k: int, low: int) -> list[int]:  # noqa: ANN001
    """K set from `k` to `low` before decode step 3 on both sides: the streamed tokens equal
    mlx-lm's, and the engine ran the last step at `low`. Both end back at `k`."""
    set_model_k(ref_model, k)
    ref = greedy(ref_model, make_prompt_cache(ref_model), PROMPT, STEPS,
                 (3, lambda: set_model_k(ref_model, low)))  # fmt: skip
    set_model_k(ref_model, k)
    sm.set_k(k)
    got = greedy(sm.model, make_prompt_cache(sm.model), PROMPT, STEPS,
                 (3, lambda: sm.set_k(low)))  # fmt: skip
    assert got == ref and sm.times.last_k == low, (got, ref)
    sm.set_k(k)
    return got


def checkpoint_resumes(sm, folder) -> None:  # noqa: ANN001
    """A checkpoint of the prompt's caches, saved in `folder` and loaded, continues
    exactly where the live caches do."""
    live = make_prompt_cache(sm.model)
    sm.model(mx.array([PROMPT]), cache=live)
    mx.eval([c.state for c in live])
    saved = save_checkpoint(folder, live, PROMPT, "fp")
    assert saved.path is not None, saved.skipped
    loaded, n = load_checkpoint(folder, PROMPT + [1], "fp")
    assert n == len(PROMPT)
    follow = [7, 8, 9]
    a = sm.model(mx.array([follow]), cache=live)
    mx.eval(a)  # before the next call reads other experts into the slots it used
    b = sm.model(mx.array([follow]), cache=loaded)
    assert mx.array_equal(a, b).item()
