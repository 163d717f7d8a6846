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
import time

import pytest

from tests.helpers import pace


def floor_batches(monkeypatch: pytest.MonkeyPatch, per_token_s: float) -> None:
    """`pace.floor` for the batched decode: the server hands its Generates to a
    `BatchRunner` (--max-batch auto is at least 4), which never calls `Runner.stream`, so a
    step that brings tokens comes at least `per_token_s` after the last one that did."""
    from ssdmoe_tui.engine.run.batch import BatchRunner
    from ssdmoe_tui.engine.run.runner import TokenEvent

    step = BatchRunner.step
    last = [time.monotonic()]

    def paced(self: BatchRunner) -> list:
        events = step(self)
        if any(isinstance(event, TokenEvent) for _, event in events):
            wait = per_token_s - (time.monotonic() - last[0])
            if wait > 0:
                time.sleep(wait)
            last[0] = time.monotonic()
        return events

    monkeypatch.setattr(BatchRunner, "step", paced)


def main(argv: list[str]) -> int:
    per_token_s, rest = float(argv[0]), argv[1:]
    patch = pytest.MonkeyPatch()
    if per_token_s > 0:
        pace.floor(patch, per_token_s)  # a Generate decoded alone (--max-batch 1, speculation)
        floor_batches(patch, per_token_s)
    from ssdmoe_tui import cli

    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
