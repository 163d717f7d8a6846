"""Where the tests' copied real-world files live (tests/fixtures/, sources in SOURCES.md).

The tests read only these copies, never a folder beside the checkout, so a fresh clone
runs the whole suite.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
TRACES = FIXTURES / "traces"
