"""The HTTP routes: OpenAI chat/completions JSON and SSE, models, health, stats.

Handlers parse the body once (`schema`), build the prompt off the event loop
(`prompts`), wait for the engine (`engine_client`, 429 when the queue is full) and turn
the engine's events into OpenAI responses. A client that goes away (while queued, in
prefill or mid-stream) cancels its generation; the engine stops before its next token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.server.engine_client import EngineClient, Job, new_request_id
from ssdmoe_tui.server.errors import ApiError, bad_request
from ssdmoe_tui.server.output import Call, Content, OutputFilter, Piece, tool_format_for
from ssdmoe_tui.server.prompt_cache import SESSION_KEY, ServerKV
from ssdmoe_tui.server.prompts import Prompt, PromptBuilder
from ssdmoe_tui.server.schema import (
    ChatMessage,
    ChatRequest,
    CompletionRequest,
    Sampling,
    check_unicode,
    parse_chat,
    parse_completion,
    split_model,
)

STATS_HEADER = "x-ssdmoe-stats"
K_HEADER = "x-ssdmoe-k"


@dataclass(frozen=True)
class ApiSettings:
    model_id: str
    api_key: str | None = None
    max_body_bytes: int = 32 << 20
    max_tokens: int = 4096  # default when a request gives none (and the context allows)
    temperature: float = 0.0  # default when a request gives none
    system_checkpoints: bool = True  # see Api._prefix_step


class _Disconnected(Exception):
    pass


class _SSEResponse(StreamingResponse):
    """A streaming response that always watches for the client going away (also while
    nothing is sent, e.g. during a long prefill), cancelling the body iterator then."""

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        import anyio

        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


async def _until_disconnect(request: Request, work: Awaitable[Any]) -> Any:
    """Run `work`; if the client disconnects first, cancel it and raise _Disconnected."""
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001
        pass
    raise _Disconnected()


class Api:
    def __init__(
        self,
        engine: EngineClient,
        builder: PromptBuilder,
        settings: ApiSettings,
        kv: ServerKV | None = None,
    ) -> None:
        self.engine = engine
        self.builder = builder
        self.settings = settings
        self.kv = kv
        self.tool_format = tool_format_for(engine.tokenizer)
        self.created = int(time.time())
        self.last_response_stats: dict | None = None
        self.log: Callable[[str], None] = lambda line: print(
            f"ssdmoe serve: {line}", file=sys.stderr, flush=True
        )

    # ------------------------------------------------------------------ plumbing
    def app(self) -> Starlette:
        def route(path: str, fn: Callable, methods: list[str], auth: bool = True) -> Route:
            async def endpoint(request: Request) -> Response:
                try:
                    if auth:
                        self._check_key(request)
                    return await fn(request)
                except ApiError as e:
                    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
                except _Disconnected:
                    return Response(status_code=499)
                except Exception as e:  # noqa: BLE001 - a bug: logged, answered in the envelope
                    self.log(f"internal error on {request.method} {request.url.path}:\n"
                             + traceback.format_exc().rstrip())  # fmt: skip
                    err = ApiError(500, f"internal error: {type(e).__name__}: {e}",
                                   code="internal_error")  # fmt: skip
                    return JSONResponse(err.body(), status_code=500)

            return Route(path, endpoint, methods=methods)

        routes = [
            route("/health", self.health, ["GET"], auth=False),
            route("/v1/models", self.models, ["GET"]),
            route("/models", self.models, ["GET"]),
            route("/v1/models/{model_id:path}", self.model, ["GET"]),
            route("/v1/stats", self.stats, ["GET"]),
            route("/v1/chat/completions", self.chat, ["POST"]),
            route("/chat/completions", self.chat, ["POST"]),
            route("/v1/completions", self.completions, ["POST"]),
            route("/completions", self.completions, ["POST"]),
        ]
        app = Starlette(routes=routes)

        async def not_found(request: Request, exc: Exception) -> Response:
            status = getattr(exc, "status_code", 404)
            msg = "no such endpoint" if status == 404 else "method not allowed"
            return JSONResponse(
                ApiError(status, f"{msg}: {request.method} {request.url.path}").body(),
                status_code=status,
            )

        app.add_exception_handler(404, not_found)
        app.add_exception_handler(405, not_found)
        return app

    def _check_key(self, request: Request) -> None:
        key = self.settings.api_key
        if not key:
            return
        auth = request.headers.get("authorization", "")
        # constant-time: the time taken must not tell how much of a guess was right
        if not hmac.compare_digest(auth.encode(), f"Bearer {key}".encode()):
            raise ApiError(
                401,
                "missing or wrong API key (send 'Authorization: Bearer <key>')",
                code="invalid_api_key",
            )

    async def _json(self, request: Request) -> Any:
        cap = self.settings.max_body_bytes
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cap:
            raise ApiError(
                413, f"the request body is over the {cap}-byte limit", code="body_too_large"
            )
        chunks, size = [], 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise ApiError(
                        413, f"the request body is over the {cap}-byte limit", code="body_too_large"
                    )
                chunks.append(chunk)
        except ClientDisconnect:
            raise _Disconnected() from None
        try:
            body = json.loads(b"".join(chunks))
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested too deep
            raise bad_request(
                f"the request body is not valid JSON ({e})", code="invalid_json"
            ) from None
        check_unicode(body)
        return body

    # ------------------------------------------------------------------ simple endpoints
    async def health(self, request: Request) -> Response:
        e = self.engine
        return JSONResponse(
            {
                "status": "ok",
                "model": self.settings.model_id,
                "phase": e.phase.phase,
                "busy": e.busy,
                "queued": e.queued,
            }
        )

    def _model_card(self) -> dict:
        info = self.engine.info
        return {
            "id": self.settings.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "ssdmoe",
            "ssdmoe": {
                "model_type": info.model_type,
                "max_context": info.max_context,
                "trained_k": info.trained_k,
                "default_k": self.engine.default_k,
                "num_experts": info.num_experts,
            },
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        split_model(request.path_params["model_id"], self.settings.model_id)
        return JSONResponse(self._model_card())

    async def stats(self, request: Request) -> Response:
        e = self.engine
        info = e.info
        return JSONResponse(
            {
                "model": self.settings.model_id,
                "phase": asdict(e.phase),
                "busy": e.busy,
                "queued": e.queued,
                "generations": e.generations,
                "default_k": e.default_k,
                "live": asdict(e.last_sample) if e.last_sample else None,
                "last_response": self.last_response_stats,
                "engine": {
                    "device": info.device,
                    "dtype": info.dtype,
                    "reader": info.reader,
                    "expert_source": info.expert_source,
                    "expert_cache_budget_bytes": info.expert_cache_budget,
                    "resident_bytes": info.resident_bytes,
                },
                "notices": list(e.notices),
            }
        )

    # ------------------------------------------------------------------ generation
    def _k(self, k: int | None) -> int | None:
        info = self.engine.info
        if k is not None and not 1 <= k <= info.num_experts:
            raise bad_request(f"K={k} is outside 1..{info.num_experts}", "ssdmoe.k")
        return k

    def _max_tokens(self, prompt: Prompt, sampling: Sampling) -> int:
        ctx = self.engine.info.max_context
        n = len(prompt.tokens)
        if not n:
            raise bad_request("the prompt is empty", "messages")
        if ctx and n >= ctx:
            raise bad_request(
                f"the prompt is {n} tokens, the model's context is {ctx}",
                "messages",
                "context_length_exceeded",
            )
        room = ctx - n if ctx else None
        want = sampling.max_tokens
        if want is None:
            want = self.settings.max_tokens if room is None else min(self.settings.max_tokens, room)
        elif room is not None and want > room:
            raise bad_request(
                f"max_tokens {want} + prompt {n} tokens is over the model's context of {ctx}",
                "max_tokens",
                "context_length_exceeded",
            )
        return want

    async def _begin(
        self, request: Request, parse: Callable, build: Callable, kind: str
    ) -> tuple[Any, Prompt, int | None, Job]:
        """Body -> validated request -> prompt (off the loop) -> a job holding the engine."""
        req = parse(await self._json(request), self.settings.model_id)
        k = self._k(req.k)
        prompt = await asyncio.to_thread(build, req)
        job = await self._start(request, prompt, req.sampling, k, new_request_id(kind))
        return req, prompt, k, job

    async def _start(
        self, request: Request, prompt: Prompt, sampling: Sampling, k: int | None, rid: str
    ) -> Job:
        max_tokens = self._max_tokens(prompt, sampling)
        await _until_disconnect(request, self.engine.acquire())
        step = None
        try:
            if self._needs_prefix_checkpoint(prompt):
                step = self._prefix_step(prompt, k, rid)
                await _until_disconnect(request, step.done.wait())
            if self.kv is not None:
                self.kv.register(prompt.tokens, prompt.chain)
            temp = sampling.temperature
            cmd = P.Generate(
                request_id=rid,
                prompt_tokens=tuple(prompt.tokens),
                max_tokens=max_tokens,
                temp=self.settings.temperature if temp is None else temp,
                top_p=sampling.top_p if sampling.top_p is not None else 0.0,
                seed=sampling.seed,
                session_id=SESSION_KEY,
            )
            job = self.engine.submit(cmd, k)
            if step is not None and step.result is not None:
                job.cached_before = step.result.stats.get("reused_prompt_tokens", 0)
            return job
        except BaseException:
            if step is not None and not step.done.is_set():
                step.keep_slot = False  # the client left during the step: its end frees the engine
                step.cancel()
            else:
                self.engine.release_unused()
            raise

    def _needs_prefix_checkpoint(self, prompt: Prompt) -> bool:
        n = prompt.shared_prefix
        if not n or self.kv is None or not self.settings.system_checkpoints:
            return False
        return not self.kv.has_checkpoint(prompt.prefix_chain, n)

    def _prefix_step(self, prompt: Prompt, k: int | None, rid: str) -> Job:
        """Prefill the shared system part alone first, so it gets a KV checkpoint of its
        own: a new chat that starts the same way (an agent's next session, also after a
        restart) loads it instead of prefilling it; on hybrid models nothing else could
        serve it. Costs one extra step and a checkpoint save, once per system prompt."""
        prefix = prompt.tokens[: prompt.shared_prefix]
        self.kv.register(prefix, prompt.prefix_chain)
        cmd = P.Generate(
            request_id=rid + "-prefix",
            prompt_tokens=tuple(prefix),
            max_tokens=1,  # one sampled token, never fed: the cache covers exactly the prefix
            session_id=SESSION_KEY,
        )
        return self.engine.submit(cmd, k, keep_slot=True)

    async def _pieces(self, job: Job, filt: OutputFilter) -> AsyncIterator[list[Piece]]:
        """The job's output as filtered pieces; the last item follows GenerationDone."""
        while True:
            ev = await job.events.get()
            if isinstance(ev, P.Tokens):
                pieces = filt.feed(ev.text)
                if filt.stopped:
                    job.cancel()
                if pieces:
                    yield pieces
            elif isinstance(ev, P.GenerationDone):
                if ev.finish_reason == "error":
                    raise ApiError(
                        500, ev.stats.get("error", "generation failed"), code="engine_error"
                    )
                pieces = filt.finish()
                if pieces:
                    yield pieces
                return

    def _finish_reason(self, done: P.GenerationDone, filt: OutputFilter) -> str:
        if filt.calls:
            return "tool_calls"
        if done.finish_reason == "length" and not filt.stopped:
            return "length"
        return "stop"

    @staticmethod
    def _done(job: Job) -> P.GenerationDone:
        """The job's result as the client should see it: after a system-prompt step, the
        prompt tokens cached are those that were cached before the request, not the step's."""
        done = job.result
        if job.cached_before is None:
            return done
        stats = dict(done.stats)
        n = len(done.prompt_token_ids)
        stats["reused_prompt_tokens"] = job.cached_before
        stats["kv_hit_rate"] = round(job.cached_before / n, 4) if n else 0.0
        stats["system_prompt_checkpoint"] = True
        return replace(done, stats=stats)

    def _ext(self, done: P.GenerationDone) -> dict:
        """The `ssdmoe` extension field: which K ran and the engine's figures."""
        s = done.stats
        ks = Counter(done.k_per_token).most_common(1)
        ext = {
            "k": ks[0][0] if ks else s.get("k"),
            "stats": {
                "prompt_tokens": s.get("prompt_tokens", len(done.prompt_token_ids)),
                "kv_cached_tokens": s.get("reused_prompt_tokens", 0),
                "kv_hit_rate": s.get("kv_hit_rate", 0.0),
                "prefill_tok_s": s.get("prefill_tok_s", 0.0),
                "decode_tok_s": s.get("decode_tok_s", 0.0),
                "ssd_mib_per_token": s.get("ssd_mib_per_token", 0.0),
                "requested_mib_per_token": s.get("requested_mib_per_token", 0.0),
                "ssd_bytes_measured_from_device": s.get("ssd_bytes_measured_from_device", False),
                "expert_cache_hit_rate": s.get("expert_cache_hit_rate", 0.0),
                "generated_tokens": len(done.token_ids),
            },
        }
        if s.get("system_prompt_checkpoint"):
            ext["system_prompt_checkpoint"] = True  # this request wrote one for its system part
        if "distributed" in s:  # serve --distributed: per-rank bytes, hit rate, all_sum
            ext["distributed"] = s["distributed"]
        self.last_response_stats = ext
        st = ext["stats"]
        self.log(
            f"{done.request_id}: {st['prompt_tokens']} prompt tokens ({st['kv_cached_tokens']} "
            f"cached) -> {st['generated_tokens']} tokens ({done.finish_reason}), "
            f"{st['decode_tok_s']} tok/s, K={ext['k']}, {st['ssd_mib_per_token']} MiB/token from SSD"
        )
        return ext

    @staticmethod
    def _stats_header(ext: dict) -> str:
        s = ext["stats"]
        keys = ("decode_tok_s", "prefill_tok_s", "ssd_mib_per_token", "requested_mib_per_token",
                "expert_cache_hit_rate", "kv_cached_tokens")  # fmt: skip
        return "; ".join([f"k={ext['k']}"] + [f"{key}={s[key]}" for key in keys])

    @staticmethod
    def _usage(done: P.GenerationDone) -> dict:
        n_prompt = len(done.prompt_token_ids)
        n_out = len(done.token_ids)
        return {
            "prompt_tokens": n_prompt,
            "completion_tokens": n_out,
            "total_tokens": n_prompt + n_out,
            "prompt_tokens_details": {"cached_tokens": done.stats.get("reused_prompt_tokens", 0)},
        }

    @staticmethod
    def _call_json(call, index: int | None = None) -> dict:  # noqa: ANN001
        out = {"id": call.id, "type": "function",
               "function": {"name": call.name, "arguments": call.arguments}}  # fmt: skip
        if index is not None:
            out = {"index": index, **out}
        return out

    # ------------------------------------------------------------------ /v1/chat/completions
    async def chat(self, request: Request) -> Response:
        req, prompt, k, job = await self._begin(request, parse_chat, self.builder.chat, "chatcmpl")
        filt = OutputFilter(req.sampling.stop, self.tool_format, req.tools)

        def message() -> dict:
            content = "".join(filt.content)
            msg: dict[str, Any] = {
                "role": "assistant",
                "content": content if (content or not filt.calls) else None,
            }
            if filt.calls:
                msg["tool_calls"] = [self._call_json(c) for c in filt.calls]
            return {"message": msg}

        return await self._reply(
            request,
            job,
            filt,
            k,
            model=req.model,
            obj="chat.completion",
            stream=self._chat_stream(req, prompt, job, filt) if req.stream else None,
            body=message,
            on_done=lambda done: self._record(req, prompt, done, filt),
        )

    async def _reply(
        self,
        request: Request,
        job: Job,
        filt: OutputFilter,
        k: int | None,
        *,
        model: str,
        obj: str,
        stream: AsyncIterator[str] | None,
        body: Callable[[], dict],
        on_done: Callable[[P.GenerationDone], None] | None = None,
    ) -> Response:
        """The SSE response (`stream`), or wait for the whole reply and send it as JSON."""
        if stream is not None:
            return _SSEResponse(
                stream,
                media_type="text/event-stream",
                headers={"cache-control": "no-cache", K_HEADER: str(k or self.engine.default_k)},
            )
        try:
            await _until_disconnect(request, self._drain(job, filt))
        finally:
            job.cancel()
        done = self._done(job)
        if on_done is not None:
            on_done(done)
        ext = self._ext(done)
        choice = {"index": 0, **body(), "logprobs": None,
                  "finish_reason": self._finish_reason(done, filt)}  # fmt: skip
        payload = {"id": job.request_id, "object": obj, "created": int(time.time()),
                   "model": model, "choices": [choice], "usage": self._usage(done),
                   "ssdmoe": ext}  # fmt: skip
        return JSONResponse(payload, headers={STATS_HEADER: self._stats_header(ext)})

    async def _drain(self, job: Job, filt: OutputFilter) -> None:
        async for _ in self._pieces(job, filt):
            pass

    def _record(self, req: ChatRequest, prompt: Prompt, done: P.GenerationDone, filt) -> None:  # noqa: ANN001
        """Remember the exact tokens of a whole reply (not of one cut by a stop string or
        a disconnect: the client's copy of it would not match what the model saw)."""
        if filt.stopped or done.finish_reason not in ("stop", "length"):
            return
        reply = ChatMessage("assistant", "".join(filt.content), tuple(filt.calls))
        try:
            self.builder.record(req, prompt, done.token_ids, reply)
        except Exception as e:  # noqa: BLE001 - a lost record only costs cache hits
            self.engine.on_notice(f"prompt history not recorded: {type(e).__name__}: {e}")

    async def _stream(
        self,
        job: Job,
        filt: OutputFilter,
        *,
        model: str,
        obj: str,
        include_usage: bool,
        bodies: Callable[[list[Piece]], list[dict]],
        last: dict,
        first: dict | None = None,
        on_done: Callable[[P.GenerationDone], None] | None = None,
    ) -> AsyncIterator[str]:
        """SSE events: `first`, one chunk per body of each batch of pieces, the final
        chunk (`last`, finish_reason and the `ssdmoe` field), the usage chunk, [DONE]."""
        base = {"id": job.request_id, "object": obj, "created": int(time.time()), "model": model}

        def event(payload: dict) -> str:
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        def chunk(body: dict, finish: str | None = None, **extra: Any) -> str:
            choice = {"index": 0, **body, "logprobs": None, "finish_reason": finish}
            return event({**base, "choices": [choice], **extra})

        try:
            if first is not None:
                yield chunk(first)
            try:
                async for pieces in self._pieces(job, filt):
                    for body in bodies(pieces):
                        yield chunk(body)
            except ApiError as e:
                yield event(e.body())
                yield "data: [DONE]\n\n"
                return
            done = self._done(job)
            if on_done is not None:
                on_done(done)
            yield chunk(last, self._finish_reason(done, filt), ssdmoe=self._ext(done))
            if include_usage:
                yield event({**base, "choices": [], "usage": self._usage(done)})
            yield "data: [DONE]\n\n"
        finally:
            job.cancel()

    def _chat_stream(
        self, req: ChatRequest, prompt: Prompt, job: Job, filt: OutputFilter
    ) -> AsyncIterator[str]:
        n_calls = [0]

        def bodies(pieces: list[Piece]) -> list[dict]:
            out = []
            for p in pieces:
                if isinstance(p, Content):
                    out.append({"delta": {"content": p.text}})
                elif isinstance(p, Call):
                    out.append({"delta": {"tool_calls": [self._call_json(p.call, n_calls[0])]}})
                    n_calls[0] += 1
            return out

        return self._stream(
            job,
            filt,
            model=req.model,
            obj="chat.completion.chunk",
            include_usage=req.include_usage,
            bodies=bodies,
            first={"delta": {"role": "assistant", "content": ""}},
            last={"delta": {}},
            on_done=lambda done: self._record(req, prompt, done, filt),
        )

    # ------------------------------------------------------------------ /v1/completions
    async def completions(self, request: Request) -> Response:
        req, _, k, job = await self._begin(
            request, parse_completion, self.builder.completion, "cmpl"
        )
        filt = OutputFilter(req.sampling.stop)
        return await self._reply(
            request,
            job,
            filt,
            k,
            model=req.model,
            obj="text_completion",
            stream=self._completion_stream(req, job, filt) if req.stream else None,
            body=lambda: {"text": "".join(filt.content)},
        )

    def _completion_stream(
        self, req: CompletionRequest, job: Job, filt: OutputFilter
    ) -> AsyncIterator[str]:
        def bodies(pieces: list[Piece]) -> list[dict]:
            text = "".join(p.text for p in pieces if isinstance(p, Content))
            return [{"text": text}] if text else []

        return self._stream(
            job,
            filt,
            model=req.model,
            obj="text_completion",
            include_usage=req.include_usage,
            bodies=bodies,
            last={"text": ""},
        )
