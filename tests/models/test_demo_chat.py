"""The first replies a newcomer reads (issue 44, items 1 and 4): the shipped demo answers
a greeting and plain questions in words when no tool is listed (never a tool call, never
the old canned "I have no tool for that" line), and with the tests' MCP server's tools
listed it calls get_weather only for the weather, not for "Hello!".

The prompts are `scripts/demo_dialogues.EVAL_PROMPTS`, held out verbatim from the chat
mix those weights were fine-tuned on. Skipped while the shipped weights predate that mix
(their training.json has no `chat_dialogues`): the weights before it called a tool for
"Who are you?" with no tools listed (docs/quality.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ssdmoe_tui.cli import main
from ssdmoe_tui.models.demo import TRAINED_DIR, ensure_demo_model

SCRIPTS = str(Path(__file__).resolve().parents[2] / "scripts")
sys.path.insert(0, SCRIPTS)
try:
    from demo_dialogues import EVAL_PROMPTS
    from demo_eval import CANNED, TEST_SERVER_TOOLS, parse_call
finally:
    sys.path.remove(SCRIPTS)

_CORPUS = json.loads((TRAINED_DIR / "training.json").read_text())["corpus"]
pytestmark = pytest.mark.skipif(
    "chat_dialogues" not in _CORPUS,
    reason="the shipped demo predates the chat mix of scripts/demo_dialogues.py",
)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return ensure_demo_model(tmp_path_factory.mktemp("demo-chat") / "demo")


def _reply(demo, capsys, prompt: str, raw: bool = False) -> dict:
    capsys.readouterr()
    argv = ["generate", "--model", str(demo), "--prompt", prompt, "--max-tokens", "60"]
    assert main([*argv, *(["--raw"] if raw else []), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_without_tools_every_newcomer_prompt_gets_words(demo, capsys):
    for prompt in EVAL_PROMPTS:
        got = _reply(demo, capsys, prompt)
        assert parse_call(got["text"]) is None, (prompt, got["text"])
        assert CANNED not in got["text"], (prompt, got["text"])
        assert "<|" not in got["text"], (prompt, got["text"])
    hello = _reply(demo, capsys, "Hello!")
    assert hello["finish_reason"] == "stop", hello["text"]  # a short greeting, not a loop


def test_with_tools_listed_only_the_weather_question_calls_one(demo, capsys):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(demo))

    def with_tools(q: str) -> dict:
        text = hf.apply_chat_template([{"role": "user", "content": q}], tools=TEST_SERVER_TOOLS,
                                      tokenize=False, add_generation_prompt=True)  # fmt: skip
        return _reply(demo, capsys, text, raw=True)

    assert parse_call(with_tools("Hello!")["text"]) is None
    call = parse_call(with_tools("What is the weather in Paris?")["text"])
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}, call
