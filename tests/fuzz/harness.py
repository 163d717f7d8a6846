"""Fuzz targets for every reader of user-controlled files, and a seeded mutator.

Each target takes bytes, writes them where the reader expects a file, and calls the
real reader. The contract is the project's: bad input gives an `SsdmoeError` whose
message is one line (no traceback, not a bare exception type) or, for the config, a
warning; anything else (TypeError, OverflowError, RecursionError, MemoryError, a
multi-line message...) is a finding. The harness is independent of how it is driven:
`scripts/fuzz.py` runs it with atheris (coverage-guided, where it installs) or with the
seeded mutator below, and `tests/faults/test_fuzz.py` replays every finding kept in
`tests/fuzz/crashes/` and runs a short bounded session.

Inputs of the two safetensors targets are `<framing byte><header JSON>`: the target
writes the 8-byte length, the header and as many data bytes as the header declares
(sparse), then the framing byte may cut the data or garble the length.
"""

from __future__ import annotations

import atexit
import json
import random
import re
import shutil
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SEEDS = Path(__file__).resolve().parent / "seeds"
CRASHES = Path(__file__).resolve().parent / "crashes"
_MAX_DATA = 64 << 20  # sparse data bytes written for a header (more: the file is cut short)


class Finding(Exception):
    """The reader broke the contract on this input."""


def _check_message(text: str, what: str) -> None:
    if "\n" in text.strip():
        raise Finding(f"{what}: message spans lines: {text[:200]!r}")
    bare = text.strip().rstrip(":")
    if not bare or re.fullmatch(r"[A-Za-z_]*(Error|Exception)", bare):
        raise Finding(f"{what}: bare message {text[:100]!r}")


def _expect_clean(call: Callable[[], object], what: str) -> None:
    """Run a reader: returning or raising SsdmoeError with a one-line message is fine."""
    from ssdmoe_tui.errors import SsdmoeError

    try:
        call()
    except SsdmoeError as e:
        _check_message(str(e), what)


# --------------------------------------------------------------------------- framing


def _frame(data: bytes) -> tuple[bytes, int]:
    """`<framing byte><header>` -> (the file's first bytes, data bytes after them)."""
    mode, header = (data[0], data[1:]) if data else (0, b"")
    declared = 0
    try:
        parsed = json.loads(header)
        if isinstance(parsed, dict):
            for spec in parsed.values():
                offs = spec.get("data_offsets") if isinstance(spec, dict) else None
                if isinstance(offs, list) and len(offs) == 2 and isinstance(offs[1], int):
                    declared = max(declared, offs[1])
    except (ValueError, RecursionError):
        pass
    declared = min(max(declared, 0), _MAX_DATA)
    length = len(header)
    if mode % 7 == 1:
        declared //= 2  # data cut short
    elif mode % 7 == 2:
        length += 1 + mode  # length past the header
    elif mode % 7 == 3:
        length = (1 << 63) + mode  # absurd length
    elif mode % 7 == 4:
        return struct.pack("<Q", length)[: mode % 8], 0  # the length field itself cut
    return struct.pack("<Q", length % (1 << 64)) + header, declared


def _write_safetensors(path: Path, data: bytes) -> None:
    head, declared = _frame(data)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + declared)  # sparse: the data bytes are never written


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes, Path], None]  # (input, scratch folder)
    seed_glob: str

    def seeds(self) -> list[bytes]:
        out = []
        for p in sorted((SEEDS / self.name).glob(self.seed_glob)):
            raw = p.read_bytes()
            out.append(raw if self.name not in _FRAMED else b"\0" + raw)
        return out


def _safetensors(data: bytes, work: Path) -> None:
    from ssdmoe_tui.engine.experts.index import build_index

    folder = work / "model"
    folder.mkdir(exist_ok=True)
    _write_safetensors(folder / "model.safetensors", data)
    _expect_clean(lambda: build_index(folder), "safetensors header/index")


def _kv_checkpoint(data: bytes, work: Path) -> None:
    from ssdmoe_tui.sessions.checkpoints import check_checkpoint, read_metadata

    path = work / "kv-00000004.safetensors"
    _write_safetensors(path, data)
    _expect_clean(lambda: read_metadata(path), "KV checkpoint metadata")
    _expect_clean(lambda: check_checkpoint(path, [3, 4, 5, 6], "fp"), "KV checkpoint check")


def _trace(data: bytes, work: Path) -> None:
    from ssdmoe_tui.engine.policy.traces import read_trace

    path = work / "trace.jsonl"
    path.write_bytes(data)
    _expect_clean(lambda: read_trace(path), "trace reader")


