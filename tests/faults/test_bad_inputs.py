"""At least 60 bad inputs (issue 11: every damaged file and bad value answered in one
line): real CLI invocations and loaders on real files; each must exit non-zero (or
raise the project's error / warn), in one line naming the file or value, with no
traceback and no bare exception type. The cases live in tests/helpers/bad_inputs.py;
`python scripts/bad_inputs_table.py` regenerates the table in docs/reliability.md."""

from __future__ import annotations

import pytest

from tests.helpers.bad_inputs import CASES, PENDING, problems

ACTIVE = [c for c in CASES if c.id not in PENDING]


def test_there_are_at_least_60_and_ids_are_unique():
    assert len(ACTIVE) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", ACTIVE, ids=[c.id for c in ACTIVE])
def test_bad_input_gets_one_line_naming_it(case, tmp_path, checkpoints):
    outcome = case.run(tmp_path, lambda: checkpoints("qwen3_moe"))
    assert problems(outcome) == [], f"{case.what}: {outcome.message[:500]}"
