"""The repository stands alone: tests read tests/fixtures/, and nothing reads the sibling
development folder that a user's clone does not have."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tests.helpers.fixture_paths import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
# The sibling folder by relative path (either separator), by the development machine's
# absolute path, or joined as a path part (parents[N] / its name, .parent / its name).
SIBLING = re.compile(r"\.\.[/\\]shared\b|/work/shared\b|/\s*[\"']shared[\"']|[\"']shared[\"']\s*/")


def test_nothing_references_the_sibling_shared_folder() -> None:
    offenders = []
    for top in ("ssdmoe_tui", "tests"):
        for path in sorted((ROOT / top).rglob("*")):
            if not path.is_file() or path.suffix not in {".py", ".c", ".h", ".toml", ".tcss"}:
                continue
            for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if SIBLING.search(line) and path != Path(__file__).resolve():
                    offenders.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_fixture_copies_match_their_recorded_checksums() -> None:
    text = (FIXTURES / "SOURCES.md").read_text()
    sums = re.findall(r"^([0-9a-f]{64})  (\S+)$", text, re.M)
    assert len(sums) >= 20
    for digest, rel in sums:
        assert hashlib.sha256((FIXTURES / rel).read_bytes()).hexdigest() == digest, rel
    # every data file has its source noted (a checksum line in SOURCES.md)
    listed = {rel for _, rel in sums}
    files = {
        str(p.relative_to(FIXTURES))
        for p in FIXTURES.rglob("*")
        if p.is_file() and p.suffix != ".md" and p.name != ".gitattributes"
    }
    assert files <= listed, f"fixtures without a SOURCES.md entry: {sorted(files - listed)}"
