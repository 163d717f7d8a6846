"""Where the tests' copied real-world files live (tests/fixtures/, sources in SOURCES.md).

The tests read only these copies, never a folder beside the checkout, so a fresh clone
runs the whole suite.
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
TRACES = FIXTURES / "traces"


def genuine_template(family: str) -> str:
    """A model's own chat template, copied into tests/fixtures/models/FAMILY."""
    folder = MODELS / family
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    return json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
