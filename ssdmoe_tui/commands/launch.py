"""`ssdmoe launch`: `mlx.launch` with the ranks' exit status (docs/distributed.md).

mlx.launch 0.32 exits 0 whatever its ranks did. This runs it unchanged (every argument
is mlx.launch's), adding only `--env SSDMOE_DIST_STATUS=<private folder>`: each rank
records how it ended there (`engine/distributed/exit_status.py`), rank 0 also what the
side channel told it of the others, and this command exits with the launch's status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

HELP = "run mlx.launch (same arguments) and exit with the ranks' status"


def register(sub: argparse._SubParsersAction) -> None:
    # Every argument is mlx.launch's: no option of ours may shadow one of them.
    p = sub.add_parser("launch", help=HELP, description=HELP, add_help=False, prefix_chars="+")
    p.add_argument("launch_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)


def mlx_launch() -> list[str]:
    """mlx.launch's command: its script beside this Python or on PATH, else its module
    (a `pip install --target` folder has no script on PATH, as on the GPU machine)."""
    beside = Path(sys.executable).parent / "mlx.launch"
    found = str(beside) if beside.exists() else shutil.which("mlx.launch")
    if found is not None:
        return [found]
    import importlib.util

    if importlib.util.find_spec("mlx") is None:
        from ssdmoe_tui.errors import BadValueError

        raise BadValueError("mlx.launch not found (pip install mlx, in this environment)")
    code = "import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = 'mlx.launch'; sys.exit(main())"
    return [sys.executable, "-c", code]


def expected_ranks(argv: list[str]) -> int:
    """How many ranks the launch starts, read from mlx.launch's own flags (0: unknown)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--hosts", default="127.0.0.1")
    p.add_argument("--repeat-hosts", "-n", type=int, default=1)
    p.add_argument("--hostfile", default=None)
    try:
        known, _ = p.parse_known_args(argv)
        if known.hostfile:
            data = json.loads(Path(known.hostfile).read_text())
            hosts = data["hosts"] if isinstance(data, dict) else data
            return len(hosts)
        return len([h for h in known.hosts.split(",") if h]) * max(known.repeat_hosts, 1)
    except (OSError, ValueError, KeyError, TypeError, SystemExit):
        return 0


def starts_the_app(argv: list[str]) -> bool:
    """Whether the launched command is the chat app (`ssdmoe [chat] ... --distributed`):
    then mlx.launch must not read this terminal (rank 0's app reads it)."""
    from ssdmoe_tui.commands import COMMAND_MODULES

    for i, word in enumerate(argv):
        if Path(word).name == "ssdmoe" or (word == "ssdmoe_tui.cli" and argv[i - 1 : i] == ["-m"]):
            rest = argv[i + 1 :]
            if "--distributed" not in rest:
                return False
            others = {m.replace("_", "-") for m in COMMAND_MODULES} - {"chat"}
            return not any(w in others for w in rest)
    return False


def run(args: argparse.Namespace) -> int:
    from ssdmoe_tui.engine.distributed.exit_status import ENV_STATUS, launch_status

    argv = list(args.launch_args)
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: ssdmoe launch [mlx.launch options] COMMAND ...\n"
            "Runs mlx.launch with these arguments and exits with the ranks' status.\n"
            "mlx.launch's own options follow:\n",
            file=sys.stderr,
        )
        argv = argv or ["--help"]
    with tempfile.TemporaryDirectory(prefix="ssdmoe-launch-") as folder:
        cmd = [*mlx_launch(), "--env", f"{ENV_STATUS}={folder}", *argv]
        # Ctrl-C reaches every process of the terminal: mlx.launch and the ranks stop
        # themselves; this one waits for them, then reports their status.
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        # The app on rank 0 reads the terminal itself (commands/terminal.py): mlx.launch
        # gets a stdin that never has data (at EOF its loop would spin).
        quiet_in = os.pipe() if starts_the_app(argv) else None
        try:
            code = subprocess.call(cmd, stdin=quiet_in[0] if quiet_in else None)
        finally:
            with contextlib.suppress(ValueError):
                signal.signal(signal.SIGINT, old)
            for fd in quiet_in or ():
                os.close(fd)
        if code != 0 or "--help" in argv[:1] or "-h" in argv[:1]:
            return code  # mlx.launch itself refused (a bad option), or its help
        status = launch_status(Path(folder), expected_ranks(argv))
    if status.missing() and len(status.missing()) == len(status.per_rank):
        print(
            "ssdmoe: error: no rank recorded an exit status (the command is not an "
            "`ssdmoe ... --distributed` one, or every rank was killed)",
            file=sys.stderr,
        )
    return status.status
