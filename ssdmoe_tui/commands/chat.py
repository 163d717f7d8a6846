"""`ssdmoe [chat]`: open the chat app (the demo model unless --model is given)."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace

from ssdmoe_tui.config import (
    ChatSettings,
    Config,
    LoadedConfig,
    config_path,
    ensure_config_file,
    load_config,
)

HELP = "open the chat app (the default command)"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by `ssdmoe` and `ssdmoe chat`; each overrides config.toml."""
    parser.add_argument(
        "--model", metavar="DIR", help="checkpoint folder (default: the embedded demo model)"
    )
    parser.add_argument(
        "--k", type=_positive_int, metavar="K", help="experts per token (default: the trained K)"
    )
    parser.add_argument(
        "--expert-cache", metavar="SIZE", help='expert-cache budget: "auto", 512M, 4G, ...'
    )
    parser.add_argument("--theme", metavar="NAME", help="colour theme, e.g. ssdmoe-light")
    parser.add_argument(
        "--max-tokens", type=_positive_int, metavar="N", help="longest reply, in tokens"
    )
    parser.add_argument(
        "--resume",
        nargs="?",
        const="",
        default=None,
        metavar="ID",
        help="resume a saved conversation (the latest without ID)",
    )
    parser.add_argument(
        "--config-path", action="store_true", help="print where config.toml lives and exit"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat", help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(func=run)


def merge(config: Config, args: argparse.Namespace) -> Config:
    """CLI flags win over the config file (a flag is named as its config key)."""
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Config)}
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


def build_settings(args: argparse.Namespace, loaded: LoadedConfig | None = None) -> ChatSettings:
    loaded = loaded or load_config()
    cfg = merge(loaded.config, args)
    values = {f.name: getattr(cfg, f.name) for f in fields(Config)}
    values["keymap"] = dict(cfg.keymap)
    return ChatSettings(
        **values,
        resume=getattr(args, "resume", None),
        config=loaded,
        warnings=loaded.warnings,
    )


def session_store(settings) -> object | None:
    """Conversation persistence: every turn is saved under the platformdirs data dir."""
    from ssdmoe_tui.sessions.app_sessions import AppSessions
    from ssdmoe_tui.sessions.store import SessionStore

    return AppSessions(SessionStore(), settings.system_prompt)


def run(args: argparse.Namespace) -> int:
    problem = ensure_config_file()  # the commented template, on first run only
    if getattr(args, "config_path", False):
        print(config_path())
        return 0
    from ssdmoe_tui.ui.app import SsdmoeApp

    settings = build_settings(args)
    if problem:
        settings.warnings = (*settings.warnings, problem)
    app = SsdmoeApp(settings, session_store=session_store(settings))
    code = app.run()
    return int(code or app.return_code or 0)
