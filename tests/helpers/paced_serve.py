"""`ssdmoe serve` in a subprocess whose every token comes at least PER_TOKEN_S after the
previous one (tests/helpers/pace.py's floor, set before the CLI runs):

    python -m tests.helpers.paced_serve PER_TOKEN_S serve --model ...

A test that acts on a server's reply while it streams (Esc, kill it mid-reply) needs a
reply that lasts however fast the machine: the server's demo writes its 64 tokens in a
fraction of a second on a quick machine, in a handful of Tokens events, and a reply that
has ended cannot be stopped mid-way. The engine and what it computes are the real ones.
"""

from __future__ import annotations

import sys

import pytest

from tests.helpers import pace


def main(argv: list[str]) -> int:
    per_token_s, rest = float(argv[0]), argv[1:]
    patch = pytest.MonkeyPatch()
    if per_token_s > 0:
        pace.floor(patch, per_token_s)
    from ssdmoe_tui import cli

    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
