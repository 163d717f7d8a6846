"""User settings: `config.toml` in the platform config folder.

Read once at start-up; CLI flags override it. A file that does not parse gives one
warning line and the defaults, and is then never written over: the user's text is
theirs to fix. Changes made from the app (theme) are written back by editing just
that key's line, so comments and unknown keys survive.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ssdmoe_tui import paths
from ssdmoe_tui.atomic import atomic_write_text
from ssdmoe_tui.errors import printable
from ssdmoe_tui.mcp_config import McpServer, read_mcp_servers
from ssdmoe_tui.options import CacheBudget, SamplingOptions, parse_temp, parse_top_p
from ssdmoe_tui.user_files import CONFIG_TOML_MAX, read_regular, read_regular_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_THEME = "ssdmoe-dark"


# ---------------------------------------------------------------- value checks
# Each takes what TOML (or the app) gave and returns the typed value, or raises
# ValueError with what was expected (the caller names the file and key). A table's check
# (keymap, mcp_servers) returns `Kept`: its good entries, and one line per entry it left
# out, so one bad entry costs only itself.


@dataclass(frozen=True)
class Kept:
    """What a table's check kept, and one line per entry it dropped or key it ignored
    (the loader names the file before each)."""

    value: Any
    problems: tuple[str, ...] = ()


# A key named like this holds a secret: its value is never quoted in a warning.
_SECRET = re.compile(
    r"(token(?!s)|secret|passw|api_?key|(^|[_.-])key($|[_.-])|auth|credential)", re.I
)


def shown_value(key: str, value: object) -> str | None:
    """`value` as a warning may quote it (one short line), or None when it must not be
    quoted: a table (it may hold `env` values, headers), anything given as mcp_servers,
    or a key named like a secret."""
    if isinstance(value, dict) or key == "mcp_servers" or _SECRET.search(key):
        return None
    return printable(repr(value), 60)


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


K_MAX = 1 << 16  # as a conversation's saved K (sessions.store)
MAX_TOKENS_MAX = 1 << 24


def _positive_int(value: object, hi: int = MAX_TOKENS_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
        raise ValueError(f"expected a whole number in 1..{hi:,}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError("expected true or false")
    return value


def _speculate(value: object) -> str:
    from ssdmoe_tui.errors import BadValueError
    from ssdmoe_tui.options import SPECULATE_MODES, parse_speculate

    if not isinstance(value, str):
        raise ValueError(f"expected one of {', '.join(SPECULATE_MODES)}")
    try:
        return parse_speculate(value).mode
    except BadValueError:
        raise ValueError(f"expected one of {', '.join(SPECULATE_MODES)}") from None


def _optional_k(value: object) -> int | None:
    return None if value is None else _positive_int(value, K_MAX)


def _cache_size(value: object) -> str:
    try:
        CacheBudget.parse(_text(value))
    except ValueError:
        raise ValueError('expected "auto" or a size such as 512M or 4G') from None
    return value  # type: ignore[return-value]


def _number(parse: Callable[[float], float]) -> Callable[[object], float]:
    """A TOML number checked by the engine's own parser (one rule for flags and file)."""

    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        return parse(value)

    return check


# One key as Textual names it: modifiers, then a key name (`ctrl+shift+f5`, `escape`,
# `question_mark`) or one printable character (`?`).
_KEY = re.compile(
    r"(?:(?:ctrl|shift|alt|meta|super|hyper)\+)*(?:[a-z][a-z0-9_]{0,30}|[0-9]|[^\s,])"
)
MAX_KEYMAP = 200  # entries: there are fewer bindings than this


