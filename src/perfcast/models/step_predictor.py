"""Step predictors: composed op times, optionally corrected by a learned step model.

A :class:`StepPredictor` answers "how long is one training step of these configs":

1. the :class:`~perfcast.models.composer.StepComposer` times every workload-graph node
   with the op predictor (and the collective model, when there is one) and composes them
   through the pipeline schedule; every distinct op of the whole batch is predicted once;
2. a learned step model, when there is one, corrects the composed step:
   :class:`~perfcast.models.step_model.StepTimeRegressor` (GBDT on run features) or
   :class:`~perfcast.models.gnn.StepGNNRegressor` (GNN on the workload graph). Its
   interval replaces the composed one.

Physics floor (:mod:`perfcast.models.physics_bounds`): the median and both interval bounds
are raised to the step's model FLOPs at the MFU ceiling of its GPU generation and dtype
class, the step model's ``mfu_ceiling_`` (best measured MFU of its training runs + 10%),
or MFU 1 (compute at datasheet peak) for a predictor without one (analytic, composed,
bundles trained before the bound). No column names a raised row: its ``mfu`` output then
equals the ceiling.

Breakdown rule: the parts of the composed step (compute, attention, exposed communication
per group, bubble, data-parallel sync, optimizer) are first multiplied by the step model's
physical factor of their component for the config, as the step model applies it
(:meth:`~perfcast.models.step_model.StepTimeRegressor.scale_breakdown`: the stated
framework's factor where the step model fits them per training stack, else the global one;
the shrunk components at the config's extrapolation distance), then all scaled alike so
they add up to the predicted step;
``composed_step_ms`` keeps the uncorrected sum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfcast._optional import require
from perfcast.errors import SpecError
from perfcast.features.frameworks import attention_stack
from perfcast.features.run_config import RunConfig
from perfcast.features.run_features import featurize_runs
from perfcast.models.component_factors import STACK_COLUMN
from perfcast.models.composer import ComposedStep, StepComposer, composed_frame
from perfcast.models.physics_bounds import MFUCeiling, apply_floor
from perfcast.models.predictor_protocol import OpPredictor

__all__ = [
    "COMPOSED_COLUMN",
    "OUT_OF_DOMAIN_COLUMN",
    "StepPredictor",
    "stated_stacks",
    "step_features",
    "step_model_inputs",
]

COMPOSED_COLUMN = "composed_step_ms"
OUT_OF_DOMAIN_COLUMN = "out_of_domain"
"""True where a learned predictor extrapolates beyond its training GPUs or shapes (for a
step: some op of it does)."""
_STEP_COLUMNS = ("step_ms", "step_lo_ms", "step_hi_ms")


def stated_stacks(configs: Sequence[RunConfig]) -> list[str | None]:
    """Training-stack label of each config: that of the ``framework`` it states
    (:func:`~perfcast.features.frameworks.attention_stack`), None where it states none (the
    parser's default framework is not a statement about the stack's kernels)."""
    return [None if "framework" in c.defaulted else attention_stack(c.parallel.framework) for c in configs]


def step_features(
    configs: Sequence[RunConfig], composed: pd.DataFrame, releases: Sequence[Any] | None = None
) -> pd.DataFrame:
    """What a run-feature step model reads, for queries and training runs alike: the run features
    (:func:`~perfcast.features.run_features.featurize_runs`, ``releases`` passed through) plus each
    config's stated stack (:data:`STACK_COLUMN`, read by the physical factors)."""
    X = featurize_runs(configs, composed, releases)
    X[STACK_COLUMN] = pd.Series(stated_stacks(configs), index=X.index, dtype=object)
    return X


def step_model_inputs(model: Any, configs: Sequence[RunConfig], steps: Sequence[ComposedStep]) -> Any:
    """What ``model.predict`` takes for these configs: run features with the stated stack
    (:func:`step_features`), or step graphs for a GNN (a step model says which through its
    ``inputs`` class attribute)."""
    if getattr(model, "inputs", "run_features") == "graphs":
        require("torch", "torch_geometric", purpose="a GNN step model")
        from perfcast.models.gnn import step_graphs

        return step_graphs(configs, steps)
    return step_features(configs, composed_frame(steps))


