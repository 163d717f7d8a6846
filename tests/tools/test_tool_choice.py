"""Which tools a conversation has on (issue 44: oterm's per-chat tool choice), and what
the app says when tools cannot be used: the real app through Textual's pilot, the
scripted checkpoint that calls get_weather (tests/helpers/scripted_model.py), the test
MCP server over stdio (the official SDK).

F10 lists a toggle per server and per tool it offers; the choice made there is the
conversation's (`Conversation.tool_choice`), saved with it and read back on --resume. A
tool that is off is not in the prompt, and a call to it is answered "not enabled"
without asking; turned off mid-conversation, it leaves the model's context too."""

from __future__ import annotations

import json
import shutil

import pytest
from textual.widgets import SelectionList, Static

from ssdmoe_tui.config import load_config
from ssdmoe_tui.prompting.tool_support import NOT_SHOWN, tools_not_given
from ssdmoe_tui.sessions.store import Conversation, SessionStore
from ssdmoe_tui.tools.choice import ToolChoice
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.screens.tool_approval import ToolApprovalScreen
from ssdmoe_tui.ui.screens.tools import REFUSED, ToolsScreen
from ssdmoe_tui.ui.widgets.tool_blocks import ToolCallBlock, ToolResultBlock
from tests.helpers.chat_templates import CHATML
from tests.helpers.pilot import (
    SIZE,
    loaded,
    record_notifications,
    screen_text,
    type_and_send,
    wait_until,
)
from tests.helpers.tool_chat import (
    QUESTION,
    answered,
    make_app,
    replies,
    resumed,
    saved,
    settled,
)
from tests.tools.mcp_test_server import FORECAST

SCHEMA = "The weather for a city."  # get_weather's description: only in the tools block
WEATHER = ("weather", "get_weather")


async def f10_toggles(pilot, app: SsdmoeApp) -> SelectionList:
    """F10 with the test server started: its toggles, once they list its tools."""
    await pilot.press("f10")
    await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
    toggles = app.screen.query_one("#tools-on", SelectionList)
    if app.chat.tools.servers.pending():
        await pilot.press("s")
    await wait_until(
        pilot, lambda: toggles.option_count > 1, 60, "the server to start and its tools to show"
    )
    return toggles


async def toggle(pilot, app: SsdmoeApp, key: tuple[str, str]) -> None:
    """F10, Space on the toggle `key` ((server, "") or (server, tool)), Esc."""
    toggles = await f10_toggles(pilot, app)
    values = [toggles.get_option_at_index(i).value for i in range(toggles.option_count)]
    toggles.highlighted = values.index(key)
    await pilot.press("space")
    await pilot.press("escape")
    await wait_until(pilot, lambda: not isinstance(app.screen, ToolsScreen), what="F10 closed")


def shown(app: SsdmoeApp) -> str:
    """The screen's text, runs of blanks (and a line's wrap) as one space."""
    return " ".join(screen_text(app).split())


def prompt_text(app: SsdmoeApp) -> str:
    return app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))


def test_the_choice_round_trips_and_a_bad_one_is_named():
    choice = ToolChoice(frozenset({"files"}), frozenset({WEATHER}))
    assert ToolChoice.from_dict(json.loads(json.dumps(choice.as_dict()))) == choice
    assert not choice.allows(*WEATHER) and not choice.allows("files", "read")
    assert choice.allows("weather", "slow")
    assert choice.with_tool(*WEATHER, True).with_server("files", True) == ToolChoice()
    conv = Conversation("20261205-000000-abcdef", tool_choice=choice)
    assert Conversation.from_dict(conv.to_dict()).tool_choice == choice
    bad = {**conv.to_dict(), "tool_choice": {"tools_off": ["get_weather"]}}
    with pytest.raises(ValueError, match=r"tools_off must be a list of \[server, tool\] pairs"):
        Conversation.from_dict(bad)


