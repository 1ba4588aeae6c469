"""Shared test setup: tests import the fixture builders as ``fixtures.make_fixtures``."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def pytest_addoption(parser):
    """``--update-golden``: rewrite the golden prediction files (tests/test_golden_predictions.py)."""
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/fixtures/golden/expected_*.csv from the current predictors",
    )
