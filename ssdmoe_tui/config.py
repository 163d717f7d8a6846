"""User settings: `config.toml` in the platform config folder.

Read once at start-up; CLI flags override it. A file that does not parse gives one
warning line and the defaults, and is then never written over: the user's text is
theirs to fix. Changes made from the app (theme) are written back by editing just
that key's line, so comments and unknown keys survive.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from ssdmoe_tui import paths
from ssdmoe_tui.atomic import atomic_write_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_THEME = "ssdmoe-dark"

TEMPLATE = """\
# ssdmoe settings. Command-line flags override these.
# model = "/path/to/checkpoint"   # empty: the embedded demo model
# k = 4                            # experts per token; unset: the model's trained K
# expert_cache = "auto"            # "auto", "512M", "4G", ...
# max_tokens = 1024
# system_prompt = "You are a helpful assistant."
theme = "{theme}"

# [keymap]                         # binding id = "keys"; F1 in the app lists the ids
# "app.stop" = "escape"
# "app.k_up" = "ctrl+up,f4"
"""


@dataclass(frozen=True)
class Config:
    model: str = ""  # "" = the embedded demo model
    k: int | None = None  # None = the model's trained K
    expert_cache: str = "auto"
    theme: str = DEFAULT_THEME
    max_tokens: int = 1024
    system_prompt: str = ""
    keymap: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadedConfig:
    config: Config
    path: Path
    warnings: tuple[str, ...] = ()
    writable: bool = True  # False: the file exists but did not parse; never write it


def config_path() -> Path:
    return paths.config_dir() / "config.toml"


def _check(name: str, value: object, path: Path) -> tuple[object | None, str | None]:
    """Validate one key; returns (value, None) or (None, one-line warning)."""
    bad = f"{path}: {name} = {value!r} is not valid"
    if name in ("model", "expert_cache", "theme", "system_prompt"):
        return (value, None) if isinstance(value, str) else (None, f"{bad} (expected a string)")
    if name in ("k", "max_tokens"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return (value, None) if ok else (None, f"{bad} (expected a positive integer)")
    if name == "keymap":
        ok = isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
        return (dict(value), None) if ok else (None, f'{bad} (expected id = "keys" pairs)')
    return None, None  # unknown keys are kept in the file and ignored


def load_config(path: Path | None = None) -> LoadedConfig:
    """Read the config; never raises for anything the user wrote."""
    path = path or config_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return LoadedConfig(Config(), path)
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or type(e).__name__
        return LoadedConfig(
            Config(), path, (f"{path}: unreadable ({reason}); using defaults",), False
        )
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as e:  # RecursionError: nested too deeply
        return LoadedConfig(Config(), path, (f"{path}: bad TOML ({e}); using defaults",), False)
    values: dict[str, object] = {}
    warnings: list[str] = []
    names = {f.name for f in fields(Config)}
    for name, value in data.items():
        if name not in names:
            continue
        checked, warning = _check(name, value, path)
        if warning:
            warnings.append(warning)
        else:
            values[name] = checked
    return LoadedConfig(replace(Config(), **values), path, tuple(warnings))


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _toml_value(value: str | int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"unsupported config value {value!r}")
    if isinstance(value, int):
        return str(value)
    return '"' + "".join(_TOML_ESCAPES.get(c, c) for c in value) + '"'


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
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = TEMPLATE.format(theme=DEFAULT_THEME)
    except OSError as e:
        return f"not saved: {path}: {e.strerror or e}"
    lines = text.splitlines()
    pattern = re.compile(rf"^\s*{re.escape(key)}\s*=")
    first_table = next((i for i, s in enumerate(lines) if s.lstrip().startswith("[")), len(lines))
    for i in range(first_table):
        if pattern.match(lines[i]):
            lines[i] = line
            break
    else:
        lines.insert(first_table, line)
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
