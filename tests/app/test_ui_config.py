"""config.toml: defaults, CLI overrides, bad files (one line, never overwritten), theme files."""

from __future__ import annotations

import argparse
from pathlib import Path

from ssdmoe_tui.commands import chat
from ssdmoe_tui.config import Config, config_path, load_config, set_config_value
from ssdmoe_tui.ui.theming import load_themes, theme_from_toml
from tests.helpers.cli_runner import run_cli


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    chat.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_config_lives_under_ssdmoe_home(ssdmoe_home):
    assert config_path() == ssdmoe_home / "config" / "config.toml"


def test_missing_file_gives_defaults_and_is_writable(ssdmoe_home):
    loaded = load_config()
    assert loaded.config == Config()
    assert loaded.warnings == () and loaded.writable
    assert set_config_value(loaded, "theme", "ssdmoe-light") is None
    again = load_config()
    assert again.config.theme == "ssdmoe-light" and again.warnings == ()
    assert "# [keymap]" in config_path().read_text()  # the template documents the rest


def test_values_are_read_and_cli_flags_override(ssdmoe_home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        'model = "/models/a"\nk = 3\nexpert_cache = "2G"\ntheme = "ssdmoe-light"\n'
        'max_tokens = 99\nsystem_prompt = "Be brief."\n\n[keymap]\n"app.stop" = "f9"\n'
    )
    loaded = load_config()
    assert loaded.warnings == ()
    cfg = loaded.config
    assert (cfg.model, cfg.k, cfg.expert_cache, cfg.theme) == ("/models/a", 3, "2G", "ssdmoe-light")
    assert (cfg.max_tokens, cfg.system_prompt, cfg.keymap) == (99, "Be brief.", {"app.stop": "f9"})

    settings = chat.build_settings(parse("--k", "5", "--model", "/models/b", "--resume"), loaded)
    assert (settings.k, settings.model, settings.resume) == (5, "/models/b", "")
    assert (settings.expert_cache, settings.max_tokens, settings.theme) == (
        "2G",
        99,
        "ssdmoe-light",
    )
    settings = chat.build_settings(parse("--theme", "ssdmoe-dark", "--resume", "abc"), loaded)
    assert (settings.theme, settings.k, settings.resume) == ("ssdmoe-dark", 3, "abc")


def test_bad_toml_is_one_line_defaults_and_never_overwritten(ssdmoe_home):
    path = config_path()
    path.parent.mkdir(parents=True)
    text = 'theme = "ssdmoe-light"\nk = [oops\n'
    path.write_text(text)
    loaded = load_config()
    assert loaded.config == Config()
    assert not loaded.writable
    assert len(loaded.warnings) == 1 and "\n" not in loaded.warnings[0]
    assert str(path) in loaded.warnings[0] and "bad TOML" in loaded.warnings[0]
    problem = set_config_value(loaded, "theme", "ssdmoe-dark")
    assert problem is not None and str(path) in problem
    assert path.read_text() == text


def test_bad_values_warn_per_key_and_keep_the_rest(ssdmoe_home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        'k = 0\nmax_tokens = "many"\ntheme = "ssdmoe-light"\nkeymap = 3\n'
        f"model = {list(range(5000))}\n"
    )
    loaded = load_config()
    assert loaded.config.theme == "ssdmoe-light"
    assert loaded.config.k is None and loaded.config.max_tokens == Config().max_tokens
    assert len(loaded.warnings) == 4
    assert any("k = 0" in w for w in loaded.warnings)
    assert all(str(path) in w and "\n" not in w for w in loaded.warnings)
    long = next(w for w in loaded.warnings if "model = " in w)  # the value is cut short
    assert "[0, 1, 2" in long and "..." in long and len(long) < len(str(path)) + 120


