"""What an op predictor and a step predictor offer the composer and the front doors.

An :class:`OpPredictor` times op-table rows, a :class:`StepTimePredictor` run configs. Each
has one predict method, a ``name`` and attributes that say what its answers carry, so no
caller has to probe for methods:

* ``has_interval`` (op predictors): the bounds are an interval; False means they are NaN on
  every row (the analytic predictor);
* ``flags_out_of_domain``: the out-of-domain flags can be True, and the front doors show an
  ``out_of_domain`` column; False means every flag is False.

Both are :func:`~typing.runtime_checkable`, so ``isinstance(p, OpPredictor)`` checks that
every member is present (not its signature).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from perfcast.features.run_config import RunConfig

__all__ = ["OpPrediction", "OpPredictor", "StepTimePredictor"]


class OpPrediction(NamedTuple):
    """Per op-table row, in row order: median time and interval bounds, ms (NaN bounds where the
    predictor gives none), and whether the row lies outside the predictor's training range (bool)."""

    pred_ms: np.ndarray
    pred_lo_ms: np.ndarray
    pred_hi_ms: np.ndarray
    out_of_domain: np.ndarray


@runtime_checkable
class OpPredictor(Protocol):
    """Times checked op-table rows (DESIGN.md "Interfaces")."""

    @property
    def name(self) -> str:
        """How predictions name this predictor."""
        ...

    @property
    def has_interval(self) -> bool:
        """Whether the bounds are an interval (False: NaN on every row)."""
        ...

    @property
    def flags_out_of_domain(self) -> bool:
        """Whether a row can be flagged out of domain (False: every flag is False)."""
        ...

    def predict_ops_flagged(self, ops: pd.DataFrame, *, coverage: float = 0.9) -> OpPrediction:
        """The :class:`OpPrediction` of every row of ``ops``, the interval of nominal ``coverage``.

        Raises:
            SpecError: rows the predictor cannot time.
        """
        ...


@runtime_checkable
class StepTimePredictor(Protocol):
    """Times one training step of each run config."""

    @property
    def name(self) -> str:
        """How predictions name this predictor."""
        ...

    @property
    def flags_out_of_domain(self) -> bool:
        """Whether :meth:`predict_configs` rows carry an ``out_of_domain`` column."""
        ...

    def predict_configs(self, configs: Sequence[RunConfig], *, coverage: float = 0.9) -> pd.DataFrame:
        """One row per config, in order: ``step_ms, step_lo_ms, step_hi_ms`` (ms, the interval of
        nominal ``coverage``; NaN bounds where the predictor gives none), the step breakdown
        (``*_ms``), ``out_of_domain`` (bool) when :attr:`flags_out_of_domain`, and
        ``calibration`` (the correction applied, "" for none) from a calibrated predictor.

        Raises:
            SpecError: ``coverage`` outside (0, 1), or configs the predictor refuses.
        """
        ...
