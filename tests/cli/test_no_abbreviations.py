"""Issue 23: no argument parser takes abbreviations (`--api-k KEY` for `--api-key` put the
key, unredacted, into the model lock's label); the refusal does not echo the secret."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from pathlib import Path

import pytest

from ssdmoe_tui.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_every_parser_and_subparser_refuses_abbreviations() -> None:
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 10  # the commands and their sub-commands
    assert [p.prog for p in parsers if p.allow_abbrev] == []


def test_every_script_parser_refuses_abbreviations() -> None:
    """The scripts' own parsers too (a static check: each `ArgumentParser(` call)."""
    offenders = []
    for path in [*ROOT.glob("scripts/*.py"), *ROOT.glob("ssdmoe_tui/**/*.py")]:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not re.search(r"\bArgumentParser\(", line) or path.name == "cli.py":
                continue
            if "allow_abbrev=False" not in " ".join(lines[i : i + 4]):
                offenders.append(f"{path.relative_to(ROOT)}:{i + 1}: {line.strip()}")
    assert offenders == []


@pytest.mark.parametrize("argv", [["serve", "--api-k", "s3cret"], ["serve", "--api-ke=s3cret"]])
def test_an_abbreviated_secret_is_refused_without_echoing_it(argv) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    line = err.getvalue().strip()
    assert "\n" not in line and "unrecognized arguments" in line, line
    assert "s3cret" not in line, line


def test_abbreviated_options_are_refused_everywhere() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        main(["generate", "--max-tok", "3", "--prompt", "hi"])
    assert "--max-tok" in err.getvalue()
