"""What every generating endpoint shares (vLLM's `serving_engine`): the server's state,
a validated request turned into a job holding the engine (K and the sampling travel in
the `Generate` command), the engine's events as filtered pieces, and the engine's
figures as the `ssdmoe` field, usage and the stats header.

The API-specific modules (`serving_chat`, `serving_completion`, ...) shape requests and
responses; `routes` wires them to paths.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ssdmoe_tui.engine.run import protocol as P
from ssdmoe_tui.errors import BadValueError, SsdmoeError, user_message
from ssdmoe_tui.options import SamplingOptions, check_k
from ssdmoe_tui.prompting.output import OutputFilter, Piece, ThinkFormat, ToolFormat
from ssdmoe_tui.prompting.reply_format import ReplyFormat, reply_format_for
from ssdmoe_tui.server.engine_client import AsyncEngine, Job, Ticket, new_request_id
from ssdmoe_tui.server.errors import ApiError, bad_request
from ssdmoe_tui.server.hosts import HostPolicy
from ssdmoe_tui.server.http import read_json, sse, until_disconnect
from ssdmoe_tui.server.prompt_cache import SESSION_KEY, ServerKV
from ssdmoe_tui.server.prompts import Prompt, PromptBuilder
from ssdmoe_tui.server.schema import ChatRequest, Sampling, unknown_fields
from ssdmoe_tui.server.schema_messages import MessagesRequest
from ssdmoe_tui.terminal_text import visible

STATS_HEADER = "x-ssdmoe-stats"
K_HEADER = "x-ssdmoe-k"
# What a request asked that the server did not do as asked (a max_tokens past the
# context, tools or a thinking switch the model's template cannot use, hosted tools):
# said in this header ("; "-separated) and in the reply's `ssdmoe.warnings`, never
# silently dropped.
WARNING_HEADER = "x-ssdmoe-warning"


@dataclass(frozen=True)
class ApiSettings:
    model_id: str
    api_key: str | None = None
    max_body_bytes: int = 32 << 20
    max_tokens: int = 4096  # default when a request gives none (and the context allows)
    temperature: float = 0.0  # default when a request gives none
    system_checkpoints: bool = True  # see Serving._prefix_step
    hosts: HostPolicy = field(default_factory=HostPolicy)  # the Host check (hosts.py)
    keepalive_s: float = 1.0  # a streaming reply is never silent longer (SSE comments)
    allowed_origins: tuple[str, ...] = ()  # CORS (routes.middleware); none: no CORS headers


def _too_long(tokens: str, ctx: int) -> ApiError:
    return bad_request(
        f"the prompt is {tokens} tokens, the model's context is {ctx}",
        "messages",
        "context_length_exceeded",
    )


@functools.lru_cache(maxsize=8)
def mtp_refusal(model_path: str) -> str:
    """Why the model at `model_path` cannot draft with an MTP head (one line), or ""."""
    from ssdmoe_tui.engine.spec.mtp import check_mtp
    from ssdmoe_tui.user_files import MODEL_JSON_MAX, read_regular

    path = Path(model_path)
    try:
        config = json.loads(read_regular(path / "config.json", MODEL_JSON_MAX))
        check_mtp(config if isinstance(config, dict) else {}, path)
    except (SsdmoeError, OSError, ValueError) as e:
        return user_message(e).removeprefix("--speculate mtp: ")
    return ""


def warning_header(warnings: Any) -> dict[str, str]:
    """WARNING_HEADER for `warnings` (none: no header); printable ASCII, as a header line
    must be: a warning may quote the request (a template switch's key), and a line break
    or control character there made the HTTP layer drop the response."""
    if not warnings:
        return {}
    text = "; ".join(warnings)
    return {WARNING_HEADER: "".join(c if " " <= c <= "~" else "?" for c in text[:2000])}


def _log(line: str) -> None:
    """The server's one log writer: a line may quote what a client sent (a path, an
    error's words), shown with its control characters escaped, never raw."""
    print(f"ssdmoe serve: {visible(line)}", file=sys.stderr, flush=True)


@dataclass
class ServerState:
    """What the handlers share: one per server. `settings` may be swapped whole (tests)."""

    engine: AsyncEngine
    builder: PromptBuilder
    settings: ApiSettings
    kv: ServerKV | None = None
    # how the model's replies are laid out (prompting/reply_format.py decides, from the
    # tokenizer); tool_format and think_format are its parts (None for harmony)
    reply_format: ReplyFormat | None = None
    tool_format: ToolFormat | None = None
    think_format: ThinkFormat | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    last_response_stats: dict | None = None
    log: Callable[[str], None] = _log

    def __post_init__(self) -> None:
        if self.reply_format is None:
            self.reply_format = reply_format_for(self.engine.tokenizer)
        if self.tool_format is None:
            self.tool_format = self.reply_format.tool
        if self.think_format is None:
            self.think_format = self.reply_format.think


@dataclass
class Pending:
    """A validated request with its prompt and its place in the queue, not yet running."""

    req: Any
    prompt: Prompt
    k: int
    sampling: SamplingOptions  # built from the request once (`Sampling.options`)
    rid: str
    ticket: Ticket
    job: Job | None = None
    warnings: list[str] = field(default_factory=list)  # WARNING_HEADER's lines

    def close(self) -> None:
        """However a streaming reply ends: give back the place in the queue, or stop the
        generation (both harmless when already done)."""
        self.ticket.abandon()
        if self.job is not None:
            self.job.cancel()

    def progress(self, engine: AsyncEngine) -> str:
        """What a keepalive comment says: the place in the queue, or the engine's phase."""
        if not self.ticket.taken:
            return f"queued, {self.ticket.ahead} ahead"
        ph = engine.phase
        if ph.phase == "prefill" and ph.total:
            return f"prefill {ph.done}/{ph.total}"
        return ph.phase


class Serving:
    """The generation steps every API shares; subclasses shape one API's bodies."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    @property
    def engine(self) -> AsyncEngine:
        return self.state.engine

    @property
    def settings(self) -> ApiSettings:
        return self.state.settings

    # ------------------------------------------------------------------ request -> job
    async def body(self, request: Request) -> Any:
        return await read_json(request, self.settings.max_body_bytes)

    def check_k(self, k: int | None) -> int | None:
        try:
            check_k(k, self.engine.info.num_experts, "K")
        except BadValueError as e:
            raise bad_request(str(e), "ssdmoe.k") from None
        return k

    async def check_speculate(self, mode: str | None) -> None:
        """`ssdmoe.speculate: "mtp"` needs the model's MTP head: a 400 saying why not,
        before the request is queued (it was the engine's 500). The check reads the
        model's config and index once (off the loop)."""
        if mode != "mtp":
            return
        why = await asyncio.to_thread(mtp_refusal, self.engine.info.path)
        if why:
            raise bad_request(f"ssdmoe.speculate 'mtp': {why}", "ssdmoe.speculate")

    def check_size(self, req: Any) -> None:
        """Refuse a request far past the context from its size alone, before its template
        runs (`PromptBuilder.floor`); `max_tokens` checks the exact count after."""
        ctx = self.engine.info.max_context
        floor = self.state.builder.floor(req.chat if isinstance(req, MessagesRequest) else req)
        if ctx and floor >= ctx:
            raise _too_long(f"at least {floor}", ctx)

    def max_tokens(self, prompt: Prompt, sampling: Sampling) -> int:
        ctx = self.engine.info.max_context
        n = len(prompt.tokens)
        if not n:
            raise bad_request("the prompt is empty", "messages")
        if ctx and n >= ctx:
            raise _too_long(str(n), ctx)
        want = sampling.max_tokens
        if want is None:
            want = self.settings.max_tokens
        # Past the context: the room left, ending with `length` (llama.cpp's server does
        # the same). Agents ask for far more than they expect (opencode sends 32000 on
        # every request), and refusing would end their conversations once they grow.
        return min(want, ctx - n) if ctx else want

    async def prepare(
        self, request: Request, parse: Callable, build: Callable, kind: str, fields: frozenset
    ) -> Pending:
        """Body -> validated request -> prompt (off the loop) -> a place in the queue. Every
        refusal (4xx, a full queue's 429) happens here, while a status can still be sent.
        `fields`: the API's top-level fields; any other is named in a warning."""
        body = await self.body(request)
        req = parse(body, self.settings.model_id)
        k = self.check_k(req.k)
        chat = getattr(req, "chat", req)
        await self.check_speculate(getattr(chat, "speculate", None))
        self.check_size(req)
        prompt = await asyncio.to_thread(build, req)
        max_tokens = self.max_tokens(prompt, req.sampling)
        warnings = unknown_fields(body, fields)
        if isinstance(chat, ChatRequest):
            warnings += await asyncio.to_thread(self.state.builder.unused_options, chat)
        asked = req.sampling.max_tokens
        if asked is not None and asked > max_tokens:
            shown = f"{asked:,}" if asked < 10**15 else f"{asked:.3g}"
            warnings.append(
                f"max_tokens {shown} is past the model's context: the reply gets the "
                f"{max_tokens:,} tokens left"
            )
        ticket = self.engine.reserve()
        k = k if k is not None else self.engine.default_k
        sampling = req.sampling.options(max_tokens, self.settings.temperature)
        return Pending(req, prompt, k, sampling, new_request_id(kind), ticket, warnings=warnings)

    async def start(self, request: Request, p: Pending) -> Job:
        """Wait for the engine and start `p` (a JSON reply's path: a disconnect cancels)."""
        try:
            return await until_disconnect(request, self.run(p))
        finally:
            p.ticket.abandon()  # a no-op once the job holds the engine

    def sse(self, p: Pending, stream: AsyncIterator[str]) -> Response:
        """A streaming reply: SSE comments with progress while queued and in prefill."""
        return sse(
            stream,
            {K_HEADER: str(p.k), **warning_header(p.warnings)},
            progress=lambda: p.progress(self.engine),
            every=self.settings.keepalive_s,
            on_close=p.close,
        )

    async def run(self, p: Pending) -> Job:
        """Wait for the engine, run the system part's step if it needs one, submit."""
        await p.ticket.wait()
        prompt, k, rid = p.prompt, p.k, p.rid
        step = None
        kv = self.state.kv
        try:
            if self._needs_prefix_checkpoint(prompt):
                step = self._prefix_step(prompt, k, rid)
                await step.done.wait()
            if kv is not None:
                kv.register(prompt.tokens, prompt.chain)
            cmd = P.Generate(
                request_id=rid,
                prompt_tokens=tuple(prompt.tokens),
                sampling=p.sampling,
                session_id=SESSION_KEY,
                k=k,
                speculate=getattr(getattr(p.req, "chat", p.req), "speculate", None),
            )
            job = self.engine.submit(cmd)
            job.warnings = tuple(p.warnings)
            if step is not None and step.result is not None:
                job.cached_before = step.result.stats.get("reused_prompt_tokens", 0)
            p.job = job
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
        kv = self.state.kv
        if not n or kv is None or not self.settings.system_checkpoints:
            return False
        return not kv.has_checkpoint(prompt.prefix_chain, n)

    def _prefix_step(self, prompt: Prompt, k: int, rid: str) -> Job:
        """Prefill the shared system part alone first, so it gets a KV checkpoint of its
        own: a new chat that starts the same way (an agent's next session, also after a
        restart) loads it instead of prefilling it; on hybrid models nothing else could
        serve it. Costs one extra step and a checkpoint save, once per system prompt."""
        prefix = prompt.tokens[: prompt.shared_prefix]
        self.state.kv.register(prefix, prompt.prefix_chain)
        cmd = P.Generate(
            request_id=rid + "-prefix",
            prompt_tokens=tuple(prefix),
            # one sampled token, never fed: the cache covers exactly the prefix
            sampling=SamplingOptions(max_tokens=1),
            session_id=SESSION_KEY,
            k=k,
        )
        return self.engine.submit(cmd, keep_slot=True)

    # ------------------------------------------------------------------ job -> output
    def output_filter(self, prompt: Prompt, stops=(), tools=()) -> OutputFilter:  # noqa: ANN001
        """A chat reply's filter: stop strings, the reasoning apart, tool calls."""
        fmt = self.state.reply_format
        assert fmt is not None
        inside = fmt.starts_in_think(self.engine.tokenizer, prompt.tokens)
        return fmt.output_filter(stops, tools, inside)

    async def pieces(self, job: Job, filt: OutputFilter) -> AsyncIterator[list[Piece]]:
        """The job's output as filtered pieces; the last item follows GenerationDone."""
        while True:
            ev = await job.events.get()
            if isinstance(ev, P.Tokens):
                pieces = filt.feed(ev.text)
                if filt.stopped or filt.ended:
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

    async def drain(self, request: Request, job: Job, filt: OutputFilter) -> P.GenerationDone:
        """Wait for the whole reply (a disconnect cancels it); the result as `done`."""

        async def run() -> None:
            async for _ in self.pieces(job, filt):
                pass

        try:
            await until_disconnect(request, run())
        finally:
            job.cancel()
        return self.done(job)

    @staticmethod
    def finish_reason(done: P.GenerationDone, filt: OutputFilter) -> str:
        """OpenAI's finish reason: tool_calls, length (not cut by a stop string), stop."""
        if filt.calls:
            return "tool_calls"
        if done.finish_reason == "length" and not filt.stopped:
            return "length"
        return "stop"

    @staticmethod
    def done(job: Job) -> P.GenerationDone:
        """The job's result as the client should see it: after a system-prompt step, the
        prompt tokens cached are those that were cached before the request, not the step's."""
        done = job.result
        if job.warnings:
            done = replace(done, stats={**done.stats, "warnings": list(job.warnings)})
        if job.cached_before is None:
            return done
        stats = dict(done.stats)
        n = len(done.prompt_token_ids)
        stats["reused_prompt_tokens"] = job.cached_before
        stats["kv_hit_rate"] = round(job.cached_before / n, 4) if n else 0.0
        stats["system_prompt_checkpoint"] = True
        return replace(done, stats=stats)

    def ext(self, done: P.GenerationDone) -> dict:
        """The `ssdmoe` extension field: which K ran and the engine's figures (logged)."""
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
        if s.get("warnings"):
            ext["warnings"] = list(s["warnings"])
        if s.get("speculation"):  # acceptance, tokens per pass, bytes and ms per token
            ext["stats"]["speculation"] = s["speculation"]
        self.state.last_response_stats = ext
        st = ext["stats"]
        self.state.log(
            f"{done.request_id}: {st['prompt_tokens']} prompt tokens ({st['kv_cached_tokens']} "
            f"cached) -> {st['generated_tokens']} tokens ({done.finish_reason}), "
            f"{st['decode_tok_s']} tok/s, K={ext['k']}, {st['ssd_mib_per_token']} MiB/token from SSD"
        )
        return ext

    @staticmethod
    def stats_header(ext: dict) -> str:
        s = ext["stats"]
        keys = ("decode_tok_s", "prefill_tok_s", "ssd_mib_per_token", "requested_mib_per_token",
                "expert_cache_hit_rate", "kv_cached_tokens")  # fmt: skip
        return "; ".join([f"k={ext['k']}"] + [f"{key}={s[key]}" for key in keys])

    def headers(self, ext: dict) -> dict[str, str]:
        """A JSON reply's headers: the stats, and the warnings if any."""
        return {STATS_HEADER: self.stats_header(ext), **warning_header(ext.get("warnings", ()))}

    @staticmethod
    def cached_tokens(done: P.GenerationDone) -> int:
        return done.stats.get("reused_prompt_tokens", 0)
