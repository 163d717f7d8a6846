"""GLM-4.6's and DeepSeek-R1's formats in the chat app, end to end (issue 44 item 7;
gpt-oss's harmony: tests/app/test_ui_harmony.py). A checkpoint whose greedy decoding
follows a script written the family's way (tests/helpers/scripted_model.py with the
family's genuine chat template, its special tokens that Qwen3's vocabulary lacks added
whole, as its own tokenizer has them): asked about the weather it reasons in <think>,
then calls get_weather in the family's call format (GLM's `<tool_call>NAME<arg_key>..`,
DeepSeek's `<｜tool▁calls▁begin｜>..function<｜tool▁sep｜>NAME ```json`); with the tool's
result in its context it answers. The real engine, a real MCP server (the SDK's, over
stdio), the app driven by Textual's pilot: the reasoning is shown apart, the call
reaches the approval dialog and the tool loop, the answer follows the result."""

from __future__ import annotations

import pytest

from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage
from tests.helpers.fixture_paths import genuine_template
from tests.helpers.pilot import SIZE, errors, loaded, record_notifications
from tests.helpers.scripted_model import ANSWER, write_tool_model
from tests.helpers.tool_chat import answered, make_app
from tests.tools.mcp_test_server import FORECAST

THOUGHT = "Need a forecast"  # no token the answer needs (each token occurs once)
DS = {n: f"<｜{n}｜>" for n in ("tool▁calls▁begin", "tool▁calls▁end", "tool▁call▁begin",
      "tool▁call▁end", "tool▁sep", "tool▁outputs▁begin", "tool▁outputs▁end",
      "tool▁output▁begin", "tool▁output▁end", "Assistant", "User")}  # fmt: skip
FAMILIES = {
    "glm-4.6": {
        "call": "get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>",
        "new_tokens": ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                       "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"),
        "starts": ("<|assistant|>",),
        # what the template renders a tool's result as, in the next prompt
        "result": f"<|observation|>\n<tool_response>\n{FORECAST}\n</tool_response>",
    },
    "deepseek-r1": {
        "call": f'function{DS["tool▁sep"]}get_weather\n```json{{"city":"Paris"}}```',
        "new_tokens": tuple(DS.values()),
        # the generation prompt: <｜Assistant｜>, or after tool results their end
        "starts": (DS["Assistant"], DS["tool▁outputs▁end"]),
        "wrap": (DS["tool▁calls▁begin"] + DS["tool▁call▁begin"],
                 DS["tool▁call▁end"] + DS["tool▁calls▁end"]),
        "marker": DS["tool▁output▁begin"],
        "result": f"{DS['tool▁output▁begin']}{FORECAST}{DS['tool▁output▁end']}",
    },
}  # fmt: skip


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_model(request, tmp_path_factory):
    spec = dict(FAMILIES[request.param])
    spec.pop("result")
    folder = tmp_path_factory.mktemp(request.param) / f"{request.param}-tool-script"
    model = write_tool_model(
        folder, template=genuine_template(request.param), thought=THOUGHT, **spec
    )
    return request.param, model


async def test_reasoning_apart_and_the_familys_calls_reach_the_tool_loop(family_model):
    family, model = family_model
    app = make_app(model)
    async with app.run_test(size=SIZE) as pilot:
        said = record_notifications(app)
        await loaded(pilot, app)
        await answered(pilot, app, "y")  # asks, approves get_weather {"city": "Paris"}
        # DeepSeek's genuine templates render no tools (the model cards have the client
        # write them into the system prompt): the app says so once; GLM's shows them
        cannot = [text for _, text in said if "cannot use the tools" in text]
        assert len(cannot) == (1 if family == "deepseek-r1" else 0), said
        first, second = app.query(AssistantMessage)
        assert first.split.thinking.strip() == THOUGHT and first.answer.strip() == ""
        assert first.has_class("thinks") and first.thinking_block.collapsed
        assert second.answer.strip() == ANSWER and not second.split.has_thinking
        (call,) = app.query(ToolCallBlock)
        assert call.call.name == "get_weather" and call.state == "done"
        assert call.call.args() == {"city": "Paris"}
        assert [r.text for r in app.query(ToolResultBlock)] == [FORECAST]
        prompt = app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))
        assert FAMILIES[family]["result"] in prompt  # the family's own template wrote it
        assert [m.role for m in app.chat.history] == ["user", "assistant", "tool", "assistant"]
        assert not errors(app)
