"""Conversations on disk: one folder per conversation under the sessions folder.

    sessions/<id>/conversation.json   title, times, model, system prompt, turns
    sessions/<id>/kv-<n>.safetensors  KV checkpoints (see checkpoints.py)
    sessions/.last_opened             id for `ssdmoe --resume`

Ids are generated here (`20261129-191118-a1b2c3`: UTC time + random) and checked
against a strict pattern before any path is built from them, so no id can reach
outside the sessions folder. Titles are data only, never part of a path.
Every write is atomic (temp, fsync, rename): a crash leaves the previous text.

A *turn* here is one message (role, text, exact token ids, K, stopped). The token ids
of a user turn are exactly the tokens appended to the context for it (the templated
delta: the previous turn's closing text, the user block, the assistant header); an
assistant turn's ids are the generated ids. Their concatenation is the conversation's
exact token history, which is what KV checkpoints are checked against.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ssdmoe_tui import paths
from ssdmoe_tui.atomic import atomic_write_text, atomic_write_via, private_dirs
from ssdmoe_tui.chat.attachments import split_attached
from ssdmoe_tui.errors import BadValueError, SsdmoeError
from ssdmoe_tui.terminal_text import visible
from ssdmoe_tui.tools.choice import ToolChoice
from ssdmoe_tui.user_files import (
    CONVERSATION_MAX,
    SMALL_STATE_MAX,
    read_regular,
    read_regular_text,
)

FORMAT = "ssdmoe-conversation"
VERSION = 1
CONVERSATION_FILE = "conversation.json"
LAST_OPENED_FILE = ".last_opened"
ID_PATTERN = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")
TITLE_MAX = 80

# Test hook: called with the finished temp file just before conversation.json is replaced.
_before_rename: Callable[[Path], None] | None = None


class SessionError(SsdmoeError):
    """A conversation that cannot be found or read; one line naming it."""


class SessionNotFound(SessionError):
    pass


class SessionCorrupt(SessionError):
    pass


def validate_id(conv_id: str) -> str:
    """The id itself if it is one this store could have made; BadValueError otherwise."""
    if not isinstance(conv_id, str) or not ID_PATTERN.match(conv_id):
        shown = repr(conv_id)[:60]
        raise BadValueError(f"not a conversation id: {shown}")
    return conv_id


def new_id(now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{stamp}-{secrets.token_hex(3)}"


def clean_title(text: str, limit: int = TITLE_MAX) -> str:
    """One line of printable text: control characters dropped, whitespace collapsed."""
    text = "".join(" " if unicodedata.category(c)[0] in "CZ" else c for c in text or "")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


# --------------------------------------------------------------------------- data

TOKEN_ID_MAX = (1 << 32) - 1  # token ids are hashed as uint32 (checkpoints.tokens_sha256)
_TIME_MAX = 253402300799.0  # 9999-12-31: any later time cannot be shown as a date


def _is_int(value: Any, lo: int, hi: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _str(d: dict[str, Any], key: str, default: str | None = "") -> str:
    """A text field: a JSON string (a number or a list where text belongs is damage, not
    something to print with `str()`); `default` None: required."""
    if key not in d and default is not None:
        return default
    value = d[key]
    if not isinstance(value, str):
        raise ValueError(f"{key} must be text, not {json.dumps(value)[:20]}")
    return value


def _bool(d: dict[str, Any], key: str) -> bool:
    value = d.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {json.dumps(value)[:20]}")
    return value


def _timestamp(value: Any, name: str) -> float:
    """A time in seconds that can be shown as a date (finite, 0..year 9999)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is not a number")
    if not 0 <= value <= _TIME_MAX:  # also rejects nan and inf
        raise ValueError(f"{name} is out of range ({str(value)[:20]})")
    return float(value)


FINISH_REASONS = ("", "stop", "length", "cancelled")  # "": saved before it was kept


ROLES = ("user", "assistant", "tool")