class StepPredictor:
    """Composed step times of run configs, corrected by ``step_model`` when one is given: a
    :class:`~perfcast.models.predictor_protocol.StepTimePredictor`.

    Args:
        op_predictor: times compute nodes.
        collective_predictor: times collective nodes; None uses alpha-beta on the cluster.
        step_model: a fitted step model (see the module docstring) or None.
        name: how predictions name this predictor.

    Without a step model, the step bounds are NaN when the op predictor gives no interval
    (``has_interval`` False), rather than the zero-width interval its NaN bounds compose to.
    """

    def __init__(
        self,
        op_predictor: OpPredictor,
        collective_predictor: Any = None,
        step_model: Any = None,
        *,
        name: str = "composed",
    ) -> None:
        self.op_predictor = op_predictor
        self.collective_predictor = collective_predictor
        self.step_model = step_model
        self.name = name

    @property
    def flags_out_of_domain(self) -> bool:
        """Whether predictions carry an ``out_of_domain`` column (the op predictor can flag rows)."""
        return self.op_predictor.flags_out_of_domain

    @property
    def mfu_ceiling(self) -> MFUCeiling:
        """The MFU ceiling no step prediction exceeds: the step model's, else 100% of the dense peak."""
        return getattr(self.step_model, "mfu_ceiling_", None) or MFUCeiling()

    def ceilings(self, configs: Sequence[RunConfig]) -> np.ndarray:
        """MFU ceiling (fraction) of each config (:attr:`mfu_ceiling`)."""
        return self.mfu_ceiling.ceiling(configs)

    @classmethod
    def analytic(cls) -> StepPredictor:
        """Roofline op times and alpha-beta collectives composed, no learning, no interval."""
        from perfcast.models.analytic import NAME, AnalyticOpPredictor

        return cls(AnalyticOpPredictor(), name=NAME)

    def predict_configs(self, configs: Sequence[RunConfig], *, coverage: float = 0.9) -> pd.DataFrame:
        """One row per config, in order: ``step_ms, step_lo_ms, step_hi_ms``, ``composed_step_ms``
        and the breakdown columns (``compute_ms, attention_ms, bubble_ms, dp_sync_ms,
        optimizer_ms, comm_<group>_ms``), all ms; ``out_of_domain`` when the op predictor flags extrapolation.

        Raises:
            SpecError: ``coverage`` outside (0, 1).
        """
        if not 0.0 < coverage < 1.0:
            raise SpecError(f"coverage={coverage} must lie strictly between 0 and 1")
        if not configs:
            return pd.DataFrame(columns=[*_STEP_COLUMNS, COMPOSED_COLUMN])
        composer = StepComposer(self.op_predictor, self.collective_predictor, coverage=coverage)
        needs_graphs = getattr(self.step_model, "inputs", "run_features") == "graphs"
        if needs_graphs:  # a GNN reads every config's graph
            steps = composer.compose_many(configs)
            frame, out_of_domain = composed_frame(steps), np.array([s.out_of_domain for s in steps])
        else:  # column-wise, no per-config graph: the same numbers, many times faster
            frame, out_of_domain = composer.compose_table(configs)
        composed = frame["step_ms"].to_numpy(dtype=float)
        if self.step_model is not None:
            X = step_model_inputs(self.step_model, configs, steps) if needs_graphs else step_features(configs, frame)
            pred = np.asarray(self.step_model.predict(X), dtype=float)
            interval = np.asarray(self.step_model.predict_interval(X, coverage=coverage), dtype=float)
            frame["step_ms"], frame["step_lo_ms"], frame["step_hi_ms"] = pred, interval[:, 0], interval[:, 1]
        if self.step_model is None and not self.op_predictor.has_interval:
            frame["step_lo_ms"] = frame["step_hi_ms"] = np.nan
        frame["step_ms"], frame["step_lo_ms"], frame["step_hi_ms"], _ = apply_floor(
            frame["step_ms"], frame["step_lo_ms"], frame["step_hi_ms"], self.mfu_ceiling.floor_ms(configs)
        )
        parts = [c for c in frame.columns if c not in _STEP_COLUMNS]
        if getattr(self.step_model, "factors_", None) is not None:  # the physical factors' parts: their own share first
            frame = self.step_model.scale_breakdown(frame, X)
        frame[parts] = frame[parts].mul(frame["step_ms"].to_numpy() / frame[parts].sum(axis=1).to_numpy(), axis=0)
        frame.insert(3, COMPOSED_COLUMN, composed)
        if self.flags_out_of_domain:
            frame[OUT_OF_DOMAIN_COLUMN] = out_of_domain
        return frame
