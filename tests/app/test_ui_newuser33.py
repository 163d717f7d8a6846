"""What a new user tripped on (issue 33, N1-N21): each through the real app (the pilot,
real files, the real demo where a model is needed)."""

from __future__ import annotations

import argparse

from ssdmoe_tui.commands.chat import add_arguments, build_settings
from ssdmoe_tui.config import config_path, ensure_config_file, load_config
from ssdmoe_tui.ui.actions.keys import keymap_problems
from ssdmoe_tui.ui.app import SsdmoeApp
from tests.app.test_ui_app import wait_until
from tests.app.test_ui_snapshot import setup


def settings(*argv: str):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_settings(parser.parse_args(list(argv)))


def _uncomment_keymap(text: str) -> str:
    """What a user does with the template's keymap example: uncomment the block."""
    lines = text.splitlines()
    at = next(i for i, s in enumerate(lines) if s.startswith("# [keymap]"))
    return "\n".join(lines[:at] + [s.removeprefix("# ") for s in lines[at:]]) + "\n"


async def test_n1_n2_a_theme_chosen_in_the_app_stays_a_setting_once_keymap_is_uncommented(
    ssdmoe_home,
):
    assert ensure_config_file() is None  # the commented template, as on a first run
    app = SsdmoeApp(settings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        app.theme = "ssdmoe-light"  # what the palette's theme picker does
        await wait_until(pilot, lambda: "ssdmoe-light" in config_path().read_text(), 5)
    path = config_path()
    path.write_text(_uncomment_keymap(path.read_text()))
    loaded = load_config()
    assert loaded.warnings == ()
    assert loaded.config.theme == "ssdmoe-light"  # N1: not swallowed by [keymap]
    keymap = loaded.config.keymap
    assert keymap and "app.k_up" in keymap
    assert keymap_problems(SsdmoeApp, keymap, str(path)) == []  # N2: no key it shadows
    # A file an older version wrote (the theme appended under the commented table) is
    # mended by the next theme the app saves: one theme line, above the table.
    path.write_text(ensure_template_with('theme = "ssdmoe-light"'))
    app = SsdmoeApp(settings(), engine_factory=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await setup(pilot)
        app.theme = "ssdmoe-dark"
        await wait_until(pilot, lambda: 'theme = "ssdmoe-dark"' in path.read_text(), 5)
    text = path.read_text()
    assert [s for s in text.splitlines() if s.startswith("theme =")] == ['theme = "ssdmoe-dark"']
    path.write_text(_uncomment_keymap(text))
    assert load_config().config.theme == "ssdmoe-dark" and load_config().warnings == ()


def ensure_template_with(line: str) -> str:
    from ssdmoe_tui.config import template

    return template() + line + "\n"
