"""gpt-oss in the chat app, end to end: a gpt-oss checkpoint whose greedy decoding is a
harmony script (tests/helpers/scripted_gpt_oss.py: it reasons on the analysis channel,
calls get_weather, and answers on the final channel once the result is in), the real
engine, a real MCP server (the SDK's, over stdio), the app driven by Textual's pilot.
The reasoning is shown apart (collapsed, its tokens counted), the call reaches the
approval and the tool loop, the answer is the final channel's text alone, and all of it
comes back so when the conversation is resumed."""

from __future__ import annotations

import pytest

from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage
from tests.helpers.pilot import SIZE, errors, loaded
from tests.helpers.scripted_gpt_oss import ANSWER, write_gpt_oss_tool_model
from tests.helpers.tool_chat import answered, make_app, resumed, saved
from tests.tools.mcp_test_server import FORECAST

THOUGHT = "Need the weather."


@pytest.fixture(scope="module")
def gpt_oss_model(tmp_path_factory):
    return write_gpt_oss_tool_model(tmp_path_factory.mktemp("gpt-oss") / "gpt-oss-tool-script")


async def test_reasoning_apart_and_the_tool_loop(gpt_oss_model):
    app = make_app(gpt_oss_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, "y")  # asks, approves get_weather {"city": "Paris"}
        first, second = app.query(AssistantMessage)
        assert first.split.thinking == THOUGHT and first.answer == ""
        assert first.has_class("thinks") and first.thinking_block.collapsed
        assert first.thinking_block.title.startswith("thinking · ")  # its tokens counted
        assert "<|" not in first.answer + second.answer
        assert second.answer == ANSWER and not second.split.has_thinking
        (call,) = app.query(ToolCallBlock)
        assert call.call.name == "get_weather" and call.state == "done"
        assert [r.text for r in app.query(ToolResultBlock)] == [FORECAST]
        prompt = app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))
        assert "<|start|>functions.get_weather to=assistant<|channel|>commentary" in prompt
        assert [m.role for m in app.chat.history] == ["user", "assistant", "tool", "assistant"]
        assert not errors(app)
        conv_id = await saved(pilot, app)
    # resumed: the replies are split again from their saved text, the call a block again
    async with resumed(gpt_oss_model, conv_id) as (pilot, again):
        first, second = again.query(AssistantMessage)
        assert (first.split.thinking, first.answer, second.answer) == (THOUGHT, "", ANSWER)
        assert [b.call.name for b in again.query(ToolCallBlock)] == ["get_weather"]
