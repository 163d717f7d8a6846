"""`ssdmoe [chat]`: open the chat app (the demo model unless --model is given)."""

from __future__ import annotations

import argparse
from dataclasses import fields, replace

from ssdmoe_tui.commands.common import (
    add_expert_cache_argument,
    add_k_argument,
    add_max_tokens_argument,
    add_model_argument,
    arg_type,
)
from ssdmoe_tui.config import (
    ChatSettings,
    Config,
    LoadedConfig,
    config_path,
    ensure_config_file,
    load_config,
)

HELP = "open the chat app (the default command)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by `ssdmoe` and `ssdmoe chat`; each overrides config.toml."""
    add_model_argument(parser, default=None)
    add_k_argument(parser)
    add_expert_cache_argument(parser, default=None)
    parser.add_argument("--theme", metavar="NAME", help="colour theme, e.g. ssdmoe-light")
    add_max_tokens_argument(parser, default=None)
    parser.add_argument(
        "--resume",
        nargs="?",
        const="",
        default=None,
        metavar="ID",
        help="resume a saved conversation (the latest without ID)",
    )
    parser.add_argument(
        "--attach",
        type=arg_type(attach_url),
        default=None,
        metavar="URL",
        help="chat through a running `ssdmoe serve` (http://127.0.0.1:8080) instead of "
        "loading a model here: both share its one loaded model (its API key from "
        "$SSDMOE_API_KEY, else the app asks); F4 lists the servers on this machine",
    )
    parser.add_argument(
        "--config-path", action="store_true", help="print where config.toml lives and exit"
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="one rank of an expert-parallel launch: `ssdmoe launch -n 2 --backend ring "
        "ssdmoe --distributed --model DIR` (rank 0 draws the app; docs/distributed.md)",
    )


def attach_url(text: str) -> str:
    """`--attach`: `http://HOST:PORT` (`options.server_url`)."""
    from ssdmoe_tui.options import server_url

    return server_url(text)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("chat", help=HELP, description=HELP)
    add_arguments(parser)
    parser.set_defaults(func=run)


def _plain(value: object) -> object:
    """A parsed flag as its config value (the cache budget is kept as the text typed)."""
    return value if value is None or isinstance(value, (str, int, float)) else str(value)


def merge(config: Config, args: argparse.Namespace) -> Config:
    """CLI flags win over the config file (a flag is named as its config key)."""
    overrides = {f.name: _plain(getattr(args, f.name, None)) for f in fields(Config)}
    return replace(config, **{k: v for k, v in overrides.items() if v is not None})


def read_config() -> LoadedConfig:
    """config.toml as the app takes it: its [keymap] checked against the app's own
    bindings where the file is read, so each problem is said once, naming the file."""
    from ssdmoe_tui.ui.actions.keys import app_bindings
    from ssdmoe_tui.ui.app import SsdmoeApp

    return load_config(bindings=app_bindings(SsdmoeApp))


def build_settings(args: argparse.Namespace, loaded: LoadedConfig | None = None) -> ChatSettings:
    loaded = loaded or read_config()
    cfg = merge(loaded.config, args)
    values = {f.name: getattr(cfg, f.name) for f in fields(Config)}
    values["keymap"] = dict(cfg.keymap)
    return ChatSettings(
        **values,
        resume=getattr(args, "resume", None),
        attach=getattr(args, "attach", None),
        config=loaded,
        warnings=loaded.warnings,
    )


def session_store(settings) -> object | None:
    """Conversation persistence: every turn is saved under the platformdirs data dir."""
    from ssdmoe_tui.sessions.app_sessions import AppSessions
    from ssdmoe_tui.sessions.store import SessionStore

    return AppSessions(SessionStore(), settings.system_prompt)


def engine_factory(post):
    """The chat engine, with the sessions store's KV hooks injected (built on the engine
    thread: the checkpoint code imports MLX, which the UI never does)."""
    from ssdmoe_tui.engine.run.service import EngineService
    from ssdmoe_tui.sessions.kv_hooks import session_hooks

    return EngineService(post=post, kv_hooks=session_hooks)


def run(args: argparse.Namespace) -> int:
    problem = ensure_config_file()  # the commented template, on first run only
    if getattr(args, "config_path", False):
        print(config_path())
        return 0
    from ssdmoe_tui.ui.app import SsdmoeApp

    settings = build_settings(args)
    if problem:
        settings.warnings = (*settings.warnings, problem)
    if getattr(args, "distributed", False):
        return _run_distributed(settings)
    app = SsdmoeApp(settings, engine_factory=engine_factory, session_store=session_store(settings))
    try:
        code = app.run()
    finally:  # the app closes them on unmount; _exit_now skips atexit: close them here too
        if app.chat.tools is not None:
            app.chat.tools.servers.close()
    return _exit_now(int(code or app.return_code or 0))


def _exit_now(code: int) -> int:
    """End the process once the app has closed, without the interpreter's teardown.

    By then the app has shut the engine thread down (`on_unmount` joins it) and every
    write went through the atomic writer. The teardown was seen to abort now and then
    after ctrl+q ("terminate called without an active exception", exit 134, about one
    quit in three in the tmux smoke test with the trained demo): a C++ thread of the
    MLX runtime torn down while another thread was still alive. The root cause is not
    found yet; exiting here keeps the user's exit status true meanwhile."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _run_distributed(settings) -> int:
    """The app on rank 0 (its engine linked to the others' like `serve --distributed`'s);
    the other ranks follow rank 0's engine commands and draw nothing."""
    from ssdmoe_tui.engine.distributed.group import start
    from ssdmoe_tui.engine.distributed.link import ServiceLink, agreed_kv_hooks, follow
    from ssdmoe_tui.options import EngineOptions
    from ssdmoe_tui.sessions.kv_hooks import session_hooks

    dist = start(sigterm=False)  # the app's event loop owns the signal wakeup fd
    with dist.guard():
        link = ServiceLink(dist)
        if not dist.is_root:
            hooks = agreed_kv_hooks(dist, session_hooks(lambda _msg: None), saves=False)
            dist.exit_code = follow(dist, EngineOptions(), link, kv_hooks=hooks)
        else:
            dist.exit_code = _root_app(settings, dist, link)
    return dist.exit_code


def _root_app(settings, dist, link) -> int:
    from ssdmoe_tui.commands.terminal import take_terminal
    from ssdmoe_tui.engine.distributed.link import agreed_kv_hooks
    from ssdmoe_tui.ui.app import SsdmoeApp

    restore = take_terminal()
    if dist.watchdog is not None:
        dist.watchdog.before_exit = restore  # a lost rank ends the launch: leave a sane tty

    def factory(post):
        from ssdmoe_tui.engine.run.service import EngineService
        from ssdmoe_tui.sessions.kv_hooks import session_hooks

        service = EngineService(
            post=post,
            kv_hooks=lambda notice: agreed_kv_hooks(dist, session_hooks(notice), saves=True),
        )
        link.attach(service)
        return service

    app = SsdmoeApp(settings, engine_factory=factory, session_store=session_store(settings))
    try:
        code = app.run()
    finally:
        restore()
    return int(code or app.return_code or 0)