def _keymap(value: object) -> Kept:
    """The `[keymap]` table: each entry that is no key list is one line and left out;
    the others are kept."""
    if not isinstance(value, dict):
        raise ValueError('expected id = "keys" pairs')
    if len(value) > MAX_KEYMAP:
        raise ValueError(f"{len(value):,} entries, more than {MAX_KEYMAP}")
    kept, problems = {}, []
    for k, v in value.items():
        nested = _keymap_entry_problem(k, v)
        if nested is not None:
            problems.append(nested)
            continue
        keys = [p.strip() for p in v.split(",")] if isinstance(v, str) and len(v) <= 200 else []
        bad = next((p for p in keys if not _KEY.fullmatch(p)), None)
        if len(k) <= 100 and keys and bad is None:
            kept[k] = v
            continue
        shown = printable(bad if bad is not None else str(v), 40)
        problems.append(
            f"[keymap] {printable(k, 40)!r} = {shown!r} is not a key list "
            '(e.g. "ctrl+s", "f5,escape"); that entry is ignored'
        )
    return Kept(kept, tuple(problems))
    # Which ids exist and which keys clash needs the app's bindings: `keymap_problems`,
    # run by `load_config` when the app gives them (`Bindings`).


def _top_level_keys() -> set[str]:
    return {f.name for f in fields(Config)}


def _keymap_entry_problem(k: object, v: object) -> str | None:
    """Why a [keymap] entry that is no key list is there, when TOML's nesting explains
    it: an unquoted dotted id (`app.stop = "f9"` is the table app = {stop = "f9"}), or a
    top-level key written below the [keymap] header (TOML puts it into that table)."""
    name = printable(str(k), 40)
    if isinstance(v, dict):
        inner = next(iter(v), "")
        dotted = printable(f"{k}.{inner}", 60)
        return (
            f'[keymap] {dotted}: write the id in quotes, as in "{dotted}" = "f9" '
            "(unquoted, TOML reads its dots as tables); that entry is ignored"
        )
    if k in _top_level_keys() and k not in ("keymap", "mcp_servers"):
        return (
            f"[keymap] {name!r} is a top-level key, not a binding id: move it above the "
            "first [table] (TOML puts every key below [keymap] into that table); that "
            "entry is ignored"
        )
    return None


@dataclass(frozen=True)
class Binding:
    """One key binding as the keymap check needs it (the app's Textual `Binding`s,
    given by `ui.actions.keys.app_bindings`: this layer imports no Textual)."""

    id: str  # "" when it cannot be remapped
    action: str
    keys: str  # its default keys, comma-separated


@dataclass(frozen=True)
class Bindings:
    """What the app binds, by scope: bindings that answer in the same place (one screen
    or widget), where two on one key shadow each other."""

    scopes: tuple[tuple[Binding, ...], ...]

    def ids(self) -> set[str]:
        return {b.id for scope in self.scopes for b in scope if b.id}


def keymap_problems(bindings: Bindings, keymap: dict[str, str]) -> list[str]:
    """One line per [keymap] problem only the app's bindings show (the loader names the
    file): ids no binding has, and a remapped key another binding of its scope answers."""
    out = []
    unknown = sorted(set(keymap) - bindings.ids())
    if unknown:
        shown = ", ".join(repr(printable(u, 40)) for u in unknown[:5])
        more = " ..." if len(unknown) > 5 else ""
        out.append(f"[keymap]: unknown binding id(s) {shown}{more} ignored (F1 lists them)")
    for scope in bindings.scopes:
        owner: dict[str, str] = {}
        for b in scope:
            name = b.id or b.action
            keys = keymap.get(b.id, b.keys) if b.id else b.keys
            for key in (k.strip() for k in keys.split(",") if k.strip()):
                first = owner.setdefault(key, name)
                if first != name and (first in keymap or name in keymap):
                    out.append(
                        f"[keymap]: {first} and {name} are both on {key!r} "
                        "(one shadows the other; F1 shows the keys)"
                    )
    return out


def _mcp_servers(value: object) -> Kept:
    servers, problems = read_mcp_servers(value)
    return Kept(servers, tuple(problems))


def setting(default: Any, check: Callable[[object], Any], example: str, doc: str) -> Any:
    """A config key: its default, its check, and the commented template line."""
    factory = {"default_factory": dict} if isinstance(default, dict) else {"default": default}
    return field(metadata={"check": check, "example": example, "doc": doc}, **factory)


