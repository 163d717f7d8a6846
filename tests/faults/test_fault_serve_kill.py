"""Issue 45 item 5: kill -9 of `ssdmoe serve --max-batch 4 --speculate ngram` during four
streams, then a restart, three times: the checkpoints written before each kill are reused.

Four conversations each get a first reply (its KV checkpoint is saved when the reply
ends); then their second turns stream at once and the server is SIGKILLed a few chunks
into them (whatever it was writing then is cut). A new `ssdmoe serve` on the same data
folder sweeps the temp files the kill left, says nothing is wrong with its prompt
history, and serves each second turn from that conversation's checkpoint: at least its
whole first prompt comes from the disk (memory is empty after a restart)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.serve_process import start_server, stop
from tests.helpers.texts import SYSTEM

TIMEOUT = 60
ARGS = ("--max-batch", "4", "--speculate", "ngram")
TOPICS = ["the tides of the North Sea", "baking sourdough bread at home",
          "the history of the printing press", "how bees choose a new nest"]  # fmt: skip


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=TIMEOUT)


def _temps(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".tmp" in p.name]


def _kill_during_streams(served, name: str, chats: list[list[dict]], delay: float) -> list[str]:
    """Stream every chat's next turn at once and SIGKILL the server `delay` s after each
    has its first line (one decoding, the rest queued: ngram drafts run one at a time).
    Returns how each stream ended."""
    started = threading.Barrier(len(chats) + 1, timeout=TIMEOUT)
    outcome: list[str] = []

    def stream(messages: list[dict]) -> None:
        body = {"model": name, "messages": messages, "max_tokens": 400, "stream": True}
        try:
            with httpx.stream("POST", served.url + "/v1/chat/completions", json=body,
                              timeout=TIMEOUT) as r:  # fmt: skip
                lines = r.iter_lines()
                next(lines)  # its first line: the request is in (decoding or queued)
                started.wait()
                for _ in lines:
                    pass
            outcome.append("ended")
        except (httpx.HTTPError, threading.BrokenBarrierError) as e:
            outcome.append(type(e).__name__)  # the connection dies with the server

    threads = [threading.Thread(target=stream, args=(m,)) for m in chats]
    for t in threads:
        t.start()
    started.wait()
    time.sleep(delay)  # a different moment each round: in a decode, a save, a queue
    os.kill(served.proc.pid, signal.SIGKILL)
    served.proc.wait(TIMEOUT)
    for t in threads:
        t.join(TIMEOUT)
    assert not any(t.is_alive() for t in threads)
    return outcome


def test_kill_9_during_four_streams_then_a_restart_reuses_the_checkpoints(checkpoints, tmp_path):
    _kill_loop(checkpoints("qwen3_moe"), tmp_path, (0.0, 0.3, 1.0))


@pytest.mark.slow
def test_twenty_kills_lose_nothing(checkpoints, tmp_path):
    """Issue 45's done-when: twenty kill -9 runs over the batched server, at moments
    spread over a second and a half of four streams."""
    _kill_loop(checkpoints("qwen3_moe"), tmp_path, tuple(i * 0.075 for i in range(20)))


def _kill_loop(model: Path, tmp_path: Path, delays: tuple[float, ...]) -> None:
    log = tmp_path / "serve.log"
    served = start_server(model, tmp_path, args=ARGS, stderr=log)
    chats, first, outcomes = [], [], []
    try:
        c = _client(served.url)
        name = c.models.list().data[0].id
        for topic in TOPICS:
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": f"Tell me a long story about {topic}."}]  # fmt: skip
            r = c.chat.completions.create(model=name, messages=messages, max_tokens=8)
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "Go on."}]  # fmt: skip
            chats.append(messages)
            first.append(r.usage)
        for delay in delays:
            outcomes.append(_kill_during_streams(served, name, chats, delay))
            assert len(outcomes[-1]) == 4, outcomes
            served = start_server(model, tmp_path, args=ARGS, stderr=log)
            assert _temps(tmp_path / "home") == []  # what the kill cut is swept at the start
            c = _client(served.url)
            for messages, u1 in zip(chats, first, strict=True):
                r = c.chat.completions.create(model=name, messages=messages, max_tokens=4)
                cached = r.usage.prompt_tokens_details.cached_tokens
                assert cached >= u1.prompt_tokens, (delay, cached, u1.prompt_tokens, r.usage)
                assert r.usage.completion_tokens == 4
    finally:
        stop(served.proc)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert "ignored" not in text, [ln for ln in text.splitlines() if "ignored" in ln]
    ended = sum(o.count("ended") for o in outcomes)
    print(f"{len(delays)} kills -9 during 4 streams ({ended} of {4 * len(delays)} streams ended "
          f"before the kill); after each restart every second turn reused >= its first prompt "
          f"({[u.prompt_tokens for u in first]} tokens) from disk")  # fmt: skip
