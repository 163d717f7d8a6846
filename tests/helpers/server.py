"""A real server for the server tests: `Server` on its own event-loop thread on a random
loopback port, driven by the official clients; and the helpers that drive it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from ssdmoe_tui import cli
from ssdmoe_tui.options import EngineOptions
from ssdmoe_tui.server.main import ServeOptions, Server, bind, url_of
from tests.helpers.texts import SYSTEM

TIMEOUT = 60


class Running:
    """A Server on its own event loop thread, bound to a random loopback port."""

    def __init__(self, options: ServeOptions) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.url = url_of(self.sock)
        self.server = Server(options)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.run(self.sock)), daemon=True
        )
        self.thread.start()
        assert self.server.ready.wait(TIMEOUT), "server did not start"
        assert self.server.state is not None, "the engine did not load"
        self.model = self.server.model_id

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, **kw)

    def stop(self) -> None:
        self.server.stop()
        self.thread.join(TIMEOUT)
        self.sock.close()
        assert not self.thread.is_alive()


@contextlib.contextmanager
def serving(model: Path, root: Path, **engine) -> Iterator[Running]:
    """A server on `model` whose prompt cache and model lock live under `root` (its own
    lock folder, so a module's server never meets another test's claim)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SSDMOE_LOCK_DIR", str(root / "locks"))
        running = Running(ServeOptions(EngineOptions(model=str(model), **engine), cache_root=root))
        try:
            yield running
        finally:
            running.stop()


def options(model, home) -> ServeOptions:
    # prefill in chunks of 256 tokens, so a cancel during a long prefill lands quickly
    return ServeOptions(EngineOptions(model=str(model), prefill_step=256), cache_root=home / "sc")


def generate_json(model, prompt: str, system: str | None = None, max_tokens: int = 16) -> dict:
    """`ssdmoe generate --json` in this process (the server is not running then)."""
    argv = ["generate", "--model", str(model), "--prompt", prompt, "--json",
            "--max-tokens", str(max_tokens)]  # fmt: skip
    if system:
        argv += ["--system", system]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    return json.loads(out.getvalue())


def conversation_turns(c, model, n: int, start: list | None = None) -> tuple[list, list]:
    messages = start or [{"role": "system", "content": SYSTEM}]
    usages = []
    for i in range(n):
        messages.append({"role": "user", "content": ["Go on.", "Why?", "Thanks, more."][i % 3]})
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=8)
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
        usages.append(r.usage)
    return messages, usages


def assert_new_chat_reuses_system_prompt(running: Running) -> int:
    """A new chat with a known system prompt: served >= 95 % from a cache. Returns the
    cached tokens (attention-only models may get them from memory, a trimmed copy of
    the longer conversation's cache; hybrid ones only from the system part's checkpoint)."""
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Other topic?"}]
    r = running.client().chat.completions.create(model=running.model, messages=chat, max_tokens=2)
    u = r.usage
    assert u.prompt_tokens_details.cached_tokens >= 0.95 * u.prompt_tokens, u
    return u.prompt_tokens_details.cached_tokens