@dataclass
class Config:
    """Every key of config.toml, in template order. The template, the checks and the
    chat settings (`ChatSettings` adds the command line's own fields) derive from it."""

    model: str = setting(
        "", _text, '"mlx-community/Qwen3-30B-A3B-4bit"', "folder or repo id; empty: the demo"
    )
    k: int | None = setting(None, _optional_k, "4", "experts per token; unset: trained K")
    expert_cache: str = setting("auto", _cache_size, '"auto"', '"auto", "512M", "4G", ...')
    max_tokens: int = setting(1024, _positive_int, "1024", "longest reply, in tokens")
    temperature: float = setting(0.0, _number(parse_temp), "0.7", "0: greedy (the same reply)")
    top_p: float = setting(0.0, _number(parse_top_p), "0.95", "nucleus sampling; 0: off")
    system_prompt: str = setting("", _text, '"You are a helpful assistant."', "")
    thinking: bool = setting(
        True, _bool, "false", "models that think (Qwen3...): false answers at once"
    )
    speculate: str = setting(
        "off", _speculate, '"auto"', "speculative decoding: off, auto, ngram, mtp (F9 per chat)"
    )
    theme: str = setting(DEFAULT_THEME, _text, f'"{DEFAULT_THEME}"', "or ssdmoe-light, ...")
    keymap: dict[str, str] = setting({}, _keymap, "", "binding id = keys; F1 lists the ids")
    max_tool_rounds: int = setting(
        8, lambda v: _positive_int(v, 100), "8", "tool calls the model may chain in one reply"
    )
    mcp_servers: dict[str, McpServer] = setting(
        {}, _mcp_servers, "", "MCP servers whose tools the model may call (F10 lists them)"
    )


def template() -> str:
    """The commented config.toml written on first run: every key, none set."""
    lines = ["# ssdmoe settings. Command-line flags override these. Uncomment to change."]
    for f in fields(Config):
        if f.name in ("keymap", "mcp_servers"):
            continue
        line = f"# {f.name} = {f.metadata['example']}"
        doc = f.metadata["doc"]
        lines.append(f"{line:<52} # {doc}" if doc else line)
    lines += [
        "",
        "# [keymap]                                         # " + fields_doc("keymap"),
        '# "app.stop" = "escape"',
        '# "app.k_up" = "ctrl+up,alt+up"',
        "",
        "# [mcp_servers.files]                              # " + fields_doc("mcp_servers"),
        '# command = "npx"                                  # stdio; or url = "http://host/mcp"',
        '# args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]',
        '# enabled_tools = ["read_file"]                    # optional allow-list; timeout = 60',
    ]
    return "\n".join(lines) + "\n"


def fields_doc(name: str) -> str:
    return next(f.metadata["doc"] for f in fields(Config) if f.name == name)


def check_value(name: str, value: object) -> Any:
    """The typed value of one key, or ValueError saying what was expected."""
    for f in fields(Config):
        if f.name == name:
            checked = f.metadata["check"](value)
            return checked.value if isinstance(checked, Kept) else checked
    raise KeyError(name)


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    path: Path
    warnings: tuple[str, ...] = ()
    writable: bool = True  # False: the file exists but did not parse; never write it
    # Which key each of `warnings` is about (same order; "" for the file as a whole or a
    # key nobody knows): F10 says why no [mcp_servers] table could be used.
    keys: tuple[str, ...] = ()

    def warnings_about(self, key: str) -> tuple[str, ...]:
        return tuple(w for w, k in zip(self.warnings, self.keys, strict=False) if k == key)


@dataclass
class GenSettings:
    """How one conversation generates: its own copy of these config keys, editable in
    the app, saved with the conversation and used again when it is resumed."""

    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 0.0
    max_tokens: int = 1024
    k: int | None = None  # None: the model's trained K
    thinking: bool = True  # the template's enable_thinking (templates that think)
    max_tool_rounds: int = 8  # tool calls answered in one reply before the loop stops
    speculate: str = "off"  # speculative decoding (engine/spec): off, auto, ngram, mtp

    @classmethod
    def from_config(cls, config: Config) -> GenSettings:
        return cls(**{f.name: getattr(config, f.name) for f in fields(cls)})

    @classmethod
    def from_saved(cls, saved: dict[str, Any], defaults: GenSettings) -> GenSettings:
        """A conversation's saved settings, each checked like the config's (a bad or
        missing one falls back to `defaults`)."""
        values = {}
        for f in fields(cls):
            if f.name in saved:
                try:
                    values[f.name] = check_value(f.name, saved[f.name])
                except ValueError:
                    pass
        return replace(defaults, **values)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def sampling(self) -> SamplingOptions:
        """How a reply of this conversation is sampled (what its Generate carries)."""
        return SamplingOptions(max_tokens=self.max_tokens, temp=self.temperature, top_p=self.top_p)


