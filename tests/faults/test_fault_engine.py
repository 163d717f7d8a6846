"""The engine under faults: a prompt longer than the context is refused with the numbers
before any prefill (engine and app, one line), and a shard truncated while decoding
stops the reply with one line; the engine and the app stay usable (issue 11, item 6
and the fault checks)."""

from __future__ import annotations

import os
import shutil

from ssdmoe_tui.engine.experts.index import build_index
from ssdmoe_tui.engine.model.context import ContextTooLong, check_context, max_context
from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.options import SamplingOptions
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from tests.helpers.engine_events import start
from tests.helpers.pilot import SIZE, errors, loaded, send, type_and_send, wait_until


def test_context_rules():
    assert max_context({"max_position_embeddings": 4096}) == 4096
    assert max_context({"text_config": {"max_position_embeddings": 262144}}) == 262144
    assert max_context({"max_position_embeddings": "x"}) == 0
    check_context(4095, 4096)
    check_context(10**6, 0)  # unknown context: accepted
    try:
        check_context(80_010, 4096)
    except ContextTooLong as e:
        assert "80,010" in str(e) and "4,096" in str(e)
    else:
        raise AssertionError("not refused")


def test_too_long_prompt_is_refused_before_prefill_and_truncated_shard_stops_decode(
    checkpoints, tmp_path
):
    model = tmp_path / "model"
    shutil.copytree(checkpoints("qwen3_moe"), model)  # max_position_embeddings 2048
    svc, ev = start(model)
    try:
        svc.submit(
            P.Generate(
                "long", prompt_tokens=tuple([5] * 3000), sampling=SamplingOptions(max_tokens=5)
            )
        )
        done, seen = ev.until(P.GenerationDone)
        assert done.finish_reason == "error"
        msg = next(e.message for e in seen if isinstance(e, P.EngineError))
        assert "3,000 tokens" in msg and "2,048" in msg and "\n" not in msg
        assert not any(isinstance(e, P.PhaseChanged) and e.phase == "prefill" for e in seen)

        # A shard truncated while decoding: the reply stops with one line naming it.
        shard = model / build_index(model).layers[0].components[0].shard
        saved = shard.read_bytes()
        svc.submit(
            P.Generate(
                "cut", prompt_tokens=tuple(range(3, 12)), sampling=SamplingOptions(max_tokens=2000)
            )
        )
        ev.until(P.Tokens)
        os.truncate(shard, 4096)
        done, seen = ev.until(P.GenerationDone, timeout=120)
        assert done.finish_reason == "error", done.finish_reason
        msg = next(e.message for e in seen if isinstance(e, P.EngineError))
        assert "\n" not in msg and shard.name in msg, msg
        # Repaired: the same engine answers again.
        shard.write_bytes(saved)
        svc.submit(
            P.Generate(
                "again", prompt_tokens=tuple(range(3, 12)), sampling=SamplingOptions(max_tokens=5)
            )
        )
        done, _ = ev.until(P.GenerationDone)
        assert done.finish_reason in ("stop", "length") and done.token_ids
    finally:
        svc.shutdown()


async def test_too_long_prompt_in_the_app_is_one_line(demo_model):
    app = SsdmoeApp(ChatSettings(model=str(demo_model), max_tokens=5))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat_pane.prompt.text = "lorem ipsum dolor " * 3000  # far over the demo's 4,096 tokens
        await type_and_send(pilot, "")
        await wait_until(pilot, lambda: errors(app), 60, "the refusal")
        (message,) = errors(app)
        assert "context is 4,096 tokens" in message and "\n" not in message
        assert app.inflight is None
        await send(pilot, "hi")  # still usable
        assert app.chat.last_done.finish_reason in ("stop", "length")


def test_too_long_prompt_from_the_shell_is_exactly_one_line(checkpoints):
    """As a user runs it: nothing else (no tokenizer warning) on stderr before the refusal."""
    import subprocess
    import sys
    from pathlib import Path

    argv = ["generate", "--model", str(checkpoints("qwen3_moe")), "--raw"]
    r = subprocess.run(
        [sys.executable, "-m", "ssdmoe_tui.cli", *argv, "--prompt", "lorem ipsum " * 2500],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1, r.stderr
    assert "17,501 tokens" in r.stderr and "context is 2,048" in r.stderr