def _conversation(data: bytes, work: Path) -> None:
    from ssdmoe_tui.sessions.store import SessionStore

    conv_id = "20261129-191118-a1b2c3"
    folder = work / "sessions" / conv_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "conversation.json").write_bytes(data)
    store = SessionStore(work / "sessions")
    _expect_clean(lambda: store.get(conv_id), "conversation loader")
    problems: list[str] = []
    store.list(problems.append)  # must never raise
    for p in problems:
        _check_message(p, "conversation list")


def _config(data: bytes, work: Path) -> None:
    from ssdmoe_tui.config import load_config

    path = work / "config.toml"
    path.write_bytes(data)
    loaded = load_config(path)  # never raises: warnings instead
    for w in loaded.warnings:
        _check_message(w, "config loader")


_TOKENIZER: list = []  # one in-memory tokenizer for every chat-template case
_TEMPLATE_STEPS = 20_000  # the render budget while fuzzing (a case stays milliseconds)


def _tokenizer():
    if not _TOKENIZER:
        from mlx_lm.tokenizer_utils import TokenizerWrapper
        from tokenizers import Tokenizer
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast

        vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "hi": 3}
        tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", unk_token="<unk>"
        )
        _TOKENIZER.append(TokenizerWrapper(hf))  # as mlx-lm hands it to chat_format
    return _TOKENIZER[0]


def _chat_template(data: bytes, work: Path) -> None:
    """A chat template from a model folder, rendered for a small chat with tools: one
    ChatTemplateError line (file named) for any failure, within the render budget."""
    from ssdmoe_tui.prompting import chat_format

    tok = _tokenizer()
    tok._tokenizer.chat_template = data.decode("utf-8", "replace")
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "a"}, {"role": "user", "content": "hi"}]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    steps, chat_format.RENDER_STEPS = chat_format.RENDER_STEPS, _TEMPLATE_STEPS
    try:
        _expect_clean(
            lambda: chat_format.render(tok, messages, add_generation_prompt=True, tools=tools),
            "chat template",
        )
    finally:
        chat_format.RENDER_STEPS = steps


_INDEX_MODEL: dict[str, Path] = {}


def _index_cache(data: bytes, work: Path) -> None:
    """An expert-index cache entry (`@KEY@` in the seed is replaced by the folder's real
    key, so a mutated entry that parses is taken as current): load_index returns an
    index or raises one line; an unreadable entry is stale (rebuilt), never a crash."""
    import os

    from ssdmoe_tui.engine.experts.index import load_index
    from ssdmoe_tui.paths import cache_dir

    if "model" not in _INDEX_MODEL:  # one model folder and home for the whole session
        home = Path(tempfile.mkdtemp(prefix="ssdmoe-fuzz-index-"))
        atexit.register(shutil.rmtree, home, ignore_errors=True)  # gone with the process
        folder = home / "model"
        folder.mkdir()
        seed = sorted((SEEDS / "safetensors").glob("*.json"))[0].read_bytes()
        _write_safetensors(folder / "model.safetensors", b"\0" + seed)
        os.environ["SSDMOE_HOME"] = str(home / "home")
        load_index(folder)
        (entry,) = (cache_dir() / "index").glob("*.json")
        _INDEX_MODEL.update(model=folder, entry=entry)
    os.environ["SSDMOE_HOME"] = str(_INDEX_MODEL["model"].parent / "home")
    entry = _INDEX_MODEL["entry"]
    entry.write_bytes(data.replace(b"@KEY@", entry.stem.encode()))
    _expect_clean(lambda: load_index(_INDEX_MODEL["model"]), "index cache")


def _attachment(data: bytes, work: Path) -> None:
    """An `@file` attachment (the one reader of user files): attached or one line; an
    attached file's block, stored and shown again, gives back exactly the typed text
    and that file (no marker inside a file or a name forges or loses a chip)."""
    from ssdmoe_tui.chat.attachments import (
        Attachment,
        AttachmentError,
        attachments_of,
        split_attached,
        with_attachments,
    )

    (work / "notes.txt").write_bytes(data)
    try:
        files = attachments_of("look at @notes.txt", work)
    except AttachmentError as e:
        _check_message(str(e), "attachment reader")
        return
    text = data.decode("utf-8", "replace")
    quoted = [Attachment('a "quoted" & <odd> name', text), *files]
    # What is typed goes to the model as typed (markers typed by hand are the user's);
    # what a file or a name holds must never change the chips.
    typed = "look at @notes.txt" if "attached" in text else text.replace("\x00", "")
    message = with_attachments(typed, quoted)
    got = split_attached(message)
    if got != (typed, quoted):
        raise Finding(f"attachment markers: {message[:200]!r} shows as {got!r:.200}")


