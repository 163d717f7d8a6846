"""The model a newcomer has uses tools (issue 44, item 4): the shipped demo, trained on
tool-use dialogues in its template's format (scripts/demo_dialogues.py), calls the test
MCP server's `get_weather` from the real app, the approval dialog asks, and the result
reaches its reply. No scripted checkpoint: the demo's own greedy decoding."""

from __future__ import annotations

from ssdmoe_tui.models.demo import ensure_demo_model
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from tests.helpers.pilot import SIZE, errors, loaded
from tests.helpers.tool_chat import answered, make_app, replies
from tests.tools.mcp_test_server import FORECAST


async def test_the_demo_calls_a_tool_the_user_approves_and_answers_with_its_result(tmp_path):
    demo = ensure_demo_model(tmp_path / "demo")
    app = make_app(demo)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, "y")  # asks "What is the weather in Paris?", approves
        (call,) = app.query(ToolCallBlock)
        assert call.call.name == "get_weather" and call.state == "done"
        assert call.call.args() == {"city": "Paris"}
        (result,) = app.query(ToolResultBlock)
        assert result.text == FORECAST  # "Paris: 21 C, sunny"
        first, answer = replies(app)
        assert first == ""  # the call's reply is the call alone
        assert "Paris" in answer and "21 C" in answer, answer
        assert app.chat.last_done.finish_reason == "stop"
        assert not errors(app)
