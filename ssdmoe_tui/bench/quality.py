"""What a lower K costs in quality: teacher-forced scores of a text at each K.

For one text and one streamed engine, at the trained K and at each K asked for:
- perplexity of the text (teacher-forced: every position predicts the next token of
  the text, whatever the model would have generated);
- agreement: the share of positions whose most likely next token equals the trained
  K's, and the mean KL divergence from the trained K's next-token distribution;
- router mass kept (engine/model/routing_mass.py), averaged over every position and layer.

All K run over the same chunks, each with its own KV cache, so only one chunk of
logits per K is alive at a time. Random-weight checkpoints (the demo model, the
tests' checkpoints) run it end to end, but the numbers only mean something on a
trained model.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ssdmoe_tui.errors import BadValueError
from ssdmoe_tui.user_files import TEXT_FILE_MAX, read_regular_text

RANDOM_WEIGHTS_NOTE = (
    "the numbers only mean something on a trained model (such as the demo); on random "
    "weights (test checkpoints, `demo-model --config`) they only show that the measurement runs"
)


def text_tokens(tokenizer, path: Path, max_tokens: int) -> list[int]:
    """The first `max_tokens` ids of the file's text, tokenized raw (no chat template)."""
    path = Path(path)
    try:
        text = read_regular_text(path, TEXT_FILE_MAX)
    except FileNotFoundError:
        raise BadValueError(f"--text: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadValueError(f"--text {path}: cannot read it as UTF-8 text ({e})") from None
    ids = list(tokenizer.encode(text))[:max_tokens]
    if len(ids) < 2:
        raise BadValueError(f"--text {path}: needs at least 2 tokens, has {len(ids)}")
    return ids


@dataclass
class _Scored:
    """One model under teacher forcing: `forward(x, cache)` gives its logits; `meter`
    (the engine's routing-mass meter) is read after each chunk when set."""

    key: object
    forward: Callable
    cache: list
    meter: object = None
    sums: dict = field(
        default_factory=lambda: {
            "nll": 0.0,
            "agree": 0,
            "kl": 0.0,
            "mass": 0.0,
            "mass_min": math.inf,
        }
    )


def _teacher_force(
    scored: list[_Scored], tokens: list[int], chunk: int, log: Callable[[str], None]
) -> int:
    """Every model over the same chunks, each with its own KV cache; the first is the
    reference of agreement and KL. Only one chunk of logits per model is alive at a time.
    Returns the number of positions scored."""
    import mlx.core as mx

    if chunk < 1:
        raise BadValueError(f"--chunk must be >= 1, got {chunk}")
    inputs, targets = tokens[:-1], tokens[1:]
    n = len(inputs)
    for start in range(0, n, chunk):
        x = mx.array(inputs[start : start + chunk], dtype=mx.uint32)[None]
        y = mx.array(targets[start : start + chunk], dtype=mx.uint32)
        ref_lp = ref_arg = None
        for m in scored:
            if m.meter is not None:
                m.meter.clear()
            logits = m.forward(x, m.cache)[0].astype(mx.float32)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            nll = -mx.take_along_axis(lp, y[:, None], axis=-1).sum()
            arg = mx.argmax(lp, axis=-1)
            mass = m.meter.take() if m.meter is not None else None
            if ref_lp is None:
                ref_lp, ref_arg = lp, arg
                agree, kl = mx.array(y.size), mx.array(0.0)
            else:
                agree = (arg == ref_arg).sum()
                kl = (mx.exp(ref_lp) * (ref_lp - lp)).sum()
            out = [nll, agree, kl] + ([mass.sum(), mass.min()] if mass is not None else [])
            mx.eval(out, [c.state for c in m.cache])
            s = m.sums
            s["nll"] += out[0].item()
            s["agree"] += int(out[1].item())
            s["kl"] += out[2].item()
            if mass is not None:
                s["mass"] += out[3].item()
                s["mass_min"] = min(s["mass_min"], out[4].item())
        mx.clear_cache()
        log(f"  {min(start + chunk, n)}/{n} positions")
    return n


def _scores(s: dict, n: int) -> dict:
    """Perplexity, agreement with and KL from the reference, of one model's sums."""
    return {
        "positions": n,
        "perplexity": round(math.exp(s["nll"] / n), 4),
        "mean_nll": round(s["nll"] / n, 5),
        "agreement": round(s["agree"] / n, 4),
        "kl": round(max(s["kl"], 0.0) / n, 6),
    }


def measure_quality(
    sm,
    tokens: list[int],
    ks: list[int],
    chunk: int = 128,
    log: Callable[[str], None] = lambda _: None,
) -> dict[int, dict]:
    """{K: scores} for the trained K and every K in `ks` (see the module docstring)."""
    from mlx_lm.models.cache import make_prompt_cache

    trained = sm.trained_k
    order = [trained] + [k for k in dict.fromkeys(ks) if k != trained]
    for k in order:
        if not 1 <= k <= sm.index.num_experts:
            raise BadValueError(f"K={k} is outside 1..{sm.index.num_experts}")
    meter = sm.measure_routing_mass()

    def at_k(k: int) -> Callable:
        def forward(x, cache):
            sm.set_k(k)
            return sm.model(x, cache=cache)

        return forward

    scored = [_Scored(k, at_k(k), make_prompt_cache(sm.model), meter) for k in order]
    previous_all_tokens = meter.all_tokens if meter else False
    if meter is not None:
        meter.all_tokens = True
    try:
        n = _teacher_force(scored, tokens, chunk, log)
    finally:
        if meter is not None:
            meter.all_tokens = previous_all_tokens
            meter.clear()
        sm.set_k(trained)
    result: dict[int, dict] = {}
    for m in scored:
        q = _scores(m.sums, n)
        result[m.key] = {
            "k": m.key,
            "positions": n,
            "perplexity": q["perplexity"],
            "mean_nll": q["mean_nll"],
            "agreement_with_trained_k": q["agreement"],
            "kl_from_trained_k": q["kl"],
            "routing_mass": round(m.sums["mass"] / n, 4) if meter is not None else None,
            "routing_mass_min": round(m.sums["mass_min"], 4) if meter is not None else None,
        }
    return result


def measure_against(
    sm,
    k: int,
    other,
    tokens: list[int],
    chunk: int = 128,
    log: Callable[[str], None] = lambda _: None,
) -> dict:
    """The streamed model at K (the reference) and `other`, a resident mlx-lm model of
    the same architecture (a lower-bit copy), on the same text: each one's perplexity,
    and the other's agreement with and KL from the streamed one's next tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    def streamed(x, cache):
        sm.set_k(k)
        return sm.model(x, cache=cache)

    ref = _Scored("streamed", streamed, make_prompt_cache(sm.model))
    alt = _Scored("resident", lambda x, cache: other(x, cache=cache), make_prompt_cache(other))
    try:
        n = _teacher_force([ref, alt], tokens, chunk, log)
    finally:
        sm.set_k(sm.trained_k)
    a, b = _scores(ref.sums, n), _scores(alt.sums, n)
    return {
        "k": k,
        "positions": n,
        "streamed": {"perplexity": a["perplexity"], "mean_nll": a["mean_nll"]},
        "resident": {
            "perplexity": b["perplexity"],
            "mean_nll": b["mean_nll"],
            "agreement_with_streamed": b["agreement"],
            "kl_from_streamed": b["kl"],
        },
    }


def quality_table(by_k: dict, trained_k: int) -> str:
    """A short table: one row per K."""
    heads = ["K", "perplexity", f"same top token as K={trained_k}", "KL (nats)", "router mass"]
    rows = [
        [
            str(q["k"]),
            f"{q['perplexity']:.3f}",
            f"{q['agreement_with_trained_k']:.1%}",
            f"{q['kl_from_trained_k']:.4f}",
            "-" if q["routing_mass"] is None else f"{q['routing_mass']:.1%}",
        ]
        for q in sorted(by_k.values(), key=lambda q: -q["k"])
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def quality_legend(trained_k: int, width: int = 100) -> str:
    """What the quality columns mean, wrapped to `width`, and the random-weights caveat."""
    text = (
        "perplexity: of the text, teacher-forced; same top token: positions whose most likely "
        f"next token is the K={trained_k} one; KL: mean divergence from the K={trained_k} "
        "next-token distribution; router mass: the router's probability kept by the experts "
        f"run, against K={trained_k} (100% there)."
    )
    return textwrap.fill(text, width) + "\n" + textwrap.fill(f"note: {RANDOM_WEIGHTS_NOTE}", width)
