"""The shipped demo model has learned (docs/quality.md): cheap checks of its two claims.

1. On English prose it never saw (the GPL-3 and Apache-2.0 texts, held out of training),
   `ssdmoe eval` at the trained K gives a perplexity of at most a tenth of the vocabulary
   size, and a random-weight twin of the same config and tokenizer gives more than the
   vocabulary size.
2. Its routing has locality: a per-layer LRU of 2xK experts replayed on its own
   `generate --trace` hits at least 10 points more than on the random twin's, same prompt.
"""

from __future__ import annotations

import json

import pytest

from ssdmoe_tui.bench.trace_replay import replay
from ssdmoe_tui.cli import main
from ssdmoe_tui.engine.policy.traces import read_trace
from ssdmoe_tui.models.demo import TRAINED_DIR, ensure_demo_model, write_checkpoint
from tests.helpers.fixture_paths import FIXTURES

HELDOUT = FIXTURES / "heldout" / "gpl3.txt"
APACHE = FIXTURES / "heldout" / "apache-2.0.txt"
PROMPT = "Explain how a program reads a file and writes the result to the screen."
RAW_ENDS = ("See also", "Copyright", "NAME", "The options are")  # as scripts/demo_eval.py


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo-trained")
    demo = ensure_demo_model(root / "demo")
    config = json.loads((demo / "config.json").read_text())
    twin = write_checkpoint(
        config, root / "twin", seed=0, group_size=32, tokenizer_from=TRAINED_DIR
    )
    return demo, twin, config


def _perplexity(model, tmp_path, name: str, text=HELDOUT) -> float:
    out = tmp_path / f"{name}.json"
    argv = ["eval", "--model", str(model), "--text", str(text), "--k", "4"]
    # 512 tokens, the shortest window of docs/quality.md's table: v7's first 256 tokens of
    # Apache-2.0 (its title, URL and definitions list) gave 215, its first 512 gave 151.
    assert main([*argv, "--max-tokens", "512", "--json", str(out)]) == 0
    return json.loads(out.read_text())["by_k"]["4"]["perplexity"]


def _lru_hit_rate(model, tmp_path, name: str, k: int) -> tuple[float, int]:
    trace = tmp_path / f"{name}.trace.json"
    argv = ["generate", "--model", str(model), "--raw", "--prompt", PROMPT]
    argv += ["--max-tokens", "160", "--temp", "0.7", "--seed", "1", "--trace", str(trace)]
    argv += ["--ignore-eos"]  # 160 steps of routing, past the end tokens it may sample
    assert main(argv) == 0
    t = read_trace(trace)
    res = replay(t, "lru", 2 * k, per_layer=True, decode_only=True)
    return res.hit_rate, t.decode_steps()


def test_the_demo_predicts_held_out_prose_and_a_random_twin_does_not(pair, tmp_path):
    demo, twin, config = pair
    vocab = config["vocab_size"]
    assert config["num_experts_per_tok"] == 4
    trained = _perplexity(demo, tmp_path, "demo")
    random = _perplexity(twin, tmp_path, "twin")
    assert trained <= vocab / 10, trained
    assert random > vocab, random
    apache = _perplexity(demo, tmp_path, "demo-apache", APACHE)
    assert apache <= vocab / 10, apache


def test_the_demo_routes_with_locality_a_random_twin_lacks(pair, tmp_path, capsys):
    demo, twin, config = pair
    k = config["num_experts_per_tok"]
    trained, steps = _lru_hit_rate(demo, tmp_path, "demo", k)
    random, _ = _lru_hit_rate(twin, tmp_path, "twin", k)
    capsys.readouterr()
    assert steps >= 64, steps  # enough decode steps to mean something
    assert trained >= random + 0.10, (trained, random)


def test_the_demo_stops_on_every_end_token_its_tokenizer_marks(pair, tmp_path, capsys):
    """Issue 33 N9/D3: the demo learned `<|endoftext|>` between documents; a raw
    continuation reached it and ran on into a fake `<|im_start|>user` turn, shown as
    text. Both of its end tokens now end a reply (as Qwen3's generation_config has it)."""
    from tokenizers import Tokenizer

    demo, _, config = pair
    tok = Tokenizer.from_file(str(demo / "tokenizer.json"))
    ends = {tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")}
    assert set(config["eos_token_id"]) == ends
    # a raw continuation the demo ends at <|endoftext|> (greedy; "See also" in 184 tokens
    # for v6): the first of these prompts that one does, as weights change
    # (scripts/demo_eval.py reports each of them for new weights before they ship)
    texts = []
    for prompt in RAW_ENDS:
        capsys.readouterr()
        argv = ["generate", "--model", str(demo), "--raw", "--prompt", prompt]
        assert main([*argv, "--max-tokens", "300", "--json"]) == 0
        got = json.loads(capsys.readouterr().out)
        assert "<|" not in got["text"] and "<tool_call>" not in got["text"], got["text"]
        if got["finish_reason"] == "stop":
            assert got["token_ids"][-1] == tok.token_to_id("<|endoftext|>")  # where it stopped
            assert "user" not in got["text"], got["text"]
            return
        texts.append(got["text"])
    raise AssertionError(f"no raw continuation of {RAW_ENDS} ended: {texts}")
