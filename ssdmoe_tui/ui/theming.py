"""Themes as TOML files: the ones shipped in `ssdmoe_tui/ui/themes/`, plus the user's
own in `<config dir>/themes/`. A bad file gives a warning line and is skipped."""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from textual.theme import Theme

from ssdmoe_tui import paths
from ssdmoe_tui.user_files import CONFIG_TOML_MAX, RefusedFile, read_regular_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

BUILTIN_DIR = Path(__file__).parent / "themes"
_FIELDS = {f.name: f for f in fields(Theme)}
_BOOL_FIELDS = {"dark", "ansi"}
_FLOAT_FIELDS = {"luminosity_spread", "text_alpha"}


def theme_from_toml(path: Path) -> Theme:
    """Parse one theme file; raises ValueError with a one-line reason."""
    try:
        data = tomllib.loads(read_regular_text(path, CONFIG_TOML_MAX))
    except RefusedFile as e:
        raise ValueError(str(e)) from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise ValueError(f"{path}: {e}") from None
    kwargs: dict[str, object] = {}
    for key, value in data.items():
        if key not in _FIELDS:
            raise ValueError(f"{path}: unknown theme key {key!r}")
        if key == "variables":
            if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
                raise ValueError(f"{path}: [variables] must map names to strings")
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise ValueError(f"{path}: {key} must be true or false")
        elif key in _FLOAT_FIELDS:
            if not isinstance(value, (int, float)):
                raise ValueError(f"{path}: {key} must be a number")
        elif not isinstance(value, str):
            raise ValueError(f"{path}: {key} must be a string")
        kwargs[key] = value
    if not kwargs.get("name") or not kwargs.get("primary"):
        raise ValueError(f"{path}: a theme needs at least `name` and `primary`")
    theme = Theme(**kwargs)  # type: ignore[arg-type]
    try:
        theme.to_color_system().generate()  # bad colour strings fail here, not at render time
    except Exception as e:  # noqa: BLE001 - Textual raises several colour parse errors
        raise ValueError(f"{path}: {e}") from None
    return theme


def load_themes(user_dir: Path | None = None) -> tuple[list[Theme], list[str]]:
    """All shipped themes, then the user's; returns (themes, warnings)."""
    user_dir = user_dir if user_dir is not None else paths.config_dir() / "themes"
    themes: list[Theme] = []
    warnings: list[str] = []
    files = sorted(BUILTIN_DIR.glob("*.toml"))
    if user_dir.is_dir():
        files += sorted(user_dir.glob("*.toml"))
    for path in files:
        try:
            themes.append(theme_from_toml(path))
        except ValueError as e:
            warnings.append(" ".join(str(e).split()))
    return themes, warnings
