"""What the tests share, in one place: checkpoint builders, the real server and engine
drivers, the pilot helpers, fixed events and texts.

A test module imports its helpers from here (or takes a conftest.py fixture), never from
another test_*.py module: a test file is collected and may be renamed or split, a helper
module is not (tests/test_suite_rules.py holds the rule).
"""
