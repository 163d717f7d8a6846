"""The idle layout at 120x40, from fixed engine events (no engine thread, nothing timed)."""

from __future__ import annotations

from ssdmoe_tui.ui.app import ChatSettings, SsdmoeApp
from tests.helpers.ui_events import setup


def test_idle_layout_120x40(snap_compare):
    app = SsdmoeApp(ChatSettings(theme="ssdmoe-dark"), engine_factory=None)
    assert snap_compare(app, terminal_size=(120, 40), run_before=setup)


def test_idle_layout_light_theme_panel_hidden(snap_compare):
    app = SsdmoeApp(ChatSettings(theme="ssdmoe-light"), engine_factory=None)
    assert snap_compare(app, press=["f2"], terminal_size=(120, 40), run_before=setup)
