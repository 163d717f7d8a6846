"""Issue 22 item 8: the app attaches to a running `ssdmoe serve` on this machine.

A real `ssdmoe serve` subprocess on a loopback port (port 0) on the random demo model,
with its own SSDMOE_LOCK_DIR; the app, started with that lock dir and no engine of its
own, lists the server in F4 (from the server's lock claim), attaches, streams a reply
through the server's API (equal to the official `openai` client's greedy reply), and
shows the server's `/v1/stats` in its engine panel; K travels with each request; a
refused request shows the server's message; a key-protected server asks for its key
(never written to disk); a server killed mid-reply leaves one line and the partial reply.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ssdmoe_tui.chat.wire import stats_sample
from ssdmoe_tui.models.lock import served_models
from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from ssdmoe_tui.ui.fmt import fmt_rate
from ssdmoe_tui.ui.screens.dialogs import AskScreen
from ssdmoe_tui.ui.screens.models import SERVER, SERVER_WITH_KEY
from ssdmoe_tui.ui.widgets.transcript import AssistantMessage, Notice
from tests.helpers.pilot import (
    SIZE,
    errors,
    open_picker,
    option_text,
    send,
    tap,
    type_and_send,
    wait_until,
)
from tests.helpers.serve_process import Served, start_server, stop

KEY = "attach-test-key-3f9a"


@pytest.fixture(scope="module")
def server(demo_model, tmp_path_factory) -> Iterator[Served]:
    served = start_server(demo_model, tmp_path_factory.mktemp("serve"))
    yield served
    stop(served.proc)


def replies(app: SsdmoeApp) -> list[AssistantMessage]:
    return [m for m in app.chat_pane.transcript.messages() if isinstance(m, AssistantMessage)]


async def attach_from_f4(pilot, app: SsdmoeApp, option_id: str) -> None:
    screen = await open_picker(pilot, app)
    screen.option_list.highlighted = screen.option_list.get_option_index(option_id)
    await pilot.press("enter")


async def test_the_app_attaches_from_f4_and_chats_through_the_server(server, monkeypatch):
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(server.lock_dir))
    monkeypatch.delenv("SSDMOE_API_KEY", raising=False)
    (holder,) = served_models(server.lock_dir)  # the server's claim carries its URL
    assert holder.url == server.url and holder.pid == server.proc.pid
    assert not holder.key_required

    app = SsdmoeApp(ChatSettings(max_tokens=24, temperature=0.0), engine_factory=None)
    async with app.run_test(size=SIZE) as pilot:
        screen = await open_picker(pilot, app)
        title = option_text(screen, SERVER + server.url)
        assert f"server on 127.0.0.1:{server.port} (demo-model)" in title, title
        await pilot.press("escape")
        await attach_from_f4(pilot, app, SERVER + server.url)
        await wait_until(pilot, lambda: app.chat.model is not None, what="the attach")
        info = app.chat.model
        assert info.server == server.url and info.name == "demo-model"
        assert info.num_experts == 32 and info.trained_k == 4 and app.chat.remote
        notices = " ".join(str(n.render()) for n in app.chat_pane.transcript.query(Notice))
        assert f"Attached to the server at 127.0.0.1:{server.port}" in notices

        # A streamed reply, equal to the official client's greedy reply to the same chat.
        await send(pilot, "hello there", what="the reply")
        done = app.chat.last_done
        assert done.finish_reason == "length" and done.text
        assert app.events_seen.get("Tokens", 0) >= 2  # streamed in pieces

        # The panel shows the server's own figures (its /v1/stats), not this process's
        # (before the direct request below changes them).
        def server_sample():
            return stats_sample(httpx.get(server.url + "/v1/stats", timeout=5).json())

        await wait_until(
            pilot, lambda: app.panel.last_sample == server_sample(), what="the server's stats"
        )
        assert app.events_seen.get("StatsSample", 0) >= 1
        assert app.panel.shown["decode"] == fmt_rate(app.panel.last_sample.decode_tok_s)
        assert app.panel.shown["decode"] != "—"

        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=60)
        direct = client.chat.completions.create(
            model="demo-model",
            messages=[{"role": "user", "content": "hello there"}],
            max_tokens=24,
            temperature=0,
            extra_body={"chat_template_kwargs": {"enable_thinking": True}},
        )
        assert done.text == direct.choices[0].message.content
        header = str(replies(app)[-1].header_text())
        assert "24 tokens" in header and "K 4" in header, header

        # K travels with the request (the server takes K per request).
        app.panel.k_control.set_k(2)
        await pilot.pause(0.05)
        await type_and_send(pilot, "and again")
        await wait_until(
            pilot, lambda: app.chat.last_done is not done and app.inflight is None, 60, "reply 2"
        )
        assert set(app.chat.last_done.k_per_token) == {2}
        assert "K 2" in str(replies(app)[-1].header_text())

        # Regenerate is a new request on the same chat.
        before = app.chat.last_done
        await tap(pilot, "ctrl+g")
        await wait_until(
            pilot, lambda: app.chat.last_done is not before and app.inflight is None, 60, "redo"
        )
        assert app.chat.last_done.finish_reason == "length"
        assert [m.role for m in app.chat.history] == ["user", "assistant"] * 2

        # The server refuses (a prompt longer than its context): its message, one line,
        # and the turn is given back.
        history = list(app.chat.history)
        app.chat_pane.prompt.load_text("word " * 5000)
        await tap(pilot, "enter")
        await wait_until(pilot, lambda: errors(app), 30, "the refusal")
        (message,) = errors(app)
        assert message.startswith(f"the server at 127.0.0.1:{server.port} refused (400): ")
        assert "context" in message and "\n" not in message
        await wait_until(pilot, lambda: app.inflight is None, what="the turn given back")
        assert app.chat.history == history and app.chat.model is not None
        # The expert cache is the server's.
        assert "served by" in _refusal(app, lambda: app.chat.set_expert_cache("1G"))


def _refusal(app: SsdmoeApp, call) -> str:
    from ssdmoe_tui.chat.controller import Refused

    try:
        call()
    except Refused as e:
        return str(e)
    raise AssertionError("not refused")


async def test_a_server_with_a_key_and_killed_mid_reply(demo_model, tmp_path, monkeypatch):
    # Each token at least 0.05 s after the last: its 64-token replies last >= 3.2 s, so
    # Esc and the kill land mid-reply however fast the machine.
    served = start_server(demo_model, tmp_path / "serve", api_key=KEY, per_token_s=0.05)
    try:
        monkeypatch.setenv("SSDMOE_LOCK_DIR", str(served.lock_dir))
        monkeypatch.delenv("SSDMOE_API_KEY", raising=False)
        app = SsdmoeApp(ChatSettings(max_tokens=2000, temperature=0.0), engine_factory=None)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_picker(pilot, app)
            assert "API key" in option_text(screen, SERVER_WITH_KEY + served.url)
            await pilot.press("escape")
            await attach_from_f4(pilot, app, SERVER_WITH_KEY + served.url)
            await wait_until(pilot, lambda: isinstance(app.screen, AskScreen), what="the key")
            assert app.screen.password
            await pilot.press(*KEY, "enter")
            await wait_until(pilot, lambda: app.chat.model is not None, what="the attach")

            # The key is never written: not in the lock claim, not under the app's data.
            home = Path(os.environ["SSDMOE_HOME"])
            for folder in (served.lock_dir, home):
                for path in folder.rglob("*"):
                    if path.is_file():
                        assert KEY.encode() not in path.read_bytes(), path

            # Esc stops a reply (the connection is closed; the server stops it too).
            await type_and_send(pilot, "go on")
            await wait_until(pilot, lambda: app.events_seen.get("Tokens", 0) >= 2, 60, "tokens")
            await tap(pilot, "escape")
            await wait_until(pilot, lambda: app.inflight is None, what="the stop")
            assert app.chat.last_done.finish_reason == "cancelled" and app.chat.last_done.text
            assert replies(app)[-1].has_class("stopped")

            # The random demo never stops by itself: kill the server mid-reply.
            seen = app.events_seen.get("Tokens", 0)
            await type_and_send(pilot, "tell me more")
            await wait_until(
                pilot, lambda: app.events_seen.get("Tokens", 0) >= seen + 3, 60, "tokens"
            )
            served.proc.kill()
            await wait_until(pilot, lambda: errors(app), 40, "the error line")
            (message,) = errors(app)
            assert message.startswith(
                f"the server at 127.0.0.1:{served.port} stopped answering mid-reply ("
            ), message
            assert message.endswith("); what arrived is kept") and "\n" not in message
            await wait_until(pilot, lambda: app.inflight is None, what="the reply settled")
            reply = replies(app)[-1]
            assert reply.text and reply.finish_reason == "cancelled"
            assert app.chat.history[-1].role == "assistant"
            assert app.chat.history[-1].content == reply.text
            assert app.chat.model is None  # what the app says: F4 picks another
    finally:
        stop(served.proc)


async def test_attach_from_the_command_line(server, monkeypatch, capsys):
    """`ssdmoe --attach URL`: the app starts on the server's model, none of its own; a
    URL that is not one is one line at the command line."""
    from ssdmoe_tui import cli
    from ssdmoe_tui.commands.chat import build_settings, session_store

    parser = cli.build_parser()
    args = parser.parse_args(["--attach", f"127.0.0.1:{server.port}/v1"])
    settings = build_settings(args)
    assert settings.attach == server.url
    for bad in ("banana", "https://127.0.0.1:1", "http://127.0.0.1"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--attach", bad])
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "is not a server URL (http://HOST:PORT)" in err, err
    monkeypatch.delenv("SSDMOE_API_KEY", raising=False)
    settings.max_tokens = 8
    store = session_store(settings)

    def no_engine(post):  # attached from the start, the app builds no engine of its own
        raise AssertionError("the app built its own engine")

    app = SsdmoeApp(settings, engine_factory=no_engine, session_store=store)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.chat.model is not None, what="the attach")
        assert app.chat.model.server == server.url
        assert app.chat_pane.welcome is None  # no demo-model card: no demo is loading
        await send(pilot, "hi", what="the reply")
        text = app.chat.last_done.text
        assert text
        # The conversation is saved here as text (the server keeps its own prompt cache).
        conv = store.store.get(app.chat.session_id)
        assert [(t.role, t.text) for t in conv.turns] == [("user", "hi"), ("assistant", text)]
        assert conv.turns[1].finish == "length" and conv.turns[1].k == 4


async def test_attach_frees_the_apps_own_model_and_f4_brings_it_back(
    server, demo_model, monkeypatch
):
    """The app ran its own demo beside the server; attaching shuts its engine down (its
    claim goes: only the server's is left), and F4 → the demo builds it again."""
    monkeypatch.setenv("SSDMOE_LOCK_DIR", str(server.lock_dir))
    monkeypatch.setenv("SSDMOE_TEST_AVAILABLE_MEMORY", str(64 << 30))  # both fit
    monkeypatch.setenv("SSDMOE_MODEL_DIRS", str(demo_model))  # F4 lists it while attached
    monkeypatch.delenv("SSDMOE_API_KEY", raising=False)

    def claims() -> list[Path]:
        return sorted(server.lock_dir.glob("model-*.lock"))

    app = SsdmoeApp(ChatSettings(model=str(demo_model), max_tokens=8, temperature=0.0))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.chat.model is not None, 120, "the local load")
        assert not app.chat.model.server and len(claims()) == 2
        await attach_from_f4(pilot, app, SERVER + server.url)
        await wait_until(
            pilot, lambda: app.chat.model is not None and app.chat.remote, 30, "the attach"
        )
        await wait_until(pilot, lambda: len(claims()) == 1, what="the app's claim released")
        assert [h.pid for h in served_models(server.lock_dir)] == [server.proc.pid]
        await send(pilot, "hi", what="the reply")

        screen = await open_picker(pilot, app)
        assert "(attached)" in option_text(screen, SERVER + server.url)
        screen.option_list.highlighted = screen.option_list.get_option_index(str(demo_model))
        await pilot.press("enter")
        await wait_until(
            pilot,
            lambda: app.chat.model is not None and not app.chat.remote,
            120,
            "the local model again",
        )
        assert app.chat.model.path == str(demo_model) and len(claims()) == 2
        before = app.chat.last_done
        await type_and_send(pilot, "hi again")
        await wait_until(
            pilot, lambda: app.chat.last_done is not before and app.inflight is None, 60, "reply"
        )
        assert app.chat.last_done.token_ids  # the app's own engine: ids again
