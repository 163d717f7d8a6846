"""`ssdmoe` entry point: argparse front door that dispatches to `ssdmoe_tui.commands.*`.

Each command lives in its own module with `register(subparsers)` (adds its parser and
sets `func`). With no subcommand, `ssdmoe` opens the chat app.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ssdmoe_tui.commands import COMMAND_MODULES  # their order is `ssdmoe --help`'s


class CliError(Exception):
    """A one-line user-facing error; printed without a traceback."""


class _Parser(argparse.ArgumentParser):
    """A bad argument is one line naming it (`--help` shows the usage). No abbreviations:
    `--api-k KEY` taken for `--api-key` would be a secret under a name that no redaction
    knows; subparsers are this class too (argparse makes them with the parent's class)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):  # it may hold a secret's value
            from ssdmoe_tui.models.lock import redact_command

            message = "unrecognized arguments: " + redact_command(message.split(": ", 1)[1])
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ssdmoe",
        description="Chat with Mixture-of-Experts models larger than memory, streamed from SSD.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"ssdmoe_tui.commands.{name}")
        module.register(sub)
    # `ssdmoe --model X` (no subcommand) is `ssdmoe chat --model X`.
    chat = importlib.import_module("ssdmoe_tui.commands.chat")
    chat.add_arguments(parser)
    parser.set_defaults(func=chat.run)
    return parser


# Commands that run the engine; the chat app starts without MLX and says so itself.
NEEDS_MLX = {"generate", "serve", "bench", "eval"}


_exit_hook: list[bool] = []


def _clear_streams_at_exit() -> None:
    """These commands run MLX on the main thread: its streams are destroyed at exit while
    the runtime is whole (`mx.clear_streams()`, which MLX asks of every thread that used
    it), not by thread-local destructors during the interpreter's teardown. Once per
    process (tests call `main` many times)."""
    if _exit_hook:
        return
    import atexit

    import mlx.core as mx

    clear = getattr(mx, "clear_streams", None)  # MLX >= 0.31
    if clear is not None:
        atexit.register(clear)
        _exit_hook.append(True)


def main(argv: list[str] | None = None) -> int:
    from ssdmoe_tui.atomic import remove_orphan_temps_at_startup

    remove_orphan_temps_at_startup()  # what killed writers left; live writers' files stay
    # transformers' warnings are not ours to show: e.g. "Token indices sequence length is
    # longer than..." would come as a second line before our own context refusal.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from ssdmoe_tui.gpu_kernels import keep_kernels

    keep_kernels()  # before MLX compiles a GPU kernel: kept across runs and reboots
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "command", None) in NEEDS_MLX:
            import mlx.core  # noqa: F401 - first: no work before the one line saying it is missing

            _clear_streams_at_exit()
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except CliError as e:
        print(f"ssdmoe: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - last line of defence: one line, no traceback
        from ssdmoe_tui.errors import user_message

        print(f"ssdmoe: error: {user_message(e)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