@dataclass
class Turn:
    role: str  # "user", "assistant" or "tool" (a tool's result, fed back to the model)
    text: str
    token_ids: list[int] = field(default_factory=list)
    k: int | None = None  # experts per token used (assistant turns; the most common)
    # generation was stopped before its end-of-turn token (a user turn: its reply was
    # stopped before its first token, so none is stored)
    stopped: bool = False
    created: float = field(default_factory=time.time)
    k_min: int | None = None  # the range of K over the reply's tokens (K changed live)
    k_max: int | None = None
    model: str = ""  # the model that wrote the reply
    decode_tok_s: float | None = None  # its decode speed
    finish: str = ""  # why the reply ended: "stop", "length" (max tokens), "cancelled"
    kv_hit_rate: float | None = None  # share of its prompt served from the KV cache
    thinking_tokens: int = 0  # of its tokens, the reasoning's (<think> ... </think>)
    tool_name: str = ""  # a tool turn: the tool that gave the result
    tool_call_id: str = ""  # a tool turn: the call it answers
    # A server's reply (the app attached): its calls as the API returned them, each
    # {"id", "name", "arguments"} (a local reply's calls are in its text)
    tool_calls: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Turn:
        if not isinstance(d, dict):
            raise ValueError("a turn is not a JSON object")
        role = d["role"]
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        ids = d.get("token_ids") or []
        if not isinstance(ids, list) or not all(_is_int(i, 0, TOKEN_ID_MAX) for i in ids):
            raise ValueError(f"token_ids must be integers in 0..{TOKEN_ID_MAX}")
        k = d.get("k")
        if k is not None and not _is_int(k, 1, 1 << 16):
            raise ValueError(f"k must be a positive integer, not {str(k)[:20]}")

        def opt_k(key: str) -> int | None:
            value = d.get(key)
            if value is not None and not _is_int(value, 1, 1 << 16):
                raise ValueError(f"{key} must be a positive integer, not {str(value)[:20]}")
            return value

        def opt_count(key: str) -> int:
            value = d.get(key, 0)
            if not _is_int(value, 0, TOKEN_ID_MAX):
                raise ValueError(f"{key} must be a count, not {str(value)[:20]}")
            return value

        rate = d.get("decode_tok_s")
        if rate is not None and not (isinstance(rate, int | float) and 0 <= rate < 1e9):
            raise ValueError(f"decode_tok_s is not a rate ({str(rate)[:20]})")
        hit = d.get("kv_hit_rate")
        if hit is not None and not (isinstance(hit, int | float) and 0 <= hit <= 1):
            raise ValueError(f"kv_hit_rate is not a share ({str(hit)[:20]})")
        finish = str(d.get("finish", ""))
        if finish not in FINISH_REASONS:
            raise ValueError(f"finish is not one of {', '.join(FINISH_REASONS[1:])}")
        return cls(
            role=role,
            text=_str(d, "text", None),
            token_ids=list(ids),
            k=k,
            stopped=_bool(d, "stopped"),
            created=_timestamp(d.get("created", 0.0), "created"),
            k_min=opt_k("k_min"),
            k_max=opt_k("k_max"),
            model=_str(d, "model")[:200],
            decode_tok_s=float(rate) if rate is not None else None,
            finish=finish,
            kv_hit_rate=float(hit) if hit is not None else None,
            thinking_tokens=opt_count("thinking_tokens"),
            tool_name=_str(d, "tool_name")[:200],
            tool_call_id=_str(d, "tool_call_id")[:200],
            tool_calls=_calls(d.get("tool_calls", [])),
        )


def _calls(value: Any) -> list[dict[str, str]]:
    keys = {"id", "name", "arguments"}
    ok = isinstance(value, list) and all(
        isinstance(c, dict) and set(c) == keys and all(isinstance(v, str) for v in c.values())
        for c in value
    )
    if not ok:
        raise ValueError('tool_calls must be a list of {"id", "name", "arguments"} texts')
    return [dict(c) for c in value]


def turn_message(t: Turn) -> dict[str, str]:
    """A stored turn as a chat message for the template (a tool result names its tool)."""
    msg = {"role": t.role, "content": t.text}
    if t.role == "tool" and t.tool_name:
        msg["name"] = t.tool_name
    if t.role == "tool" and t.tool_call_id:
        msg["tool_call_id"] = t.tool_call_id
    return msg


