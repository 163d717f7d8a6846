"""Concurrent requests decode together (engine/run/batch_loop.py): four chat requests from
the official `openai` client, answered in one batch, each reply identical to the same
request alone; per-request figures stay per request; /v1/stats has the batch's."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import openai
import pytest

from tests.helpers.server import TIMEOUT, Running, options

QUESTIONS = [
    "Hello there, how are you?",
    "Why stream experts from a disk?",
    "Name three colours.",
    "What is a mixture of experts, in one line?",
]


@pytest.fixture(scope="module")
def model(checkpoints, home):
    return checkpoints("qwen3_5_moe")  # hybrid: KV and recurrent state per row


@pytest.fixture(scope="module")
def srv(model, home):
    opts = dataclasses.replace(options(model, home), max_batch=4, persist_cache=False)
    running = Running(opts)
    yield running
    running.stop()


def ask(client: openai.OpenAI, model: str, question: str, max_tokens: int = 24):
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
    )


def async_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT
    )


def ask_async(aclient: openai.AsyncOpenAI, model: str, question: str, max_tokens: int, **kw):
    """The request's coroutine (greedy), as `ask` sends it; `stream=True` for a stream."""
    return aclient.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=max_tokens,
        temperature=0,
        **kw,
    )


def test_four_concurrent_requests_answered_together_equal_alone(srv):
    client = srv.client(timeout=TIMEOUT)
    alone = [ask(client, srv.model, q) for q in QUESTIONS]
    assert srv.server.engine.max_batch == 4

    async def together():
        aclient = async_client(srv.url)
        # Different seeds would be drawn per request; greedy here, so only the batch
        # could make them differ. The prompts differ: routing differs per row.
        return await asyncio.gather(*[ask_async(aclient, srv.model, q, 24) for q in QUESTIONS])

    before = httpx.get(srv.url + "/v1/stats", timeout=5).json()["batch"]
    got = asyncio.run(together())
    for a, b in zip(alone, got, strict=True):
        assert b.choices[0].message.content == a.choices[0].message.content
        assert b.usage.completion_tokens == a.usage.completion_tokens == 24
        assert b.usage.prompt_tokens == a.usage.prompt_tokens
        st = b.model_extra["ssdmoe"]["stats"]
        assert st["generated_tokens"] == 24 and st["decode_tok_s"] > 0  # its own figures
    stats = httpx.get(srv.url + "/v1/stats", timeout=5).json()
    batch = stats["batch"]
    assert batch["max_batch"] == 4
    assert batch["max_rows"] == 4, "the four requests decoded together"
    assert batch["steps"] > before["steps"]
    assert batch["mean_rows"] > 1
    assert batch["union_experts_per_layer"] is None or batch["union_experts_per_layer"] >= 4
    assert "requested_mib_per_token_per_sequence" in batch and "max_join_stall_s" in batch
    assert batch["join_pauses"] >= 0


def test_a_cancelled_request_leaves_the_others_running(srv):
    """One stream is dropped mid-reply: its row is freed; the other replies are whole
    and equal to alone."""
    client = srv.client(timeout=TIMEOUT)
    alone = [ask(client, srv.model, q, max_tokens=40) for q in QUESTIONS[:2]]

    async def run():
        aclient = async_client(srv.url)

        async def dropped():
            stream = await ask_async(aclient, srv.model, QUESTIONS[3], 400, stream=True)
            n = 0
            async for _ in stream:
                n += 1
                if n == 3:
                    break
            await stream.close()
            return n

        whole = [ask_async(aclient, srv.model, q, 40) for q in QUESTIONS[:2]]
        return await asyncio.gather(dropped(), *whole)

    n, a, b = asyncio.run(run())
    assert n == 3
    assert a.choices[0].message.content == alone[0].choices[0].message.content
    assert b.choices[0].message.content == alone[1].choices[0].message.content
    deadline = TIMEOUT
    while deadline > 0 and srv.server.engine.busy:  # the dropped row frees its slot
        asyncio.run(asyncio.sleep(0.05))
        deadline -= 0.05
    assert not srv.server.engine.busy


def test_a_stream_beside_a_joining_prompt_gets_its_tokens_from_inside_its_chunks(
    model, home, monkeypatch
):
    """The server's loop hands on the tokens of a step the rows ran inside a joining
    prompt's chunk (BatchRunner.emit -> BatchLoop._dispatch, its turn ending there too):
    with a join budget every MoE layer exceeds (pausing at each), a streamed reply that
    decodes while a long prompt joins arrives whole and in order, equal to it alone, as
    does the long prompt's reply, and /v1/stats counts the pauses."""
    from ssdmoe_tui.engine.run import batch as batch_module

    class EveryLayer(batch_module.BatchRunner):  # the real class, its budget made tiny
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **{**kwargs, "join_budget_s": 1e-9})

    monkeypatch.setattr(batch_module, "BatchRunner", EveryLayer)
    opts = dataclasses.replace(options(model, home), max_batch=2, persist_cache=False)
    running = Running(opts)
    try:
        client = running.client(timeout=TIMEOUT)
        long_question = " ".join(QUESTIONS * 6)
        alone = [
            ask(client, running.model, QUESTIONS[1], max_tokens=48).choices[0].message.content,
            ask(client, running.model, long_question, max_tokens=6).choices[0].message.content,
        ]

        async def beside() -> tuple[str, str]:
            aclient = async_client(running.url)
            stream = await ask_async(aclient, running.model, QUESTIONS[1], 48, stream=True)
            parts: list[str] = []
            joining = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
                    if joining is None:  # decoding now: the long prompt joins it
                        joining = asyncio.ensure_future(
                            ask_async(aclient, running.model, long_question, 6)
                        )
            assert joining is not None
            joined = await asyncio.wait_for(joining, TIMEOUT)
            return "".join(parts), joined.choices[0].message.content

        streamed, joined = asyncio.run(beside())
        assert [streamed, joined] == alone
        batch = httpx.get(running.url + "/v1/stats", timeout=5).json()["batch"]
        # the stream decoded inside the long prompt's chunks (it may end before the long
        # prompt's first token, so the two need not have decoded as rows together)
        assert batch["join_pauses"] > 0
    finally:
        running.stop()