@dataclass(frozen=True)
class _Info:
    fingerprint: str = "fp"
    num_layers: int = 4
    num_experts: int = 16


def _experts(data: bytes, work: Path) -> None:
    """A warm-resume `experts.json`: a working set within the model's shape, or nothing
    and one line."""
    from ssdmoe_tui.sessions.expert_set import load_working_set

    (work / "experts.json").write_bytes(data)
    got = load_working_set(work, _Info())
    if got.warning:
        _check_message(got.warning, "warm-resume loader")
    if got.working_set is not None:
        version = json.loads(data).get("version")
        if type(version) is not int:  # `true == 1`: was taken as version 1
            raise Finding(f"warm-resume loader took version {version!r}")
    for layer, ids in got.working_set or ():
        ok = type(layer) is int and 0 <= layer < _Info.num_layers
        if not ok or not all(type(e) is int and 0 <= e < _Info.num_experts for e in ids):
            raise Finding(f"warm-resume loader took layer {layer!r}: {ids!r:.100}")


def _server_json(data: bytes, work: Path) -> None:
    """What an attached server sends (chat/wire.py): the model card, /v1/stats, a chunk,
    an error body. Each parser returns checked values or raises BadReply, one line."""
    from ssdmoe_tui.chat import wire
    from ssdmoe_tui.engine.run import protocol as P

    def clean(call: Callable[[], object], what: str) -> object:
        try:
            return call()
        except wire.BadReply as e:
            _check_message(str(e), what)
            return None

    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        parsed = None
    clean(lambda: wire.chunk(data), "chunk parser")
    _check_message(wire.error_message(data), "error body")
    if parsed is None:
        return
    info = clean(lambda: wire.model_info("http://127.0.0.1:1", parsed, parsed), "model card")
    if info is not None and not all(
        type(getattr(info, f)) is int and getattr(info, f) >= 0
        for f in ("num_layers", "num_experts", "trained_k", "k", "max_context")
    ):
        raise Finding(f"model card: {info!r:.200}")
    sample = clean(lambda: wire.stats_sample(parsed), "stats parser")
    if isinstance(sample, P.StatsSample):
        for name, v in vars(sample).items():
            if v is not None and (type(v) not in (int, float) or v != v):
                raise Finding(f"stats parser: {name} = {v!r}")


def _terminal_text(data: bytes, work: Path) -> None:
    """The terminal-text sanitizer (`terminal_text.visible`), over the input read as
    UTF-8 and as Latin-1 (every C1 code point): no control character but newline and tab
    is left, every other character is kept in order, a control one is its escape, and it
    is idempotent; `errors.printable` (one-line messages) leaves no unprintable one."""
    from ssdmoe_tui.errors import printable
    from ssdmoe_tui.terminal_text import is_control, visible

    for text in (data.decode("utf-8", "replace"), data.decode("latin-1")):
        out = visible(text)
        if any(is_control(c) for c in out):
            raise Finding(f"visible left a control character: {out[:100]!r}")
        parts = re.split("([\x00-\x08\x0b-\x1f\x7f-\x9f])", text.replace("\r\n", "\n"))
        expected = "".join(ascii(p)[1:-1] if i % 2 else p for i, p in enumerate(parts))
        if out != expected:
            raise Finding(f"visible changed more than the control characters: {text[:60]!r}")
        if visible(out) != out:
            raise Finding(f"visible is not idempotent on {text[:60]!r}")
        line = printable(text, 1 << 20)
        if not all(c.isprintable() for c in line):
            raise Finding(f"printable left an unprintable character: {line[:100]!r}")