@dataclass
class ChatSettings(Config):
    """What the app starts from: config.toml merged with the command line."""

    resume: str | None = None
    attach: str | None = None  # `--attach URL`: chat through that `ssdmoe serve`
    config: LoadedConfig | None = None  # where to remember the theme; None: never write
    warnings: tuple[str, ...] = ()


def config_path() -> Path:
    return paths.config_dir() / "config.toml"


def ensure_config_file(path: Path | None = None) -> str | None:
    """Write the commented template where no config exists yet (never over one);
    returns a one-line reason when it could not be written."""
    path = path or config_path()
    if path.exists():
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, template())
    except OSError as e:
        return f"could not write {path}: {e.strerror or e}"
    return None


def load_config(path: Path | None = None, bindings: Bindings | None = None) -> LoadedConfig:
    """Read the config; never raises for anything the user wrote. `bindings`: what the
    app binds, so that a [keymap] id no binding has, or a key two bindings of one scope
    would share, is said here, once, with the file (the app only applies the keymap)."""
    path = path or config_path()
    try:
        raw = read_regular(path, CONFIG_TOML_MAX)
    except FileNotFoundError:
        return LoadedConfig(Config(), path)
    except OSError as e:
        reason = e.strerror or str(e)
        return LoadedConfig(
            Config(), path, (f"{path}: unreadable ({reason}); using defaults",), False
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = _where(raw, e.start)
        return LoadedConfig(
            Config(),
            path,
            (f"{path}: not UTF-8 ({where}: byte 0x{raw[e.start]:02x}); save it as UTF-8; "
             "using defaults",),
            False,
        )  # fmt: skip
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:  # RecursionError: nested too deeply
        return LoadedConfig(Config(), path, (f"{path}: bad TOML ({e}); using defaults",), False)
    values: dict[str, object] = {}
    warnings: list[tuple[str, str]] = []  # (the line, the key it is about)
    known = {f.name for f in fields(Config)}
    for key in data:
        if key not in known:  # kept in the file (a newer version's key?) and ignored
            shown = key if len(key) <= 40 else key[:37] + "..."
            line = f"{path}: unknown key {shown!r} ignored (known: {', '.join(sorted(known))})"
            warnings.append((line, ""))
    for f in fields(Config):
        if f.name not in data:
            continue
        value = data[f.name]
        try:
            checked = f.metadata["check"](value)
        except ValueError as e:
            warnings.append((f"{path}: {_invalid(f, value, e)}", f.name))
            continue
        if isinstance(checked, Kept):
            warnings += [(f"{path}: {line}", f.name) for line in checked.problems]
            checked = checked.value
        values[f.name] = checked
    if bindings is not None and values.get("keymap"):
        problems = keymap_problems(bindings, values["keymap"])
        warnings += [(f"{path} {line}", "keymap") for line in problems]
    lines, keys = tuple(w for w, _ in warnings), tuple(k for _, k in warnings)
    return LoadedConfig(replace(Config(), **values), path, lines, keys=keys)


_KINDS = {str: "a string", bool: "true or false", int: "a number", float: "a number",
          list: "a list"}  # fmt: skip


def _invalid(f: Any, value: object, e: ValueError) -> str:
    """Why `value` is no value of key `f` (the file is named by the caller): a table
    where a value belongs, or a value where a table does, is said as such (TOML's
    nesting: a `[model]` header, or `keymap = "..."`); else the value (when it may be
    quoted) and what was expected."""
    table = isinstance(f.default_factory(), dict) if f.default_factory is not MISSING else False
    if isinstance(value, dict) and not table:
        return (
            f"{f.name} takes a value, not a table (a [{f.name}] header or a dotted "
            f"{f.name}.x = ... makes one): {e}, e.g. {f.name} = {f.metadata['example']}"
        )
    if table and not isinstance(value, dict):
        kind = _KINDS.get(type(value), type(value).__name__)
        return f"{f.name} is a table, not {kind}: write [{f.name}] and its entries below it"
    shown = shown_value(f.name, value)  # cut: the warning stays one short line
    named = f.name if shown is None else f"{f.name} = {shown}"
    return f"{named} is not valid ({e})"


_KEY_PART = r"""(?:[A-Za-z0-9_-]+|"[^"\n]*"|'[^'\n]*')"""
_KEY_LINE = re.compile(rf"^\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*=")
_HEADER_LINE = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]")