def test_theme_edit_keeps_comments_and_other_keys(ssdmoe_home):
    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text('# mine\nk = 2  # fast\ntheme = "ssdmoe-dark"\n\n[keymap]\n"app.stop" = "f9"\n')
    assert set_config_value(load_config(), "theme", "ssdmoe-light") is None
    assert path.read_text() == (
        '# mine\nk = 2  # fast\ntheme = "ssdmoe-light"\n\n[keymap]\n"app.stop" = "f9"\n'
    )
    path.write_text('k = 2\n\n[keymap]\n"app.stop" = "f9"\n')
    assert set_config_value(load_config(), "theme", 'we"ird') is None
    loaded = load_config()
    assert loaded.config.theme == 'we"ird' and loaded.config.keymap == {"app.stop": "f9"}


def test_config_path_flag_prints_and_exits(ssdmoe_home):
    out = run_cli(["--config-path"], timeout=60)
    assert out.returncode == 0, out.stderr
    path = ssdmoe_home / "config" / "config.toml"
    assert out.stdout.strip() == str(path)
    # The file it names exists from the first run: the commented template (every key).
    template = path.read_text()
    assert "# k = 4" in template and "# temperature = " in template and "f4" not in template
    assert load_config(path).config == Config() and not load_config(path).warnings
    path.write_text("k = 3\n")
    out = run_cli(["chat", "--config-path"], timeout=60)
    assert out.stdout.strip() == str(ssdmoe_home / "config" / "config.toml")
    assert path.read_text() == "k = 3\n"  # never written over


def test_bad_flag_values_are_one_line_errors():
    out = run_cli(["--k", "zero"], timeout=60)
    assert out.returncode == 2
    assert "--k" in out.stderr and "Traceback" not in out.stderr


def test_shipped_themes_load_and_ship_with_the_package(ssdmoe_home):
    themes, warnings = load_themes()
    names = {t.name: t for t in themes}
    assert warnings == []
    assert names["ssdmoe-dark"].dark and not names["ssdmoe-light"].dark
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"ui/themes/*.toml"' in pyproject


def test_user_themes_are_loaded_and_bad_ones_skipped(ssdmoe_home):
    folder = ssdmoe_home / "config" / "themes"
    folder.mkdir(parents=True)
    (folder / "mine.toml").write_text('name = "mine"\nprimary = "#ff0000"\ndark = false\n')
    (folder / "broken.toml").write_text('name = "broken"\nprimary = "not-a-colour"\n')
    (folder / "typo.toml").write_text('name = "typo"\nprimari = "#ff0000"\n')
    themes, warnings = load_themes()
    assert "mine" in {t.name for t in themes}
    assert {"broken", "typo"}.isdisjoint({t.name for t in themes})
    assert len(warnings) == 2 and all("\n" not in w for w in warnings)
    assert any("broken.toml" in w for w in warnings) and any("primari" in w for w in warnings)
    assert theme_from_toml(folder / "mine.toml").primary == "#ff0000"


async def test_keymap_clashes_and_unknown_ids_are_one_warning_each(ssdmoe_home, demo_model):
    """Issue 23: a [keymap] that puts two actions of one screen on one key, or names an
    action that does not exist, says so (file named) instead of saying nothing. Issue 45:
    said where the file is read (the loader, given the app's bindings), and once: the
    app shows the loader's lines and does not check them again."""
    from ssdmoe_tui.ui.app import SsdmoeApp

    path = config_path()
    path.parent.mkdir(parents=True)
    path.write_text(
        '[keymap]\n"app.stop" = "ctrl+n"\n"app.teleport" = "f9"\n"prompt.nope" = "f10"\n'
    )
    assert load_config().warnings == ()  # without the bindings nothing can be said
    settings = chat.build_settings(parse("--model", str(demo_model)))
    keymap = [w for w in settings.warnings if "[keymap]" in w]
    assert len(keymap) == 2, settings.warnings
    assert all(w.startswith(str(path)) and "\n" not in w for w in keymap)
    assert any("app.teleport" in w and "prompt.nope" in w and "unknown" in w for w in keymap)
    assert any("app.new_chat" in w and "app.stop" in w and "ctrl+n" in w for w in keymap)
    app = SsdmoeApp(settings)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        said = [n.message for n in app._notifications if n.severity == "warning"]
        assert app._keymap == {"app.stop": "ctrl+n"}  # the known id applied, clash and all
    assert [w for w in said if "[keymap]" in w] == keymap  # each once
