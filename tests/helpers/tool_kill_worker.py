"""The app in a process of its own, stopped with a tool's result on screen, for
tests/tools/test_tool_crash.py to SIGKILL there.

    python tests/helpers/tool_kill_worker.py MODEL MARK [MODE]   (SSDMOE_HOME set by the caller)

It runs the real app (Textual's pilot, headless), the real engine on the scripted
checkpoint (tests/helpers/scripted_model.py) and the real MCP server over stdio: asks the
weather, approves the call, and once the result block is in the transcript (the call
answered, the model's next reply not asked for yet) writes the conversation id to MARK
and holds the UI there, so the kill lands in that window every time. MODE "call" holds
inside the approved call instead (the MCP call not yet sent), "save" inside the tool
result's save (its temp file written, not yet renamed: `atomic._pause_point`).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HOLD_S = 300.0  # the caller kills it long before; bounded all the same


async def main(model: str, mark: Path, mode: str = "shown") -> int:
    from ssdmoe_tui import atomic
    from ssdmoe_tui.ui.widgets.tool_blocks import ToolResultBlock
    from tests.helpers.pilot import SIZE, loaded
    from tests.helpers.tool_chat import ask_and_answer, make_app

    app = make_app(model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)

        def hold(*_: object) -> None:
            # whole or not at all: the caller kills as soon as MARK exists, and a plain
            # write_text once let it read '' (created, not yet written; 2026-12-06, one
            # full run of four). Not atomic.py's writer: this is its pause point in "save".
            part = mark.with_name(mark.name + ".part")
            part.write_text(str(app.chat.session_id))
            os.replace(part, mark)
            time.sleep(HOLD_S)  # nothing goes on here until the kill

        if mode == "call":
            app.chat.tools.servers.call = hold  # type: ignore[method-assign]
        elif mode == "save":
            keep = app.chat.sessions.keep_tool_results

            def keep_and_hold(*args: object) -> None:
                # the result's write stops before its rename; a write beside it (the
                # reply's experts.json, on another thread) goes on
                atomic._pause_point = lambda tmp: (
                    hold() if tmp.name.startswith(".conversation.json.") else None
                )
                keep(*args)

            app.chat.sessions.keep_tool_results = keep_and_hold  # type: ignore[method-assign]
        else:
            transcript = app.chat_pane.transcript
            mount = transcript.mount

            async def mount_then_hold(*widgets, **kw):  # noqa: ANN002, ANN003, ANN202
                await mount(*widgets, **kw)
                if any(isinstance(w, ToolResultBlock) for w in widgets):
                    hold()  # blocks the UI loop

            transcript.mount = mount_then_hold  # type: ignore[method-assign]
        await ask_and_answer(pilot, app, "y")
        await asyncio.sleep(HOLD_S)
    return 1  # not reached: killed


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:4])))
