"""Exact-history prompts for stateless requests.

An OpenAI client sends the whole chat every time. Re-rendering it through the template
would not give the tokens the model saw: templates drop earlier think blocks, and the
model's own tool-call text differs from the template's rendering of the same call. So
after each reply the server records the exact tokens (prompt + generated ids), keyed by
the messages a client will send back (the request's messages plus the reply as we
returned it, tools and template options included). A later request whose messages
start with a recorded conversation gets that record's tokens followed by the templated
new messages (`chat_format.turn_delta`): the KV cache of the previous turn is then a
true prefix of the new prompt, also for hybrid models whose state cannot be trimmed.
A request that matches no record is rendered by the template, as a fresh chat.

Records live in memory and in `history.json` next to the KV checkpoints (written
atomically), so a restarted server continues the same token sequences.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.checkpoint.config import read_json_object
from ssdmoe_tui.engine.run.kv_pool import common_prefix
from ssdmoe_tui.errors import ModelError
from ssdmoe_tui.prompting.chat_format import (
    ChatFormatError,
    ChatTemplateError,
    encode,
    first_turn_tokens,
    render,
    turn_delta,
)
from ssdmoe_tui.prompting.tool_support import shows_tools, tools_not_given
from ssdmoe_tui.server.errors import bad_request
from ssdmoe_tui.server.schema import ChatMessage, ChatRequest, CompletionRequest

HISTORY_FILE = "history.json"
MAX_RECORDS = 64
MAX_RECORD_TOKENS = 2_000_000  # all records together (~12 MB of JSON)
PER_CHAIN = 2


@dataclass(frozen=True)
class Prompt:
    tokens: list[int]
    chain: str  # the conversation the KV checkpoints are filed under
    from_history: bool  # built on a recorded exact history
    shared_prefix: int = 0  # tokens of the system part other chats share (0: none worth it)

    @property
    def prefix_chain(self) -> str:
        """The chain a shared prefix is filed under: named by its tokens, so every chat
        that starts with the same system prompt (and tools) finds it."""
        return prefix_chain(self.tokens[: self.shared_prefix])


@dataclass
class _Record:
    tokens: tuple[int, ...]
    chain: str


MIN_SHARED_PREFIX = 256  # shorter system prompts prefill fast enough


_CHAIN = re.compile(r"[0-9a-f]{16}")


def new_chain() -> str:
    return secrets.token_hex(8)


def is_chain(chain: object) -> bool:
    """A chain id as `new_chain` and `prefix_chain` make them (a safe folder name)."""
    return isinstance(chain, str) and _CHAIN.fullmatch(chain) is not None


def prefix_chain(tokens: Sequence[int]) -> str:
    return hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()[:16]


def _keys(options: Any, messages: Sequence[ChatMessage]) -> list[str]:
    """keys[j]: the key of messages[:j] (incremental hash: linear in the chat's size)."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True, ensure_ascii=False).encode())
    keys = [h.hexdigest()]
    for m in messages:
        h.update(b"\x1e" + json.dumps(m.canonical(), ensure_ascii=False).encode())
        keys.append(h.copy().hexdigest())
    return keys


class HistoryRecords:
    """LRU of (messages key -> exact tokens, chain), bounded, persisted atomically."""

    def __init__(self, path: Path | None, notice=lambda msg: None) -> None:
        self.path = path
        self._notice = notice
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._lock = threading.Lock()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ssdmoe-history")
        if path is not None:
            self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        try:  # the one JSON file reader: non-UTF-8, nested too deep... are one line
            raw = read_json_object(self.path)
        except ModelError as e:
            self._notice(f"prompt history ignored: {e}")
            return
        try:
            if raw.get("format") != "ssdmoe-server-history" or raw.get("version") != 1:
                raise ValueError("another format")
            for r in raw["records"]:
                tokens = tuple(r["tokens"])
                if not all(type(t) is int and t >= 0 for t in tokens):
                    raise ValueError("bad token ids")
                # the chain names a folder of KV checkpoints: never a path
                if not isinstance(r["key"], str) or not is_chain(r["chain"]):
                    raise ValueError("bad record")
                self._records[r["key"]] = _Record(tokens, r["chain"])
        except (AttributeError, KeyError, TypeError, ValueError):
            self._records.clear()
            self._notice(f"prompt history ignored: {self.path}: not a server history file")

    def tokens_of(self, chain: str) -> list[tuple[int, ...]]:
        """The recorded token sequences of one conversation, newest first."""
        with self._lock:
            return [r.tokens for r in reversed(self._records.values()) if r.chain == chain]

    def get(self, key: str) -> _Record | None:
        with self._lock:
            rec = self._records.get(key)
            if rec is not None:
                self._records.move_to_end(key)
            return rec

    def put(self, key: str, tokens: Sequence[int], chain: str) -> None:
        """Record a reply's exact tokens. A conversation keeps its last `PER_CHAIN` records
        (the latest turn, and the one before for a regenerated reply); the file is
        rewritten off the caller's thread, one write at a time."""
        with self._lock:
            self._records[key] = _Record(tuple(int(t) for t in tokens), chain)
            self._records.move_to_end(key)
            mine = [k for k, r in self._records.items() if r.chain == chain]
            for k in mine[:-PER_CHAIN]:
                del self._records[k]
            total = sum(len(r.tokens) for r in self._records.values())
            while len(self._records) > 1 and (
                len(self._records) > MAX_RECORDS or total > MAX_RECORD_TOKENS
            ):
                _, old = self._records.popitem(last=False)
                total -= len(old.tokens)
        if self.path is not None:
            self._writer.submit(self._save)

    def _save(self) -> None:
        with self._lock:
            data = {
                "format": "ssdmoe-server-history",
                "version": 1,
                "records": [
                    {"key": k, "chain": r.chain, "tokens": list(r.tokens)}
                    for k, r in self._records.items()
                ],
            }
        try:
            atomic_write_text(self.path, json.dumps(data, separators=(",", ":")))
        except OSError as e:
            self._notice(f"prompt history not saved: {self.path}: {e.strerror or e}")

    def flush(self) -> None:
        """Wait for pending writes (tests, shutdown)."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        """Finish pending writes and end the writer thread (server shutdown)."""
        self._writer.shutdown(wait=True)


def _tokenizer_size(tokenizer: Any) -> int | None:
    """Ids the tokenizer knows, added tokens included (mlx-lm wraps the HF tokenizer)."""
    try:
        return len(getattr(tokenizer, "_tokenizer", tokenizer))
    except TypeError:
        return None


def _max_token_bytes(tokenizer: Any) -> int | None:
    """UTF-8 bytes of the vocabulary's longest token (added tokens included). A token's
    string is never shorter than the text it stands for (byte-level BPE writes a byte as
    one or two UTF-8 bytes, SentencePiece a space as three), so no token covers more."""
    try:
        vocab = getattr(tokenizer, "_tokenizer", tokenizer).get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary: no text bound
        return None
    return max((len(t.encode()) for t in vocab if isinstance(t, str)), default=0) or None


# A normalizer may shrink text before it is split: NFC composes, NFKC folds (a fullwidth
# letter, 3 bytes, becomes 1), and some collapse runs of whitespace. So the text bound
# counts the bytes that are not whitespace, over the longest token's bytes times
# `_SHRINK`: below the true count whatever the normalizer does, short of an exotic one.
_SHRINK = 4


def _dense_bytes(text: str) -> int:
    """UTF-8 bytes of `text` without its whitespace (which a normalizer may collapse)."""
    return len("".join(text.split()).encode())


# `_template_reads` answers kept: a client names any template switch with any value, so
# a server that kept every one grew without bound; the usual few stay cached.
READS_CACHED_MAX = 256
# template switches probed per request: a client's body could hold tens of thousands of
# keys, each 2-3 renders of the template on the server's threads
PROBED_KEYS_MAX = 32
READS_KEY_CHARS_MAX = 512


class PromptBuilder:
    """Request -> prompt tokens (runs off the event loop: templating and tokenizing)."""

    def __init__(
        self, tokenizer: Any, records: HistoryRecords, vocab_size: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.records = records
        # Token ids a raw prompt may hold: those the tokenizer and the embedding both
        # know (`vocab_size`, the config's). MLX does not check an id past the
        # embedding: the process dies (SIGSEGV) instead of answering.
        limits = [n for n in (_tokenizer_size(tokenizer), vocab_size) if n]
        self.vocab_size = min(limits) if limits else None
        self.max_token_bytes = _max_token_bytes(tokenizer)
        self._reads: dict[tuple[str, str], bool] = {}  # _template_reads' answers
        self._tools_shown: bool | None = None  # _shows_tools' answer

    def floor(self, req: ChatRequest | CompletionRequest) -> int:
        """At most the request's prompt tokens, from sizes alone: what refuses a request far
        past the context before any template runs (100k messages took 43 s to render and
        refuse). Each user or tool message is at least one token (every template renders
        them); the text of the user, system and tool messages is at least its bytes
        (whitespace left out) over the longest token's times `_SHRINK`. Assistant text is
        not counted (templates drop earlier think blocks), nor are tools."""
        if isinstance(req, CompletionRequest):
            if isinstance(req.prompt, tuple):
                return len(req.prompt)
            return self._text_floor(_dense_bytes(req.prompt))
        counted = [m for m in req.messages if m.role in ("user", "tool", "system")]
        n_text = sum(_dense_bytes(m.content) for m in counted)
        return max(sum(m.role != "system" for m in counted), self._text_floor(n_text))

    def _text_floor(self, n_bytes: int) -> int:
        if not self.max_token_bytes:
            return 0
        return n_bytes // (self.max_token_bytes * _SHRINK)

    @staticmethod
    def _options(req: ChatRequest) -> list:
        return [list(req.tools), req.template_kwargs]

    def _template_kwargs(self, req: ChatRequest) -> dict:
        kw = dict(req.template_kwargs)
        if req.tools:
            kw["tools"] = [dict(t) for t in req.tools]
        return kw

    def unused_options(self, req: ChatRequest) -> list[str]:
        """What the request asks of the template that the model's template ignores: its
        tools, a template switch (`enable_thinking`, `reasoning_effort`, ...). One line
        each, for the reply's warnings; a template that cannot be probed says nothing."""
        out = []
        if req.tools and not self._shows_tools():
            out.append(tools_not_given(len(req.tools)))
        items = sorted(req.template_kwargs.items())
        if len(items) > PROBED_KEYS_MAX:  # each probe renders the template 2-3 times
            out.append(
                f"{len(items) - PROBED_KEYS_MAX} of the {len(items)} chat_template_kwargs "
                f"keys were not checked against the chat template (the first {PROBED_KEYS_MAX} "
                "were)"
            )
        for key, value in items[:PROBED_KEYS_MAX]:
            if not self._template_reads(key, value):
                out.append(
                    f"the model's chat template does not use {key!r}: "
                    f"{key}={json.dumps(value)[:40]} had no effect"
                )
        return out

    def _shows_tools(self) -> bool:
        """The template shows tools to the model (`prompting.tool_support`); probed once."""
        if self._tools_shown is None:
            self._tools_shown = shows_tools(self.tokenizer)
        return self._tools_shown

    def _template_reads(self, key: str, value: Any) -> bool:
        """Whether rendering a probe chat changes with template variable `key` (a bool:
        both values; else the value against none). Cached."""
        try:
            cache_key = (key, json.dumps(value, sort_keys=True))
        except (TypeError, ValueError):
            return True
        known = self._reads.get(cache_key)
        if known is not None:
            return known
        probe = [{"role": "user", "content": "probe"}]
        variants = [{}, {key: value}] + ([{key: not value}] if isinstance(value, bool) else [])
        try:
            texts = {render(self.tokenizer, probe, add_generation_prompt=True, **v)
                     for v in variants}  # fmt: skip
        except Exception:  # noqa: BLE001 - a template that fails the probe: assume it reads it
            texts = {"", "x"}
        reads = len(texts) > 1
        if len(self._reads) >= READS_CACHED_MAX:  # keys and values are the clients': bounded
            self._reads.clear()
        if len(cache_key[0]) + len(cache_key[1]) <= READS_KEY_CHARS_MAX:
            self._reads[cache_key] = reads
        return reads

    def chat(self, req: ChatRequest) -> Prompt:
        """The request's prompt. A chat template that refuses the messages (Qwen3.5's
        "System message must be at the beginning.") or cannot render them (tool-call
        arguments that are not a JSON object under `|items`, a template option of the
        wrong type) is the client's 400, not a 500."""
        from jinja2 import TemplateError

        try:
            return self._chat(req)
        except ChatTemplateError as e:  # names the template file and the reason
            raise bad_request(str(e), "messages") from None
        except (TemplateError, TypeError) as e:
            raise bad_request(
                f"the model's chat template refused these messages: {e}", "messages"
            ) from None

    def _chat(self, req: ChatRequest) -> Prompt:
        msgs = req.messages
        kw = self._template_kwargs(req)
        keys = _keys(self._options(req), msgs)
        for j in range(len(msgs) - 1, 0, -1):
            if msgs[j - 1].role != "assistant":
                continue
            rec = self.records.get(keys[j])
            if rec is None:
                continue
            try:
                delta = turn_delta(
                    self.tokenizer,
                    rec.tokens,
                    [m.for_template() for m in msgs[:j]],
                    [m.for_template() for m in msgs[j:]],
                    **kw,
                )
            except ChatFormatError:
                break
            return Prompt(list(rec.tokens) + delta, rec.chain, True)
        tokens = self._fresh(msgs, kw)
        return Prompt(tokens, new_chain(), False, self._shared_prefix(msgs, kw, tokens))

    def _shared_prefix(self, msgs: Sequence[ChatMessage], kw: dict, tokens: list[int]) -> int:
        """How many prompt tokens come before the first user message's text: the system
        prompt and tools, which an agent sends unchanged at the start of every chat. The
        template renders the chat up to a sentinel as that message; the tokens of the
        text before it that match the prompt are the shared part."""
        first_user = next((i for i, m in enumerate(msgs) if m.role == "user"), None)
        if first_user is None or not getattr(self.tokenizer, "chat_template", None):
            return 0
        sentinel = f"SSDMOE{secrets.token_hex(8)}PREFIX"
        head = [m.for_template() for m in msgs[:first_user]]
        head.append({"role": "user", "content": sentinel})
        try:
            text = render(self.tokenizer, head, add_generation_prompt=False, **kw)
        except Exception:  # noqa: BLE001 - a template that refuses this: no shared prefix
            return 0
        at = text.find(sentinel)
        if at <= 0:
            return 0
        n = common_prefix(encode(self.tokenizer, text[:at]), tokens)
        return n if MIN_SHARED_PREFIX <= n < len(tokens) - 1 else 0

    def _fresh(self, msgs: Sequence[ChatMessage], kw: dict) -> list[int]:
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            return first_turn_tokens(tok, [m.for_template() for m in msgs], **kw)
        return list(tok.encode("\n".join(m.content for m in msgs)))

    def completion(self, req: CompletionRequest) -> Prompt:
        if isinstance(req.prompt, tuple):
            top = max(req.prompt)
            if self.vocab_size is not None and top >= self.vocab_size:
                raise bad_request(
                    f"token id {top} is outside the vocabulary (0..{self.vocab_size - 1})",
                    "prompt",
                )
            return Prompt(list(req.prompt), new_chain(), False)
        return Prompt(list(self.tokenizer.encode(req.prompt)), new_chain(), False)

    def record(
        self, req: ChatRequest, prompt: Prompt, generated: Sequence[int], reply: ChatMessage
    ) -> None:
        """File the exact tokens under the messages the client will send back."""
        key = _keys(self._options(req), [*req.messages, reply])[-1]
        self.records.put(key, list(prompt.tokens) + list(generated), prompt.chain)