def _where(raw: bytes, offset: int) -> str:
    """Where byte `offset` of a TOML file is, as a user finds it: "line N, key K" (K
    with its table: `keymap."app.stop"`), or "line N" when no key starts that line."""
    lines = raw.split(b"\n")
    at = raw.count(b"\n", 0, offset)
    text = lines[at].decode("utf-8", "replace")
    key = _KEY_LINE.match(text)
    if key is None:
        return f"line {at + 1:,}"
    name = key.group(1)
    for prior in reversed(lines[:at]):
        header = _HEADER_LINE.match(prior.decode("utf-8", "replace"))
        if header is not None:
            name = f"{header.group(1)}.{name}"
            break
    return f"line {at + 1:,}, key {printable(name, 60)}"


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _toml_value(value: str | int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"unsupported config value {value!r}")
    if isinstance(value, int):
        return str(value)
    return '"' + "".join(_TOML_ESCAPES.get(c, c) for c in value) + '"'


_TABLE = re.compile(r"^\s*\[")
# A table header the template (or the user) left commented out: uncommented later, it
# would take every key below it, so a top-level key must never be written under it.
_COMMENTED_TABLE = re.compile(r"^\s*#\s*\[\[?[\w.\"' -]+\]\]?(\s|$)")


def place_top_level(lines: list[str], key: str, line: str) -> list[str]:
    """`lines` with `line` as the top-level `key`: in place where the key already sits
    above every table, commented-out ones included; else above the first of them (a
    line an older version appended under the commented `# [keymap]` moves up)."""
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    first_table = next((i for i, s in enumerate(lines) if _TABLE.match(s)), len(lines))
    first_any = next(
        (i for i, s in enumerate(lines[:first_table]) if _COMMENTED_TABLE.match(s)), first_table
    )
    found = [i for i in range(first_table) if pattern.match(lines[i])]
    if found and found[0] < first_any:
        lines = [s for i, s in enumerate(lines) if i not in found[1:]]
        lines[found[0]] = line
        return lines
    lines = [s for i, s in enumerate(lines) if i not in found]
    at = first_any
    while at > 0 and not lines[at - 1].strip():  # above the blank line before the table
        at -= 1
    return [*lines[:at], line, *lines[at:]]


def set_config_value(loaded: LoadedConfig, key: str, value: str | int) -> str | None:
    """Write one top-level `key = value`, keeping the rest of the file as it is.

    Returns None on success, or a one-line reason it was not written (a file that
    did not parse is never touched).
    """
    path = loaded.path
    if not loaded.writable:
        return f"not saved: fix {path} first"
    line = f"{key} = {_toml_value(value)}"
    try:
        text = read_regular_text(path, CONFIG_TOML_MAX)
    except FileNotFoundError:
        text = template()
    except (OSError, UnicodeDecodeError) as e:
        return f"not saved: {path}: {e.strerror or e}"
    lines = place_top_level(text.splitlines(), key, line)
    new_text = "\n".join(lines) + "\n"
    try:
        if tomllib.loads(new_text).get(key) != value:
            return f"not saved: could not place {key} in {path}"
    except tomllib.TOMLDecodeError:
        return f"not saved: {path} would not parse after the edit"
    try:
        atomic_write_text(path, new_text)
    except OSError as e:
        return f"not saved: {path}: {e.strerror or e}"
    return None
