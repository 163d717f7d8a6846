"""The app in a process of its own, stopped with a tool's result on screen, for
tests/tools/test_tool_crash.py to SIGKILL there.

    python tests/helpers/tool_kill_worker.py MODEL MARK    (SSDMOE_HOME set by the caller)

It runs the real app (Textual's pilot, headless), the real engine on the scripted
checkpoint (tests/helpers/scripted_model.py) and the real MCP server over stdio: asks the
weather, approves the call, and once the result block is in the transcript (the call
answered, the model's next reply not asked for yet) writes the conversation id to MARK
and holds the UI there, so the kill lands in that window every time.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

HOLD_S = 300.0  # the caller kills it long before; bounded all the same


async def main(model: str, mark: Path) -> int:
    from ssdmoe_tui.ui.widgets.tool_blocks import ToolResultBlock
    from tests.helpers.pilot import SIZE, loaded
    from tests.helpers.tool_chat import ask_and_answer, make_app

    app = make_app(model)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        transcript = app.chat_pane.transcript
        mount = transcript.mount

        async def mount_then_hold(*widgets, **kw):  # noqa: ANN002, ANN003, ANN202
            await mount(*widgets, **kw)
            if any(isinstance(w, ToolResultBlock) for w in widgets):
                mark.write_text(str(app.chat.session_id))
                time.sleep(HOLD_S)  # blocks the UI loop: nothing goes on until the kill

        transcript.mount = mount_then_hold  # type: ignore[method-assign]
        await ask_and_answer(pilot, app, "y")
        await asyncio.sleep(HOLD_S)
    return 1  # not reached: killed


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], Path(sys.argv[2]))))