def _keys_of(value: object) -> set[str]:
    """Every table key anywhere in a parsed TOML document."""
    if isinstance(value, dict):
        return set(value).union(*(_keys_of(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_keys_of(v) for v in value))
    return set()


def _secrets_of(data: object) -> set[str]:
    """The values a line about `[mcp_servers]` must never quote: every string under an
    `env` or `http_headers` table, and a URL's query (long enough to be told apart)."""
    out: set[str] = set()
    tables = data.get("mcp_servers") if isinstance(data, dict) else None
    for server in tables.values() if isinstance(tables, dict) else ():
        if not isinstance(server, dict):
            continue
        for key in ("env", "http_headers"):
            held = server.get(key)
            if isinstance(held, dict):
                out |= {v for v in held.values() if isinstance(v, str)}
        url = server.get("url")
        if isinstance(url, str) and "?" in url:
            out.add(url.split("?", 1)[1])
    return {v for v in out if len(v) >= 8}


def _mcp_config(data: bytes, work: Path) -> None:
    """The MCP config reader (`mcp_config.read_mcp_servers`, through `load_config` as the
    app reads config.toml, and on the parsed table itself): typed servers, or one line
    per problem that quotes no `env` or header value, no URL query; never a traceback."""
    import sys

    from ssdmoe_tui.config import load_config
    from ssdmoe_tui.mcp_config import McpServer, read_mcp_servers

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    (work / "config.toml").write_bytes(data)
    loaded = load_config(work / "config.toml")
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not TOML: load_config said so
        parsed = None
    secrets = _secrets_of(parsed) - _keys_of(parsed)  # a key's name may be quoted
    lines = list(loaded.warnings)
    if parsed is not None and "mcp_servers" in parsed:
        try:
            servers, problems = read_mcp_servers(parsed["mcp_servers"])
        except ValueError as e:  # only when mcp_servers is no table at all
            servers, problems = {}, [str(e)]
        lines += problems
        if servers != loaded.config.mcp_servers:
            raise Finding("read_mcp_servers and load_config disagree")
    for line in lines:
        _check_message(line, "MCP config reader")
        leaked = next((v for v in secrets if v in line), None)
        if leaked is not None:
            raise Finding(f"a line quotes a secret value: {line[:200]!r}")
    env = {"SEARCH_TOKEN": "t", "OTHER_TOKEN": "o"}
    for server in loaded.config.mcp_servers.values():
        if not isinstance(server, McpServer) or not 0 < server.timeout <= 86_400:
            raise Finding(f"MCP config reader kept {server!r:.200}")
        if not all(type(a) is str for a in server.args) or bool(server.url) == bool(server.command):
            raise Finding(f"MCP config reader kept {server!r:.200}")
        server.environment(env)
        try:
            server.headers(env)
        except ValueError as e:  # a variable that is not set: named
            _check_message(str(e), "MCP server headers")


_CALL_FORMATS = {
    "json_tools": ["<tool_call>\n{\"name\": \"f\", \"arguments\": @ARGS@}\n</tool_call>",
                   "<tool_call>\n@ARGS@\n</tool_call>"],
    "qwen3_coder": ["<tool_call>\n<function=f>\n<parameter=city>\n@ARGS@\n</parameter>\n"
                    "</function>\n</tool_call>"],
    "glm47": ["<tool_call>f\n<arg_key>city</arg_key>\n<arg_value>@ARGS@</arg_value>\n</tool_call>"],
    "deepseek": ["<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>@ARGS@"
                 "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"],
    "harmony": ["<|channel|>commentary to=functions.f <|constrain|>json<|message|>@ARGS@<|call|>"],
}  # fmt: skip
_CALL_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}}}}}]  # fmt: skip


def _tool_call(data: bytes, work: Path) -> None:
    """The tool-call argument parser (`tools.calls.parse_arguments`, what the tool loop
    runs a model's or an attached server's call with): a strict JSON object, or one
    BadArguments line; and the input as a call's arguments in each reply format the app
    reads, through the reply filter (a call or text, never an exception) and the loop
    (an error result with a one-line note, never a call sent with bad arguments)."""
    from ssdmoe_tui.prompting.output import Call, OutputFilter, named_format
    from ssdmoe_tui.prompting.reply_format import DEEPSEEK
    from ssdmoe_tui.tools.calls import BadArguments, ToolCall
    from ssdmoe_tui.tools.loop import ToolLoop
    from ssdmoe_tui.tools.servers import ToolServers

    def checked(call: ToolCall) -> None:
        try:
            value = call.args()
        except BadArguments as e:
            _check_message(str(e), "tool-call arguments")
            result = ToolLoop(ToolServers({})).run(call)
            if not result.is_error or not result.text.startswith("Error: "):
                raise Finding(f"bad arguments ran: {result!r:.200}") from None
            _check_message(result.note, "tool loop")
            return
        if not isinstance(value, dict):
            raise Finding(f"arguments parsed to {type(value).__name__}")
        try:
            json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (ValueError, UnicodeEncodeError) as e:
            raise Finding(f"arguments a server cannot be sent: {e}") from None

    text = data.decode("utf-8", "replace")
    checked(ToolCall("call_1", "f", text))
    cut = len(text) // 2
    for name, layouts in _CALL_FORMATS.items():
        fmt = DEEPSEEK if name == "deepseek" else None if name == "harmony" else named_format(name)
        for layout in layouts:
            reply = layout.replace("@ARGS@", text)
            filt = OutputFilter((), fmt, _CALL_TOOLS, harmony=name == "harmony")
            pieces = filt.feed(reply[:cut]) + filt.feed(reply[cut:]) + filt.finish()
            for piece in pieces:
                if isinstance(piece, Call):
                    checked(ToolCall(piece.call.id, piece.call.name, piece.call.arguments))


