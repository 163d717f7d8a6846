"""Issue 45: a tool's result survives a kill -9. Results were saved only with the model's
next reply, so killing the app with a result on screen lost it (3 of 3): `--resume`
showed the call without its result. Each result is now saved, atomically, as its call
ends. The app runs in a process of its own (tests/helpers/tool_kill_worker.py: the real
app, engine and MCP server), is SIGKILLed with the result on screen, and is resumed here
through the pilot: the call and its result are shown, and the conversation goes on with
the result in the model's context and its token ids recorded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ssdmoe_tui.sessions.store import SessionStore
from tests.helpers.mcp_servers import ROOT
from tests.helpers.pilot import SIZE, type_and_send, wait_until
from tests.helpers.tool_chat import make_app, replies, resumed_with_the_call, settled
from tests.tools.mcp_test_server import FORECAST

WORKER = ROOT / "tests" / "helpers" / "tool_kill_worker.py"


def _killed_with_a_result_on_screen(tool_model, tmp_path) -> str:
    """Run the worker until its result block is shown, SIGKILL it; the conversation id."""
    mark = tmp_path / "shown"
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), str(tool_model), str(mark)],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), (tmp_path / "worker.log").read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        log.close()
    return mark.read_text()


async def test_a_tool_result_on_screen_survives_kill_9_and_resume_shows_it(tool_model, tmp_path):
    conv_id = _killed_with_a_result_on_screen(tool_model, tmp_path)
    conv = SessionStore().get(conv_id)
    assert [t.role for t in conv.turns] == ["user", "assistant", "tool"]
    assert conv.turns[2].text == FORECAST and conv.turns[2].tool_name == "get_weather"
    assert "<tool_call>" in conv.turns[1].text  # the call, in the reply as generated
    folder = SessionStore().folder(conv_id)
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]

    app = make_app(tool_model, resume=conv_id)
    async with app.run_test(size=SIZE) as pilot:
        await resumed_with_the_call(pilot, app, conv_id, FORECAST)
        assert [m.role for m in app.chat.history] == ["user", "assistant", "tool"]
        await type_and_send(pilot, "Thanks!")
        await wait_until(pilot, lambda: len(replies(app)) == 2 and settled(app), 90, "a reply")
        prompt = app.chat.tokenizer.decode(list(app.chat.last_done.prompt_token_ids))
        assert f"<tool_response>\n{FORECAST}\n</tool_response>" in prompt
        await wait_until(pilot, lambda: not app.chat.engine.busy, what="the saves")
        await pilot.press("ctrl+q")
    conv = SessionStore().get(conv_id)
    assert [t.role for t in conv.turns] == ["user", "assistant", "tool", "user", "assistant"]
    assert conv.turns[2].text == FORECAST and conv.turns[2].token_ids  # its ids, now fed
    assert conv.history_tokens() == list(app.chat.last_done.prompt_token_ids) + list(
        app.chat.last_done.token_ids
    )
