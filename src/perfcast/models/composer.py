"""Step composer: time every node of the workload graph with op predictors, then compose.

For each config the composer builds the workload graph
(:func:`~perfcast.features.workload.build_workload_graph`), times its nodes and composes
them through the pipeline schedule (:func:`~perfcast.features.schedule.compose_step`).

Which predictor times which node:

* compute nodes (GEMMs, vector ops, attention, embedding, optimizer) go to the op
  predictor, anything with ``predict_ops(ops, coverage) -> (pred, lo, hi)`` in ms (the
  shipped :class:`~perfcast.models.bundle.OpPredictorBundle` or
  :class:`~perfcast.models.analytic.AnalyticOpPredictor`). A bundle times the classes it
  has not learned (attention, embedding, optimizer today) with the analytic roofline and
  gives them no interval;
* collective nodes go to ``collective_predictor`` when one is given (anything with
  ``predict_ops`` as above, e.g. a bundle holding a collective model, or with
  ``predict_with_interval(X, coverage) -> (pred, (n, 2))`` such as
  :class:`~perfcast.models.collective_model.CollectiveTimeRegressor`); otherwise the
  alpha-beta time on the run's own cluster (its intra- and inter-node link figures), with
  no interval. With the analytic op predictor the composer therefore reproduces
  :func:`~perfcast.models.analytic.predict_step` exactly.

Identical ops are predicted once: rows are deduplicated by shape, dtype and device (and,
for collectives timed analytically, the cluster's link figures) across all nodes of all
configs passed to :meth:`StepComposer.compose_many`.

Interval rule (stated, DESIGN.md decision 4): per-op errors on one GPU are strongly
correlated (the op model's interval is mostly a GPU-level shift), so the step bounds
compose the per-node lower bounds and the per-node upper bounds (comonotone errors):
``step_lo = compose(lo)``, ``step_hi = compose(hi)``. A node with no interval (NaN) uses
its point time in both. ``compose_step`` is monotone in every node time, so
``step_lo_ms <= step_ms <= step_hi_ms``.

``timing_scope`` narrows what is composed, for measurements that time less than a
training step: ``"step"`` (everything), ``"fwd_bwd"`` (no data-parallel sync or
optimizer) and ``"fwd"`` (forward ops only, for inference runs).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from perfcast.errors import OutOfDomainWarning, SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.ops import COLLECTIVE_OPS, op_flops, op_memory_bytes
from perfcast.features.roofline import op_time_ms
from perfcast.features.run_config import RunConfig
from perfcast.features.schedule import StepBreakdown, compose_steps
from perfcast.features.workload import (
    NODE_COLUMNS,
    SHAPE_COLUMNS,
    Phase,
    Scope,
    WorkloadGraph,
    build_workload_graph,
)

__all__ = ["TIMING_SCOPES", "ComposedStep", "StepComposer", "composed_frame"]

TIMING_SCOPES = ("step", "fwd_bwd", "fwd")
"""What a measured time covers: a whole step, forward plus backward, or forward only."""
_COLLECTIVES = [o.value for o in COLLECTIVE_OPS]


class OpPredictor(Protocol):
    """Anything that times op-table rows: median and interval bounds in ms."""

    def predict_ops(self, ops: pd.DataFrame, coverage: float = 0.9) -> tuple[Any, Any, Any]: ...


@dataclass(frozen=True)
class ComposedStep:
    """The composed step of one config and the node times it came from.

    Attributes:
        graph: the config's workload graph (``graph.nodes`` aligns with the arrays below).
        breakdown: the step composed from the median node times, ms.
        step_lo_ms, step_hi_ms: the step composed from the node lower and upper bounds.
        node_ms, node_lo_ms, node_hi_ms: per-node time, lower and upper bound, ms (bounds
            equal ``node_ms`` where the predictor gave none); nodes outside the timing scope
            are 0.
        out_of_domain: some node in scope lies outside the op predictor's training range
            (its time extrapolates); False for predictors that do not say.
    """

    graph: WorkloadGraph
    breakdown: StepBreakdown
    step_lo_ms: float
    step_hi_ms: float
    node_ms: np.ndarray
    node_lo_ms: np.ndarray
    node_hi_ms: np.ndarray
    out_of_domain: bool = False

    @property
    def step_ms(self) -> float:
        """Composed (median) step time, ms."""
        return self.breakdown.step_ms


def composed_frame(steps: Sequence[ComposedStep]) -> pd.DataFrame:
    """One row per composed step: ``step_ms, step_lo_ms, step_hi_ms`` and the breakdown.

    Breakdown columns are ``compute_ms, bubble_ms, dp_sync_ms, optimizer_ms`` and
    ``comm_<group>_ms`` (0 where a config has no such group). This plain frame is what
    :func:`perfcast.features.run_features.featurize_runs` takes.
    """
    rows = [
        {"step_ms": s.step_ms, "step_lo_ms": s.step_lo_ms, "step_hi_ms": s.step_hi_ms, **s.breakdown.as_row()}
        for s in steps
    ]
    frame = pd.DataFrame(rows)
    comm = [c for c in frame.columns if c.startswith("comm_")]
    frame[comm] = frame[comm].fillna(0.0)
    return frame


class StepComposer:
    """Times workload-graph nodes with op predictors and composes them into steps.

    Args:
        op_predictor: times compute nodes (``predict_ops(ops, coverage) -> (pred, lo, hi)``, ms).
        collective_predictor: times collective nodes; ``None`` uses alpha-beta on the run's
            cluster (see the module docstring).
        coverage: interval coverage asked of the predictors (0.9 = the 90% interval).
        overlap_grad_reduce: hide the data-parallel sync behind the last backward.
    """

    def __init__(
        self,
        op_predictor: OpPredictor,
        collective_predictor: Any = None,
        *,
        coverage: float = 0.9,
        overlap_grad_reduce: bool = False,
    ) -> None:
        if not 0.0 < coverage < 1.0:
            raise SpecError(f"coverage={coverage!r} must be in (0, 1)")
        self.op_predictor = op_predictor
        self.collective_predictor = collective_predictor
        self.coverage = coverage
        self.overlap_grad_reduce = overlap_grad_reduce

    def compose(self, config: RunConfig, *, timing_scope: str = "step") -> ComposedStep:
        """Composed step of one config (see :meth:`compose_many`)."""
        return self.compose_many([config], timing_scopes=[timing_scope])[0]

    def compose_many(
        self, configs: Sequence[RunConfig], *, timing_scopes: Sequence[str] | None = None
    ) -> list[ComposedStep]:
        """Composed steps of many configs; every distinct op row is predicted once.

        Args:
            configs: checked configs (:func:`~perfcast.features.run_config.parse_run_row`).
            timing_scopes: per config, one of :data:`TIMING_SCOPES` (default all ``"step"``).

        Returns:
            One :class:`ComposedStep` per config, in order.

        Raises:
            SpecError: a config's layout does not fit, or an unknown timing scope.
        """
        scopes = list(timing_scopes) if timing_scopes is not None else ["step"] * len(configs)
        if len(scopes) != len(configs):
            raise SpecError(f"got {len(scopes)} timing scopes for {len(configs)} configs")
        bad = sorted(set(scopes) - set(TIMING_SCOPES))
        if bad:
            raise SpecError(f"timing_scope {bad} unknown; allowed: {', '.join(TIMING_SCOPES)}")
        if not configs:
            return []
        graphs = [build_workload_graph(c.model, c.parallel, c.cluster) for c in configs]
        pred, lo, hi, ood = self._time_nodes(configs, graphs)
        out = []
        start = 0
        for graph, scope in zip(graphs, scopes, strict=True):
            end = start + graph.num_nodes
            keep = _in_scope(graph, scope)
            ms, lo_ms, hi_ms = (np.where(keep, a[start:end], 0.0) for a in (pred, lo, hi))
            extrapolates = bool((keep & ood[start:end]).any())
            start = end
            breakdown, lo_step, hi_step = compose_steps(
                graph, [ms, lo_ms, hi_ms], overlap_grad_reduce=self.overlap_grad_reduce
            )
            out.append(
                ComposedStep(
                    graph=graph,
                    breakdown=breakdown,
                    step_lo_ms=lo_step.step_ms,
                    step_hi_ms=hi_step.step_ms,
                    node_ms=ms,
                    node_lo_ms=lo_ms,
                    node_hi_ms=hi_ms,
                    out_of_domain=extrapolates,
                )
            )
        return out

    def _time_nodes(
        self, configs: Sequence[RunConfig], graphs: Sequence[WorkloadGraph]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pred, lo, hi) of every node of every graph, concatenated in order, ms, and the
        op predictor's out-of-domain flag per node (reported per step, not warned per op)."""
        columns = {name: np.concatenate([g.column(name) for g in graphs]) for name in NODE_COLUMNS}
        sizes = [g.num_nodes for g in graphs]
        clusters = [c.cluster for c in configs]
        is_comm = np.isin(columns["op"], _COLLECTIVES)
        columns["gpu"] = np.repeat(np.array([c.gpu.id for c in clusters], dtype=object), sizes)
        # collectives timed analytically depend on the run's link figures, not on the gpu alone
        link_key = np.repeat(np.array([_link_key(c) for c in clusters], dtype=object), sizes)
        analytic_comm = is_comm & (self.collective_predictor is None)
        columns["link"] = np.where(analytic_comm, link_key, "")
        key_cols = [*SHAPE_COLUMNS, "gpu", "link"]
        keys = pd.DataFrame({name: columns[name] for name in key_cols})
        codes, _ = pd.factorize(pd.util.hash_pandas_object(keys, index=False))
        first = pd.Series(np.arange(len(codes))).groupby(codes).first().to_numpy()
        unique = {name: columns[name][first] for name in NODE_COLUMNS}  # one row per distinct op
        unique["flops"], unique["mem_bytes"] = op_flops(unique), op_memory_bytes(unique)
        ops = pd.DataFrame({**unique, "gpu": columns["gpu"][first], "link": columns["link"][first]})
        comm_u = ops["op"].isin(_COLLECTIVES).to_numpy()

        pred, lo, hi = np.full(len(ops), np.nan), np.full(len(ops), np.nan), np.full(len(ops), np.nan)
        ood = np.zeros(len(ops), dtype=bool)
        op_cols = [c for c in ops.columns if c != "link"]
        if (~comm_u).any():
            compute = ops.loc[~comm_u, op_cols]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OutOfDomainWarning)
                p, a, b = self.op_predictor.predict_ops(compute, coverage=self.coverage)
            pred[~comm_u], lo[~comm_u], hi[~comm_u] = p, a, b
            flags = getattr(self.op_predictor, "out_of_domain", None)
            if flags is not None:
                ood[~comm_u] = np.asarray(flags(compute), dtype=bool)
        if comm_u.any() and self.collective_predictor is not None:
            p, a, b = _predict_collectives(self.collective_predictor, ops.loc[comm_u, op_cols], self.coverage)
            pred[comm_u], lo[comm_u], hi[comm_u] = p, a, b
        elif comm_u.any():
            by_key = {_link_key(c): c for c in clusters}
            for key, idx in ops.loc[comm_u].groupby("link").indices.items():
                rows = np.flatnonzero(comm_u)[idx]
                pred[rows] = op_time_ms(ops.iloc[rows], by_key[key])
        lo = np.minimum(np.where(np.isnan(lo), pred, lo), pred)
        hi = np.maximum(np.where(np.isnan(hi), pred, hi), pred)
        return pred[codes], lo[codes], hi[codes], ood[codes]


def _link_key(cluster: ClusterSpec) -> str:
    """Identifies the link figures an alpha-beta collective time depends on."""
    return (
        f"{cluster.gpu.id}|{cluster.intra_node_bw_gbps}|{cluster.inter_node_bw_gbps}|"
        f"{cluster.intra_node_latency_us}|{cluster.inter_node_latency_us}"
    )


def _predict_collectives(model: Any, ops: pd.DataFrame, coverage: float) -> tuple[Any, Any, Any]:
    if hasattr(model, "predict_ops"):
        return model.predict_ops(ops, coverage=coverage)
    pred, interval = model.predict_with_interval(ops, coverage=coverage)
    return pred, interval[:, 0], interval[:, 1]


def _in_scope(graph: WorkloadGraph, timing_scope: str) -> np.ndarray:
    """Nodes a measurement of ``timing_scope`` covers."""
    if timing_scope == "step":
        return np.ones(graph.num_nodes, dtype=bool)
    if timing_scope == "fwd_bwd":
        return graph.column("scope") != Scope.STEP
    return graph.column("phase") == Phase.FORWARD