@dataclass
class Conversation:
    id: str
    title: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    model_id: str = ""
    fingerprint: str = ""
    model_path: str = ""  # the folder it was loaded from: `--resume` opens it again
    system_prompt: str = ""
    # Turns stored before `system_prompt` was set (F9 mid-conversation; 0: from the
    # start), and the prompts it replaced as [turns before, text]: the Markdown export
    # shows each where it began (it put a prompt set later at the top).
    system_since: int = 0
    earlier_systems: list[list[Any]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    tokenizer_id: str = ""  # which tokenizer + template produced the token ids
    # The conversation's generation settings (config keys: temperature, top_p,
    # max_tokens, k, system_prompt), checked by the app when it opens the conversation.
    settings: dict[str, Any] = field(default_factory=dict)
    # Exchanges taken out by a regenerate or an edit, oldest first: never lost.
    replaced: list[list[Turn]] = field(default_factory=list)
    # The MCP servers and tools this conversation leaves off (F10; all on by default).
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    # The tools the stored ids were templated with (a hash; "" none, None not recorded:
    # a conversation of an older version): when the tools offered change (F10), the
    # history is templated again, so a tool turned off leaves the model's context.
    tools_key: str | None = None

    @property
    def display_title(self) -> str:
        if self.title:
            return self.title
        first = next((t.text for t in self.turns if t.role == "user"), "")
        typed = split_attached(first)[0]  # as typed: not the attached files' blocks
        return clean_title(typed) or "New conversation"

    @property
    def n_turns(self) -> int:
        """Exchanges: user messages."""
        return sum(1 for t in self.turns if t.role == "user")

    def history_tokens(self) -> list[int]:
        """The exact token sequence the model has seen and produced so far."""
        out: list[int] = []
        for t in self.turns:
            out.extend(t.token_ids)
        return out

    def messages(self) -> list[dict[str, str]]:
        """Chat messages (system prompt first, if any) for templating."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        msgs.extend(turn_message(t) for t in self.turns)
        return msgs

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "model_id": self.model_id,
            "fingerprint": self.fingerprint,
            "model_path": self.model_path,
            "system_prompt": self.system_prompt,
            "system_since": self.system_since,
            "earlier_systems": [list(e) for e in self.earlier_systems],
            "tokenizer_id": self.tokenizer_id,
            "turns": [asdict(t) for t in self.turns],
            "settings": dict(self.settings),
            "replaced": [[asdict(t) for t in group] for group in self.replaced],
            "tool_choice": self.tool_choice.as_dict(),
            "tools_key": self.tools_key,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Conversation:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError("not an ssdmoe conversation")
        version = d.get("version", 0)
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be a whole number, not {json.dumps(version)[:20]}")
        if version > VERSION:
            raise ValueError(f"written by a newer ssdmoe (version {version})")
        turns = d.get("turns", [])
        if not isinstance(turns, list):
            raise ValueError("turns must be a list")
        return cls(
            id=validate_id(_str(d, "id", None)),
            title=clean_title(_str(d, "title")),
            created=_timestamp(d["created"], "created"),
            updated=_timestamp(d["updated"], "updated"),
            model_id=_str(d, "model_id"),
            fingerprint=_str(d, "fingerprint"),
            model_path=_str(d, "model_path"),
            system_prompt=_str(d, "system_prompt"),
            system_since=_count(d.get("system_since", 0), "system_since"),
            earlier_systems=_earlier_systems(d.get("earlier_systems", [])),
            turns=[Turn.from_dict(t) for t in turns],
            tokenizer_id=_str(d, "tokenizer_id"),
            settings=_settings(d.get("settings", {})),
            replaced=_replaced(d.get("replaced", [])),
            tool_choice=ToolChoice.from_dict(d.get("tool_choice", {})),
            tools_key=_tools_key(d.get("tools_key")),
        )


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1 << 31:
        raise ValueError(f"{what} must be a whole number of turns, not {json.dumps(value)[:20]}")
    return value


def _earlier_systems(value: Any) -> list[list[Any]]:
    ok = isinstance(value, list) and all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[1], str) for e in value
    )
    if not ok:
        raise ValueError("earlier_systems must be a list of [turns, text] pairs")
    return [[_count(n, "earlier_systems"), text] for n, text in value]


def _replaced(value: Any) -> list[list[Turn]]:
    if not isinstance(value, list) or not all(isinstance(g, list) for g in value):
        raise ValueError("replaced must be a list of exchanges")
    return [[Turn.from_dict(t) for t in group] for group in value]


def _tools_key(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError("tools_key must be a string")
    return value


def _settings(value: Any) -> dict[str, Any]:
    """Plain key = value pairs; their meaning is checked where they are used."""
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and (v is None or isinstance(v, str | int | float))
        for k, v in value.items()
    )
    if not ok:
        raise ValueError("settings must be a table of plain values")
    return dict(value)


@dataclass(frozen=True)
class Summary:
    """What the conversation list shows."""

    id: str
    title: str
    created: float
    updated: float
    model_id: str
    n_turns: int
    snippet: str = ""  # search hit in context (search results only)
    problem: str = ""  # why it cannot be read (rows of unreadable conversations only)


def _summary(conv: Conversation, snippet: str = "") -> Summary:
    return Summary(
        conv.id,
        conv.display_title,
        conv.created,
        conv.updated,
        conv.model_id,
        conv.n_turns,
        snippet,
    )


# --------------------------------------------------------------------------- store


class SessionStore:
    """All conversations under one sessions folder (default: paths.sessions_dir())."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else paths.sessions_dir()
        self._lock = threading.RLock()

    # -------------------------------------------------------------- paths
    def folder(self, conv_id: str) -> Path:
        """The conversation's folder; the id is validated first."""
        return self.root / validate_id(conv_id)

    def _file(self, conv_id: str) -> Path:
        return self.folder(conv_id) / CONVERSATION_FILE

    # -------------------------------------------------------------- create / save
    def create(
        self,
        model_id: str = "",
        fingerprint: str = "",
        system_prompt: str = "",
        title: str = "",
        *,
        conv_id: str | None = None,
    ) -> Conversation:
        """A new conversation, saved; `conv_id` (e.g. one handed out earlier by `new_id`)
        must not exist yet."""
        with self._lock:
            private_dirs(self.root, tighten=True)
            while True:
                conv = Conversation(
                    id=validate_id(conv_id) if conv_id is not None else new_id(),
                    title=clean_title(title),
                    model_id=model_id,
                    fingerprint=fingerprint,
                    system_prompt=system_prompt,
                )
                try:
                    self.folder(conv.id).mkdir(mode=0o700)
                    break
                except FileExistsError:
                    if conv_id is not None and (self.folder(conv_id) / CONVERSATION_FILE).exists():
                        raise BadValueError(f"conversation {conv_id} already exists") from None
                    if conv_id is not None:
                        break  # an empty folder (e.g. a crash before the first save): reuse it
                    continue
            try:
                self.save(conv, touch=False)
            except BaseException:
                # No half-made conversation: a folder without its file (disk full) goes.
                shutil.rmtree(self.folder(conv.id), ignore_errors=True)
                raise
            return conv

    def save(self, conv: Conversation, *, touch: bool = True) -> None:
        """Write conversation.json atomically (`touch`: set `updated` to now)."""
        if touch:
            conv.updated = max(time.time(), conv.updated)
        data = json.dumps(conv.to_dict(), ensure_ascii=False, separators=(",", ":")).encode()

        def write(tmp: Path) -> None:
            tmp.write_bytes(data)
            if _before_rename is not None:
                _before_rename(tmp)

        with self._lock:
            atomic_write_via(self._file(conv.id), write, needed=len(data))

    def add_turn(self, conv: Conversation, turn: Turn) -> None:
        """Append a turn and save (the first user message becomes the default title)."""
        if turn.role not in ROLES:
            raise BadValueError(f"unknown role: {turn.role!r}")
        conv.turns.append(turn)
        try:
            self.save(conv)
        except BaseException:
            conv.turns.pop()  # memory stays what the disk holds (e.g. disk full: try again)
            raise

    # -------------------------------------------------------------- read
    def get(self, conv_id: str) -> Conversation:
        """The conversation `conv_id`; SessionNotFound / SessionCorrupt (one line naming the
        file) for a missing or damaged one: never another exception, whatever the bytes."""
        path = self._file(conv_id)
        try:
            raw = read_regular(path, CONVERSATION_MAX)
        except FileNotFoundError:
            raise SessionNotFound(f"no conversation {conv_id}") from None
        except OSError as e:
            raise SessionCorrupt(f"cannot read {path}: {e.strerror or e}") from None
        try:
            conv = Conversation.from_dict(json.loads(raw.decode("utf-8")))
        except UnicodeDecodeError as e:
            raise SessionCorrupt(f"{path} is not UTF-8 text (byte {e.start})") from None
        except RecursionError:
            raise SessionCorrupt(f"{path} is not a valid conversation: nested too deeply") from None
        except KeyError as e:
            raise SessionCorrupt(f"{path} is not a valid conversation: no {e}") from None
        except (ValueError, TypeError, AttributeError, OverflowError) as e:
            why = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
            raise SessionCorrupt(f"{path} is not a valid conversation: {why}") from None
        if conv.id != conv_id:
            raise SessionCorrupt(f"{path} holds conversation {conv.id}, not {conv_id}")
        return conv

    def ids(self) -> list[str]:
        try:
            names = [e.name for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return []
        return sorted((n for n in names if ID_PATTERN.match(n)), reverse=True)

    def _all(
        self,
        on_error: Callable[[str], None] | None,
        unreadable: list[Summary] | None = None,
    ) -> Iterable[Conversation]:
        for conv_id in self.ids():
            try:
                yield self.get(conv_id)
            except SessionNotFound:
                continue  # a folder whose first save never happened (killed): not one yet
            except SessionError as e:
                if on_error is not None:
                    on_error(str(e))
                if unreadable is not None:
                    unreadable.append(self._unreadable_row(conv_id, str(e)))

    def _unreadable_row(self, conv_id: str, why: str) -> Summary:
        try:
            when = (self.folder(conv_id) / CONVERSATION_FILE).stat().st_mtime
        except OSError:
            when = 0.0
        return Summary(conv_id, f"Unreadable conversation {conv_id}", when, when, "", 0, "", why)

    def list(
        self,
        on_error: Callable[[str], None] | None = None,
        *,
        unreadable: list[Summary] | None = None,
    ) -> list[Summary]:
        """Every readable conversation, most recently updated first. Unreadable ones go to
        `on_error` (one line each) and, as list rows with their `problem`, to `unreadable`."""
        convs = sorted(self._all(on_error, unreadable), key=lambda c: c.updated, reverse=True)
        return [_summary(c) for c in convs]

    def search(
        self,
        text: str,
        on_error: Callable[[str], None] | None = None,
        *,
        unreadable: list[Summary] | None = None,
    ) -> list[Summary]:
        """Conversations whose title or any message contains `text` (case-insensitive);
        an empty `text` lists them all (then `unreadable` gets the unreadable ones)."""
        needle = " ".join(text.split()).casefold()
        if not needle:
            return self.list(on_error, unreadable=unreadable)
        hits = []
        for conv in self._all(on_error):
            for source in [conv.display_title, conv.system_prompt] + [t.text for t in conv.turns]:
                flat = " ".join(source.split())
                at = flat.casefold().find(needle)
                if at >= 0:
                    lo = max(0, at - 30)
                    snippet = ("…" if lo else "") + flat[lo : at + len(needle) + 50]
                    hits.append(_summary(conv, clean_title(snippet, 100)))
                    break
        return sorted(hits, key=lambda s: s.updated, reverse=True)

    # -------------------------------------------------------------- edit
    def rename(self, conv_id: str, title: str) -> Conversation:
        with self._lock:
            conv = self.get(conv_id)
            conv.title = clean_title(title)
            self.save(conv, touch=False)
            return conv

    def delete(self, conv_id: str) -> None:
        """Remove the conversation and its checkpoints. The folder is first renamed out
        of the listing, so a crash mid-delete never leaves a half-deleted conversation."""
        with self._lock:
            folder = self.folder(conv_id)
            if not folder.is_dir():
                raise SessionNotFound(f"no conversation {conv_id}")
            trash = self.root / f".trash-{conv_id}-{secrets.token_hex(3)}"
            os.replace(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
            if self.last_opened(fallback=False) == conv_id:
                (self.root / LAST_OPENED_FILE).unlink(missing_ok=True)

    def clear(self, conv_id: str) -> Conversation:
        """A fresh context in the same window: a new, empty conversation with the same
        model and system prompt. The old one stays in the list (text is never dropped)."""
        old = self.get(conv_id)
        new = self.create(old.model_id, old.fingerprint, old.system_prompt)
        self.mark_opened(new.id)
        return new

    # -------------------------------------------------------------- resume
    def mark_opened(self, conv_id: str) -> None:
        validate_id(conv_id)
        with self._lock:
            private_dirs(self.root)
            atomic_write_text(self.root / LAST_OPENED_FILE, conv_id + "\n")

    def last_opened(self, *, fallback: bool = True) -> str | None:
        """The conversation last opened (for `--resume`); else the most recently updated."""
        try:
            conv_id = read_regular_text(self.root / LAST_OPENED_FILE, SMALL_STATE_MAX).strip()
            if ID_PATTERN.match(conv_id) and (self.folder(conv_id) / CONVERSATION_FILE).is_file():
                return conv_id
        except (OSError, UnicodeDecodeError):
            pass
        if not fallback:
            return None
        listed = self.list()
        return listed[0].id if listed else None

    # -------------------------------------------------------------- export
    def export_markdown(self, conv_id: str) -> str:
        return to_markdown(self.get(conv_id))

    def export_json(self, conv_id: str, *, include_tokens: bool = True) -> str:
        return to_json(self.get(conv_id), include_tokens=include_tokens)

    def export_to(self, conv_id: str, dest: Path, fmt: str = "md") -> Path:
        """Write an export file atomically; `dest` is a file or a folder (then the name is
        made from the id, never from the title)."""
        if fmt not in ("md", "json"):
            raise BadValueError(f"export format must be md or json, not {fmt!r}")
        text = self.export_markdown(conv_id) if fmt == "md" else self.export_json(conv_id)
        dest = Path(dest).expanduser()
        try:
            if dest.is_dir():
                dest = dest / f"conversation-{validate_id(conv_id)}.{fmt}"
            atomic_write_text(dest, text)
        except SsdmoeError:
            raise  # disk full: already one line with the path
        except OSError as e:
            blocker = next((p for p in dest.parents if p.exists() and not p.is_dir()), None)
            why = f"{blocker} is a file, not a folder" if blocker else e.strerror or str(e)
            raise SessionError(f"cannot write {dest}: {why}") from None
        return dest


def to_markdown(conv: Conversation) -> str:
    lines = [f"# {conv.display_title}", ""]
    lines.append(f"- Conversation: `{conv.id}`")
    if conv.model_id:
        lines.append(f"- Model: {conv.model_id}")
    lines.append(f"- Created: {iso(conv.created)}; updated: {iso(conv.updated)}")
    lines.append("")
    systems = [*conv.earlier_systems, [conv.system_since, conv.system_prompt]]
    for i, t in enumerate([*conv.turns, None]):
        for since, text in systems:  # each where it began (a rewind may have cut the turns)
            if text and (since == i or (t is None and since > i)):
                n = sum(1 for u in conv.turns[:i] if u.role == "user")
                later = f" (set after {n} turn{'' if n == 1 else 's'})" if n else ""
                lines += [f"## System{later}", "", text, ""]
        if t is None:
            break
        if t.role == "tool":
            lines += [f"## Tool result ({t.tool_name or 'tool'})", "", "```", t.text, "```", ""]
            continue
        heading = "## User" if t.role == "user" else "## Assistant"
        notes = []
        if t.role == "assistant" and t.k_min is not None and t.k_max != t.k_min:
            notes.append(f"K={t.k_min}–{t.k_max}")
        elif t.role == "assistant" and t.k is not None:
            notes.append(f"K={t.k}")
        if t.stopped:
            notes.append("stopped")
        elif t.finish == "length":
            notes.append("hit max tokens")
        if notes and t.role == "assistant":
            heading += f" ({', '.join(notes)})"
        lines += [heading, "", t.text, ""]
        if t.role == "user" and t.stopped:  # its reply was stopped before its first token
            lines += ["## Assistant (stopped before its first token)", "", "_(no reply)_", ""]
    for n, group in enumerate(conv.replaced, 1):
        lines += [f"## Replaced exchange {n} (regenerated or edited)", ""]
        for t in group:
            lines += [f"**{t.role.capitalize()}:**", "", t.text, ""]
    # read with `cat` as often as in an editor: the model's and the tools' control
    # characters are escapes, as on screen (the JSON export keeps the exact text)
    return visible("\n".join(lines).rstrip("\n")) + "\n"


_RAW_IN_JSON = re.compile("[\x7f-\x9f]")


def to_json(conv: Conversation, *, include_tokens: bool = True) -> str:
    data = conv.to_dict()
    if not include_tokens:
        for t in data["turns"]:
            t.pop("token_ids", None)
    text = json.dumps(data, ensure_ascii=False, indent=2)
    # json escapes C0 but leaves DEL and C1 raw; as \u escapes the text is the same JSON
    return _RAW_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text) + "\n"
