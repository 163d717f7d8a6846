"""The terminal for the chat app on rank 0 of `ssdmoe launch ... ssdmoe --distributed`.

mlx.launch runs every rank with pipes for stdin, stdout and stderr, so rank 0 would
have no terminal to draw on. A rank on the launching machine still has the launch's
controlling terminal: rank 0 opens /dev/tty and puts it on its stdin, stdout and
stderr before the app starts. `ssdmoe launch` gives mlx.launch itself a stdin that
never has data when it starts the app, so mlx.launch reads none of the keys meant for
the app (plain mlx.launch would read, and forward to every rank's stdin, part of them).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

from ssdmoe_tui.errors import BadValueError

# leave the alternate screen, show the cursor, mouse reporting and bracketed paste off
_RESET = b"\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?2004l\x1b[?25h\x1b[?1049l\r\n"


def take_terminal() -> Callable[[], None]:
    """Make fds 0-2 the controlling terminal if they are not a terminal; returns a
    function that restores the terminal's mode (for an exit the app did not make)."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        if not os.environ.get("SSDMOE_DIST_STATUS"):
            raise BadValueError(
                "the distributed chat app starts through `ssdmoe launch` (same arguments as "
                "mlx.launch): plain mlx.launch reads the keys meant for the app"
            )
        try:
            fd = os.open("/dev/tty", os.O_RDWR | getattr(os, "O_NOCTTY", 0))
        except OSError as e:
            raise BadValueError(
                f"the chat app on rank 0 needs this machine's terminal (/dev/tty: "
                f"{e.strerror or e}); start the launch from a terminal, with rank 0 on this "
                "machine"
            ) from None
        for target in (0, 1, 2):
            os.dup2(fd, target)
        os.close(fd)
    try:
        import termios

        saved = termios.tcgetattr(0)
    except Exception:  # noqa: BLE001 - termios.error, no termios (Windows): nothing to keep
        return lambda: None

    def restore() -> None:
        with contextlib.suppress(Exception):
            termios.tcsetattr(0, termios.TCSANOW, saved)
        with contextlib.suppress(OSError):
            os.write(2, _RESET)

    return restore
