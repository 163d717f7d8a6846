"""The theme: the configured one at start, and the user's later choice written back."""

from __future__ import annotations

from typing import Any

from ssdmoe_tui.config import DEFAULT_THEME, set_config_value


class ThemeChoice:
    """Applies the configured theme and writes a theme the user picks back to
    config.toml; the default used in place of an unknown theme is not a choice and is
    never written back."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.fallback: str | None = None

    def apply(self, name: str) -> None:
        app = self.app
        if name in app.available_themes:
            app.theme = name
        else:
            known = ", ".join(sorted(t for t in app.available_themes if t.startswith("ssdmoe")))
            loaded = app.settings.config
            if loaded is not None and loaded.config.theme == name:  # the file's value
                where = f"{loaded.path}: theme = {name!r} is not a theme"
                kept = f"{loaded.path.name} is left as it is"
            else:  # the command line's (`--theme`), or a caller's
                where, kept = f"--theme {name}: no such theme", "config.toml is not changed"
            app.notify(
                f"{where}; using {DEFAULT_THEME} ({kept}; themes: {known}, ...)",
                severity="warning",
                markup=False,
            )
            self.fallback = DEFAULT_THEME
            app.theme = DEFAULT_THEME
        app.theme_changed_signal.subscribe(app, self.remember)

    def remember(self, theme: Any) -> None:
        if self.fallback is not None and theme.name == self.fallback:
            self.fallback = None  # the fallback for an unknown theme: not a choice
            return
        self.fallback = None
        settings = self.app.settings
        loaded = settings.config
        if loaded is None or theme.name == settings.theme:
            return
        settings.theme = theme.name
        problem = set_config_value(loaded, "theme", theme.name)
        if problem:
            self.app.notify(f"theme {theme.name}: {problem}", severity="warning")