async def test_a_tool_off_is_neither_offered_nor_run_and_the_choice_is_resumed(tool_model):
    app = make_app(tool_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        said = record_notifications(app)
        await toggle(pilot, app, WEATHER)
        choice = ToolChoice(tools_off=frozenset({WEATHER}))
        assert app.chat.tool_choice == choice
        assert ("information", "Tools for this conversation: 4 offered to the model.") in said
        await type_and_send(pilot, QUESTION)  # the scripted model calls get_weather anyway
        await wait_until(pilot, lambda: len(replies(app)) == 2 and settled(app), 90, "answer")
        assert not app.query(ToolApprovalScreen)  # not asked about
        (call,) = app.query(ToolCallBlock)
        assert call.call.name == "get_weather" and call.state == "not enabled"
        (result,) = app.query(ToolResultBlock)
        assert result.text.startswith(
            "Error: the tool 'get_weather' is not enabled in this conversation (enabled: slow, "
        )
        assert (
            "warning",
            "get_weather is off in this conversation (F10): the model was told so",
        ) in said
        prompt = prompt_text(app)
        assert SCHEMA not in prompt and '"name": "slow"' in prompt  # the others are offered
        conv_id = await saved(pilot, app)
    assert SessionStore().get(conv_id).tool_choice == choice
    async with resumed(tool_model, conv_id) as (pilot, again):
        assert again.chat.tool_choice == choice
        assert again.query_one(ToolCallBlock).state == "not enabled"  # read from its result
        toggles = await f10_toggles(pilot, again)
        assert WEATHER not in toggles.selected and ("weather", "slow") in toggles.selected
        assert ("weather", "") in toggles.selected
        await pilot.press("escape")


async def test_a_server_turned_off_mid_conversation_leaves_the_models_context(tool_model):
    app = make_app(tool_model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await answered(pilot, app, "y")
        assert SCHEMA in prompt_text(app)
        await toggle(pilot, app, ("weather", ""))
        assert app.chat.tool_specs() == []
        await type_and_send(pilot, "Thanks!")
        await wait_until(pilot, lambda: len(replies(app)) == 3 and settled(app), 90, "a reply")
        prompt = prompt_text(app)
        # the history is templated again without the tools block; the exchange stays
        assert SCHEMA not in prompt and "<tools>" not in prompt
        assert f"<tool_response>\n{FORECAST}\n</tool_response>" in prompt
        conv_id = await saved(pilot, app)
    conv = SessionStore().get(conv_id)
    assert conv.tool_choice == ToolChoice(servers_off=frozenset({"weather"}))
    assert conv.tools_key == "" and [t.role for t in conv.turns][-2:] == ["user", "assistant"]


async def test_a_model_that_cannot_use_tools_says_so_once_and_f10_says_why(tool_model, tmp_path):
    """The scripted checkpoint with a template that takes no tools (plain ChatML): the
    server warns of such a model in each reply; the app says so once, at the load."""
    plain = tmp_path / "plain-template"
    shutil.copytree(tool_model, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config["chat_template"] = CHATML
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    app = make_app(plain)
    async with app.run_test(size=SIZE) as pilot:
        said = record_notifications(app)
        await loaded(pilot, app)
        line = (
            f"{app.chat.model.name} cannot use the tools of the MCP servers configured "
            f"(weather): {NOT_SHOWN}. F4 picks another model."
        )
        await wait_until(pilot, lambda: said, what="the notice")
        assert said == [("warning", line)]
        await pilot.press("f10")
        await wait_until(pilot, lambda: isinstance(app.screen, ToolsScreen), what="F10")
        notice = app.screen.query_one("#tools-cannot", Static)
        await wait_until(pilot, lambda: notice.region.height == 2, what="F10 saying why")
        assert str(notice.content) == line  # at the top, two lines of the dialog
        await pilot.press("escape")
    # the server's warning is worded by the same owner
    assert tools_not_given(3).startswith(f"{NOT_SHOWN}: the 3 tools sent")


async def test_f10_names_each_refused_table_when_none_could_be_used(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(
        '[mcp_servers.web]\nurl = "ftp://example.org/mcp"\n\n'
        '[mcp_servers.local]\ncommand = "npx"\ntimeout = "soon"\n'
    )
    config = load_config(path)
    assert config.config.mcp_servers == {} and len(config.warnings_about("mcp_servers")) == 2
    settings = ChatSettings(mcp_servers={}, config=config, warnings=config.warnings)
    app = SsdmoeApp(settings, engine_factory=None)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("f10")
        await wait_until(pilot, lambda: REFUSED in shown(app), what="F10 naming the tables")
        text = shown(app)
        assert "No MCP servers configured" not in text
        assert "web.url must be an http:// or https:// address; server 'web' not started" in text
        assert "local.timeout must be a number of seconds; server 'local' not started" in text
        await pilot.press("escape")
