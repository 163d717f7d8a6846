"""A gpt-oss checkpoint whose greedy decoding is a harmony script: asked a question, it
reasons on the analysis channel and calls `get_weather` (a commentary message to
`functions.get_weather`, JSON arguments, `<|call|>`); once the tool's result is in its
context, it answers on the final channel (`<|return|>`).

mlx-lm's gpt_oss classes (attention with sinks and biases, alternating sliding and full
attention, SwitchGLU experts with biases and the clamped SwiGLU), small dimensions, 4-bit
like every test checkpoint, gpt-oss's genuine chat template over a byte-level vocabulary
(tests/helpers/harmony_tokenizer.py) whose extra words are the script's pieces. The
weights are set by hand as in tests/helpers/scripted_model.py:

* experts, routers and layer 0's attention are zero (the clamped SwiGLU of zeros is
  zero), so the residual stream at a position is its token's one-hot embedding;
* the LM head maps each script token to the next (weight 4): a bigram;
* harmony repeats `<|channel|>` and `<|message|>`, so two flags decide what follows
  them: two heads of layer 1 (full attention) find a marker anywhere before them (a
  constant query bias on RoPE's slowest pair against the marker's key) and write a flag
  dimension: flag A after the analysis word `Need` (the call's header and arguments
  follow), flag B after ` to=assistant`, which only the template's tool-result header
  has (the final answer follows). The candidates after those two tokens weigh 4 (the
  analysis), 3.5 + A (the call), 3 + 2B (the answer): with no flag the analysis wins,
  with A the call, with B (and A or not) the answer.

Every quantization group of a matrix holds one value besides 0 (the flags sit in the
last group of the hidden dimension, the script's tokens in the first), which 4-bit
affine quantization stores exactly."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.fixture_paths import MODELS
from tests.helpers.harmony_tokenizer import write_harmony_tokenizer
from tests.helpers.scripted_model import blank_model, save_scripted

ANALYSIS = ["Need", " the weather."]
CALL_HEADER = ["assistant", "commentary", " to=functions.get_weather ", "json"]
ARGUMENTS = '{"city":"Paris"}'
ANSWER = "It is 21 C and sunny in Paris."
RESULT_MARKER = " to=assistant"  # an added token: the tool result's header has it
WORDS = [*ANALYSIS, *CALL_HEADER, "analysis", ARGUMENTS, "final", ANSWER]
# The reply texts the script decodes to (what a client or the app sees generated).
CALL_REPLY = (
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
    f"commentary to=functions.get_weather <|constrain|>json<|message|>{ARGUMENTS}"
)  # then <|call|>, a stop token
ANSWER_REPLY = f"<|channel|>final<|message|>{ANSWER}"  # then <|return|>
CONFIG = {
    "model_type": "gpt_oss",
    "num_hidden_layers": 2,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "experts_per_token": 2,
    "hidden_size": 256,
    "intermediate_size": 128,
    "head_dim": 64,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "sliding_window": 128,
    "rms_norm_eps": 1e-05,
    "layer_types": ["sliding_attention", "full_attention"],
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}


def write_gpt_oss_tool_model(out: Path) -> Path:
    """Write the scripted checkpoint into `out` (tokenizer, template, config, weights)."""
    import numpy as np

    out = Path(out)
    ids = write_harmony_tokenizer(out, words=WORDS, added=[RESULT_MARKER])
    real = json.loads((MODELS / "gpt-oss-20b" / "config.json").read_text())
    config = {**CONFIG, "rope_theta": real["rope_theta"], "rope_scaling": real["rope_scaling"]}
    config["vocab_size"] = max(ids.values()) + 1
    config["eos_token_id"] = ids["<|return|>"]
    s = ids
    last_prompt = ord("t")  # the prompt ends "<|start|>assistant"; ids 0-255 are the bytes
    chains = [
        [last_prompt, s["<|channel|>"]],
        [s["<|channel|>"], s["analysis"], s["<|message|>"], s["Need"], s[" the weather."],
         s["<|end|>"], s["<|start|>"], s["assistant"], s["<|channel|>"]],
        [s["commentary"], s[" to=functions.get_weather "], s["<|constrain|>"], s["json"],
         s["<|message|>"]],
        [s[ARGUMENTS], s["<|call|>"]],
        [s["final"], s["<|message|>"]],
        [s[ANSWER], s["<|return|>"]],
    ]  # fmt: skip
    script = sorted({t for chain in chains for t in chain} | {s[RESULT_MARKER]})
    hidden = config["hidden_size"]
    flag_a, flag_b = hidden - 1, hidden - 2
    if len(script) > 32:
        raise ValueError(f"the script needs {len(script)} dimensions in the first group")
    dim = {t: i for i, t in enumerate(script)}

    model, a = blank_model(config, dim)
    head = a["lm_head.weight"]
    for chain in chains:
        for cur, nxt in zip(chain, chain[1:], strict=False):
            head[nxt, dim[cur]] = 4.0
    # after <|channel|>: analysis 4 (above), the call's 3.5 + A, the answer's 3 + 2B
    for after, call_next, answer_next in (
        (s["<|channel|>"], s["commentary"], s["final"]),
        (s["<|message|>"], s[ARGUMENTS], s[ANSWER]),
    ):
        head[call_next, dim[after]] = 3.5
        head[call_next, flag_a] = 1.0
        head[answer_next, dim[after]] = 3.0
        head[answer_next, flag_b] = 2.0
    # layer 1: q head 0 (kv head 0) finds "Need", q head 4 (kv head 1) finds " to=assistant"
    att, hd = "model.layers.1.self_attn.", config["head_dim"]
    slow = hd // 2 - 1  # RoPE's slowest pair: distance barely turns it
    scale = np.sqrt(hidden)  # the input norm makes a one-hot embedding sqrt(hidden) long
    for q_head, kv_head, marker, flag in (
        (0, 0, s["Need"], flag_a),
        (4, 1, s[RESULT_MARKER], flag_b),
    ):
        a[att + "q_proj.bias"][q_head * hd + slow] = 8.0
        a[att + "k_proj.weight"][kv_head * hd + slow, dim[marker]] = 16.0 / scale
        a[att + "v_proj.weight"][kv_head * hd, dim[marker]] = 1.0 / scale
        a[att + "o_proj.weight"][flag, q_head * hd] = 1.0
    save_scripted(model, a, config, out)
    return out
