"""Golden predictions: a fixed run table and op table, predicted with the shipped default
predictor and with ``analytic`` (no stored calibration), must give the stored numbers.

The inputs are ``tests/fixtures/golden/runs.csv`` (dense, MoE, uneven pipeline splits,
GB200/GB300 NVLink domains, LoRA and SFT, fp8 recipes, nvfp4, every framework, two
invalid rows) and ``ops.csv`` (every op type, precisions, collectives over one and
several nodes, two invalid rows). The expected outputs are the ``expected_*.csv`` files
beside them: every output column, numbers compared with ``rtol=1e-9``, text exactly.

A refactor must leave them unchanged. When predictions change on purpose (the default
bundle retrained, a modelling change), regenerate them and commit the diff with the
reason::

    .venv/bin/python -m pytest tests/test_golden_predictions.py --update-golden
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import perfcast

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "golden"
RTOL = 1e-9
CASES = [
    ("steps", None, "expected_steps_default.csv"),
    ("steps", "analytic", "expected_steps_analytic.csv"),
    ("ops", None, "expected_ops_default.csv"),
    ("ops", "analytic", "expected_ops_analytic.csv"),
]


def _read(path: Path) -> pd.DataFrame:
    """A golden CSV with every cell as text (empty cells stay empty strings)."""
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def predict_golden(kind: str, model: str | None) -> pd.DataFrame:
    """The output columns of ``kind``'s golden input predicted by ``model``, keyed by ``case``."""
    if kind == "steps":
        table = _read(GOLDEN / "runs.csv")
        out = perfcast.predict_steps(table, model=model, breakdown=True, calibration=False)
    else:
        table = _read(GOLDEN / "ops.csv")
        out = perfcast.predict_ops(table, model=model, calibration=False)
    added = [c for c in out.columns if c not in table.columns]
    return out[["case", *added]]


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as a CSV would hold it: floats at full precision, missing values empty."""
    text = frame.copy()
    for column in text.columns:
        values = text[column]
        if pd.api.types.is_float_dtype(values):
            text[column] = [("" if np.isnan(v) else repr(float(v))) for v in values]
        else:
            text[column] = ["" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v) for v in values]
    return text


def _compare(actual: pd.DataFrame, expected: pd.DataFrame) -> list[str]:
    """Every cell where ``actual`` and ``expected`` (both text) differ, as readable lines."""
    problems = []
    if list(actual.columns) != list(expected.columns):
        problems.append(f"columns differ: {list(actual.columns)} != {list(expected.columns)}")
        return problems
    if list(actual["case"]) != list(expected["case"]):
        return [f"cases differ: {list(actual['case'])} != {list(expected['case'])}"]
    for column in actual.columns:
        for case, got, want in zip(actual["case"], actual[column], expected[column], strict=True):
            if got == want:
                continue
            try:
                got_f, want_f = float(got), float(want)
            except ValueError:
                problems.append(f"{case}.{column}: {got!r} != {want!r}")
                continue
            if not np.isclose(got_f, want_f, rtol=RTOL, atol=0.0):
                problems.append(f"{case}.{column}: {got_f!r} != {want_f!r}")
    return problems


@pytest.mark.filterwarnings("ignore::perfcast.errors.OutOfDomainWarning")
@pytest.mark.parametrize(("kind", "model", "expected"), CASES, ids=[c[2][9:-4] for c in CASES])
def test_golden_predictions(kind: str, model: str | None, expected: str, request: pytest.FixtureRequest) -> None:
    actual = _as_text(predict_golden(kind, model))
    path = GOLDEN / expected
    if request.config.getoption("--update-golden"):
        actual.to_csv(path, index=False)
        pytest.skip(f"rewrote {path.name}")
    problems = _compare(actual, _read(path))
    assert not problems, (
        f"{len(problems)} golden cells of {path.name} changed (regenerate with --update-golden only if on purpose):\n"
        + "\n".join(problems[:40])
    )