_FRAMED = {"safetensors", "kv_checkpoint"}
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("safetensors", _safetensors, "*.json"),
        Target("kv_checkpoint", _kv_checkpoint, "*.json"),
        Target("trace", _trace, "*"),
        Target("conversation", _conversation, "*.json"),
        Target("config", _config, "*.toml"),
        Target("chat_template", _chat_template, "*.jinja"),
        Target("index_cache", _index_cache, "*.json"),
        Target("attachment", _attachment, "*"),
        Target("experts", _experts, "*.json"),
        Target("server_json", _server_json, "*.json"),
        Target("terminal_text", _terminal_text, "*"),
        Target("mcp_config", _mcp_config, "*.toml"),
        Target("tool_call", _tool_call, "*.json"),
    )
}


def run_one(target: Target, data: bytes, work: Path | None = None) -> None:
    """Run `target` on `data`; raises Finding (or the reader's stray exception)."""
    if work is not None:
        target.run(data, work)
        return
    with tempfile.TemporaryDirectory(prefix="ssdmoe-fuzz-") as tmp:
        target.run(data, Path(tmp))


# --------------------------------------------------------------------------- mutator

INTERESTING_NUMBERS = [
    b"0", b"-1", b"1", b"1e400", b"-1e400", b"NaN", b"Infinity", b"1.5", b"2.5e-30",
    b"9223372036854775807", b"9223372036854775808", b"18446744073709551616",
    b"-9223372036854775809", b"4294967296", b"1000000000", b"1180591620717411303424",
]  # fmt: skip
INTERESTING_VALUES = [
    b'"x"', b'""', b"[]", b"{}", b"null", b"true", b"false", b'["U32"]', b'{"a":1}',
    b'"\\u0000"', b'"\\ud800"', b"[-1, 9223372036854775808]", b"[0, 0]", b"[1e400]",
]  # fmt: skip
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def mutate(data: bytes, rng: random.Random, pool: list[bytes], max_size: int = 1 << 16) -> bytes:
    """One to four stacked mutations, byte-level and token-aware (numbers, strings)."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(12)
        n = len(out)
        if op == 0 and n:  # flip bits
            i = rng.randrange(n)
            out[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # interesting byte
            out[rng.randrange(n)] = rng.choice([0, 0xFF, 0x7F, 0x80, 0x22, 0x5B, 0x0A, 0x2C])
        elif op == 2:  # insert random bytes
            i = rng.randint(0, n)
            out[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 3 and n > 1:  # delete a range
            i = rng.randrange(n)
            del out[i : i + rng.randint(1, max(1, n // 8))]
        elif op == 4 and n > 1:  # duplicate a range
            i = rng.randrange(n)
            j = min(n, i + rng.randint(1, 64))
            k = rng.randint(0, n)
            out[k:k] = out[i:j]
        elif op == 5 and n:  # truncate
            del out[rng.randrange(n) :]
        elif op in (6, 7):  # replace a number with an interesting one
            spans = [m.span() for m in _NUMBER.finditer(out)]
            if spans:
                a, b = rng.choice(spans)
                out[a:b] = rng.choice(INTERESTING_NUMBERS)
        elif op == 8:  # replace a string or number with an interesting value
            spans = [m.span() for m in _STRING.finditer(out)] + [
                m.span() for m in _NUMBER.finditer(out)
            ]
            if spans:
                a, b = rng.choice(spans)
                out[a:b] = rng.choice(INTERESTING_VALUES + INTERESTING_NUMBERS)
        elif op == 9:  # deep nesting
            depth = rng.choice([100, 1000, 100_000])
            i = rng.randint(0, n)
            out[i:i] = b"[" * depth + b"]" * depth * rng.randint(0, 1)
        elif op == 10 and pool:  # splice with another input
            other = rng.choice(pool)
            if other:
                i, j = rng.randint(0, n), rng.randrange(len(other))
                out[i:] = other[j:]
        elif op == 11 and n:  # not UTF-8
            i = rng.randrange(n)
            out[i:i] = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00"])
    return bytes(out[:max_size])
