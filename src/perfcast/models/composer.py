"""Step composer: time every node of the workload graph with op predictors, then compose.

For each config the composer builds the workload graph
(:func:`~perfcast.features.workload.build_workload_graph`), times its nodes and composes
them through the pipeline schedule: both routes below hand the node times of all configs
to one :class:`~perfcast.features.schedule.StepPlan`, so they compose alike.

Which predictor times which node:

* compute nodes (GEMMs, vector ops, attention, embedding, optimizer) go to the op
  predictor, an :class:`~perfcast.models.predictor_protocol.OpPredictor` (times, bounds
  and out-of-domain flags in one ``predict_ops_flagged`` call; the
  shipped :class:`~perfcast.models.bundle.PredictorBundle` or
  :class:`~perfcast.models.analytic.AnalyticOpPredictor`). A bundle times an op class it
  has no booster for (attention, in a bundle trained without attention data) with the
  analytic roofline and gives it no interval; embedding and optimizer rows are vector ops;
* collective nodes go to ``collective_predictor`` when one is given (anything with
  ``predict_with_interval(X, coverage) -> (pred, (n, 2))`` such as
  :class:`~perfcast.models.collective_model.CollectiveTimeRegressor`); otherwise the
  alpha-beta time on the run's own cluster (its intra- and inter-node link figures), with
  no interval. With the analytic op predictor the composer therefore gives the physics
  alone: roofline and alpha-beta times composed through the schedule.

Identical ops are predicted once: rows are deduplicated by shape, dtype and device (and,
for collectives timed analytically, the cluster's link figures) across all nodes of all
configs passed to :meth:`StepComposer.compose_many`, which keeps each config's graph and
node times (for training and graph models).

:meth:`StepComposer.compose_table` gives the same numbers column-wise, for batch
prediction: configs that differ only in data-parallel degree, ZeRO stage below 3, global
batch or GPU share their graph's per-microbatch body, which is built once (bodies are
remembered between calls, up to :data:`BODY_CACHE_SIZE`; interleaving and recomputation
variants derive from one body), timed once per cluster and composed for all configs at
once with numpy; no graph is built per config.

Interval rule (stated, DESIGN.md decision 4): per-op errors on one GPU are strongly
correlated (the op model's interval is mostly a GPU-level shift), so the step bounds
compose the per-node lower bounds and the per-node upper bounds (comonotone errors):
``step_lo = compose(lo)``, ``step_hi = compose(hi)``. A node with no interval (NaN) uses
its point time in both. The composition is monotone in every node time, so
``step_lo_ms <= step_ms <= step_hi_ms``.

``timing_scope`` narrows what is composed, for measurements that time less than a
training step: ``"step"`` (everything), ``"fwd_bwd"`` (no data-parallel sync or
optimizer) and ``"fwd"`` (forward ops only, for inference runs).
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from perfcast.errors import OutOfDomainWarning, SpecError
from perfcast.features.cluster import ClusterSpec
from perfcast.features.hardware_spec import HardwareSpec
from perfcast.features.model import TransformerSpec
from perfcast.features.ops import COLLECTIVE_OPS, OpClass, OpType, op_flops, op_memory_bytes
from perfcast.features.parallel import Recompute
from perfcast.features.roofline import op_time_ms
from perfcast.features.run_config import RunConfig
from perfcast.features.schedule import (
    BodyTemplate,
    StepBreakdown,
    StepPlan,
    host_ms_per_kernel,
    segment_rows,
    step_breakdowns,
)
from perfcast.features.workload import (
    NODE_COLUMNS,
    SHAPE_COLUMNS,
    Phase,
    Scope,
    WorkloadGraph,
    body_structure_key,
    build_step_ops,
    build_workload_graph,
    layers_per_rank,
    step_ops_key,
)
from perfcast.models.physics_bounds import gpu_generation
from perfcast.models.predictor_protocol import OpPredictor

__all__ = [
    "ATTENTION_BACKWARD_EFFICIENCY",
    "PRE_FA3_ATTENTION_EFFICIENCY",
    "TIMING_SCOPES",
    "ComposedStep",
    "StepComposer",
    "composed_frame",
    "measured_attention",
    "stack_attention_ms",
]

TIMING_SCOPES = ("step", "fwd_bwd", "fwd")
"""What a measured time covers: a whole step, forward plus backward, or forward only."""
_COLLECTIVES = [o.value for o in COLLECTIVE_OPS]


class _Memo:
    """A bounded, thread-safe least-recently-used memo of pure builds, kept between calls."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any, build: Callable[..., Any], *args: Any) -> Any:
        """The value of ``key``, built by ``build(*args)`` when absent."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build(*args)
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return value


BODY_CACHE_SIZE = 16_384
"""Graph bodies :meth:`StepComposer.compose_table` keeps between calls (tens of KB each):
a stream of chunks builds each distinct body about once."""
_BODIES = _Memo(BODY_CACHE_SIZE)
_BASE_BODIES = _Memo(BODY_CACHE_SIZE)
_STEP_OPS = _Memo(BODY_CACHE_SIZE)


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
        out_of_domain: some node in scope lies outside the op predictor's training range (its
            time extrapolates); False for predictors that do not say. The optimizer step is
            not counted: a streaming update over all local parameters, no op table measures
            it, and its size alone would flag every config (it is a small share of a step).
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

    Breakdown columns are ``compute_ms, attention_ms, bubble_ms, dp_sync_ms, optimizer_ms`` and
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
        op_predictor: times compute nodes (:class:`~perfcast.models.predictor_protocol.OpPredictor`).
        collective_predictor: times collective nodes; ``None`` uses alpha-beta on the run's
            cluster (see the module docstring).
        coverage: interval coverage asked of the predictors (0.9 = the 90% interval).
        overlap_grad_reduce: hide the data-parallel sync behind the last backward.
        stack_attention: time attention cores as the training stacks' kernels run them
            (:func:`stack_attention_ms`), where the op predictor's times come from measured
            kernels; ``None``: on where the op predictor learned attention from measured
            kernels (:func:`measured_attention`), off for the analytic roofline or a bundle
            without an attention model (no measured kernel to correct). False keeps the op
            predictor's times.
    """

    def __init__(
        self,
        op_predictor: OpPredictor,
        collective_predictor: Any = None,
        *,
        coverage: float = 0.9,
        overlap_grad_reduce: bool = False,
        stack_attention: bool | None = None,
    ) -> None:
        if not 0.0 < coverage < 1.0:
            raise SpecError(f"coverage={coverage!r} must be in (0, 1)")
        self.op_predictor = op_predictor
        self.collective_predictor = collective_predictor
        self.coverage = coverage
        self.overlap_grad_reduce = overlap_grad_reduce
        learned, self._backward_measured = measured_attention(op_predictor)
        self.stack_attention = learned if stack_attention is None else stack_attention

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
        keep = np.concatenate([_in_scope(g, s) for g, s in zip(graphs, scopes, strict=True)])
        ms, lo_ms, hi_ms = (np.where(keep, a, 0.0) for a in (pred, lo, hi))
        hosts = [host_ms_per_kernel(c.parallel) for c in configs]
        plan = StepPlan.from_graphs(graphs, host_ms_per_kernel=hosts, **self._switches(configs))
        median, low, high = plan.compose([ms, lo_ms, hi_ms])
        optimizer = np.concatenate([g.column("op") for g in graphs]) == OpType.OPTIMIZER.value
        extrapolates = plan.any_node(ood & keep & ~optimizer)  # see ComposedStep.out_of_domain
        ends = np.cumsum([g.num_nodes for g in graphs])
        return [
            ComposedStep(
                graph=graph,
                breakdown=breakdown,
                step_lo_ms=float(low["step_ms"][i]),
                step_hi_ms=float(high["step_ms"][i]),
                node_ms=ms[end - graph.num_nodes : end],
                node_lo_ms=lo_ms[end - graph.num_nodes : end],
                node_hi_ms=hi_ms[end - graph.num_nodes : end],
                out_of_domain=bool(extrapolates[i]),
            )
            for i, (graph, breakdown, end) in enumerate(zip(graphs, step_breakdowns(median), ends, strict=True))
        ]

    def compose_table(self, configs: Sequence[RunConfig]) -> tuple[pd.DataFrame, np.ndarray]:
        """``composed_frame(compose_many(configs))`` and each config's ``out_of_domain`` flag,
        computed column-wise (timing scope ``"step"``).

        Configs that share a graph body (:func:`~perfcast.features.workload.body_structure_key`)
        and a cluster's links share its node times: each body is built, timed and composed
        once (:class:`~perfcast.features.schedule_bodies.BodyPlan`), each distinct set of step
        nodes once; a config only adds its microbatch count. No per-config graph is kept.

        Raises:
            SpecError: a config's layout does not fit.
        """
        if not configs:
            return composed_frame([]), np.zeros(0, dtype=bool)
        batch = _Batch(configs)
        # time each distinct (base body, cluster) and (step nodes, cluster) once
        base_key = [(id(t.base), link) for t, link in zip(batch.bodies, batch.body_links, strict=True)]
        bases = dict.fromkeys(base_key)
        base_pos = {key: i for i, key in enumerate(bases)}
        by_id = {id(t.base): t.base for t in batch.bodies}
        parts = [by_id[key[0]].columns for key in bases] + batch.steps
        links = [key[1] for key in bases] + batch.step_links
        sizes = np.array([len(part["node"]) for part in parts], dtype=np.int64)
        columns = _join(parts)
        gpu = np.repeat(np.array([batch.clusters[link].gpu.id for link in links], dtype=object), sizes)
        times = self._time_rows(columns, gpu, np.repeat(np.array(links, dtype=object), sizes), batch.clusters)
        # every body's nodes are rows of its base's
        base_start = (np.cumsum(sizes) - sizes)[[base_pos[key] for key in base_key]]
        sources: dict[int, dict[str, np.ndarray]] = {}
        source = _join([sources.setdefault(id(t), {"source": t.source}) for t in batch.bodies], ("source",))["source"]
        body_rows = source + np.repeat(base_start, [t.num_nodes for t in batch.bodies])
        n_base = int(sizes[: len(bases)].sum())
        plan = StepPlan(
            batch.bodies,
            {name: columns[name][n_base:] for name in ("op", "name")},
            sizes[len(bases) :],
            body_of=batch.body_of,
            steps_of=batch.steps_of,
            num_microbatches=np.array([c.parallel.num_microbatches for c in configs]),
            host_ms_per_kernel=np.array(batch.body_hosts, dtype=float),
            body_rows=body_rows,
            step_rows=np.arange(n_base, len(columns["op"])),
            **self._switches(configs),
        )
        median, low, high = plan.compose(times[:3])
        flags = plan.any_node(times[3] & (columns["op"] != OpType.OPTIMIZER.value))  # see ComposedStep.out_of_domain
        return _table_frame(median, low["step_ms"], high["step_ms"]), flags

    def _switches(self, configs: Sequence[RunConfig]) -> dict[str, np.ndarray]:
        """Per config, the schedule switches of :class:`~perfcast.features.schedule.StepPlan`
        (the composer's ``overlap_grad_reduce`` applies to every config)."""
        return {
            "overlap_grad_reduce": np.array(
                [self.overlap_grad_reduce or c.parallel.overlap_grad_reduce for c in configs]
            ),
            "overlap_param_gather": np.array([c.parallel.overlap_param_gather for c in configs]),
        }

    def _time_nodes(
        self, configs: Sequence[RunConfig], graphs: Sequence[WorkloadGraph]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pred, lo, hi) of every node of every graph, concatenated in order, ms, and the
        op predictor's out-of-domain flag per node (reported per step, not warned per op)."""
        columns = {name: np.concatenate([g.column(name) for g in graphs]) for name in NODE_COLUMNS}
        sizes = [g.num_nodes for g in graphs]
        clusters = [c.cluster for c in configs]
        gpu = np.repeat(np.array([c.gpu.id for c in clusters], dtype=object), sizes)
        link_key = np.repeat(np.array([_link_key(c) for c in clusters], dtype=object), sizes)
        return self._time_rows(columns, gpu, link_key, {_link_key(c): c for c in clusters})

    def _time_rows(
        self,
        columns: dict[str, np.ndarray],
        gpu: np.ndarray,
        link_key: np.ndarray,
        clusters: dict[str, ClusterSpec],
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(pred, lo, hi) in ms and the out-of-domain flag of node rows ``columns`` run on
        ``gpu`` in the cluster of ``link_key`` (:func:`_link_key`, keys of ``clusters``);
        every distinct op is predicted once."""
        columns = dict(columns)
        is_comm = np.isin(columns["op"], _COLLECTIVES)
        columns["gpu"] = gpu
        # collectives timed analytically depend on the run's link figures, not on the gpu alone
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
                p, a, b, f = self.op_predictor.predict_ops_flagged(compute, coverage=self.coverage)
            pred[~comm_u], lo[~comm_u], hi[~comm_u] = p, a, b
            ood[~comm_u] = np.asarray(f, dtype=bool)
        if comm_u.any() and self.collective_predictor is not None:
            p, a, b = _predict_collectives(self.collective_predictor, ops.loc[comm_u, op_cols], self.coverage)
            pred[comm_u], lo[comm_u], hi[comm_u] = p, a, b
        elif comm_u.any():
            for key, idx in ops.loc[comm_u].groupby("link").indices.items():
                rows = np.flatnonzero(comm_u)[idx]
                pred[rows] = op_time_ms(ops.iloc[rows], clusters[key])
        lo = np.minimum(np.where(np.isnan(lo), pred, lo), pred)
        hi = np.maximum(np.where(np.isnan(hi), pred, hi), pred)
        if self.stack_attention:
            gpus = {c.gpu.id: c.gpu for c in clusters.values()}
            pred, lo, hi = (stack_attention_ms(ops, t, gpus, self._backward_measured) for t in (pred, lo, hi))
        return pred[codes], lo[codes], hi[codes], ood[codes]


ATTENTION_BACKWARD_EFFICIENCY = 63.0 / 73.0
"""Attention backward's FLOP efficiency relative to its forward's: FlashAttention-2 reaches up
to 73% of the A100's peak in the forward pass and up to 63% in the backward pass (Dao 2023,
"FlashAttention-2", arXiv:2307.08691, section 4.1). The shipped op table holds forward attention
only; an op model that learned backward rows says so (``backward_classes_``) and is not slowed."""
PRE_FA3_ATTENTION_EFFICIENCY = {"hopper": 0.35}
"""GPU generation (:func:`~perfcast.models.physics_bounds.gpu_generation`) -> best forward FLOP
efficiency (of the dtype's dense peak) of the attention kernels training stacks ran on a
generation where the op table's kernels are faster: on Hopper, FlashAttention-2 (and
PyTorch SDPA's flash backend, which is FlashAttention-2) uses no wgmma/TMA and "achieves only 35%
utilization on H100" (Shah et al. 2024, "FlashAttention-3", arXiv:2407.08608, abstract), while the
H200 op table's kernel (PyTorch 2.11 SDPA) is FlashAttention-3-class, well above that
(``benchmarks/results/docstring_notes.md``). The backward's ceiling is this times
:data:`ATTENTION_BACKWARD_EFFICIENCY`."""


def measured_attention(op_predictor: Any) -> tuple[bool, bool]:
    """``(learned, with_backward)``: whether ``op_predictor`` times attention with a model learned
    from measured kernels, and whether its training rows held backward attention. A predictor
    wrapping another (``.base``) is looked through; the analytic roofline, and a bundle without an
    attention model (its attention falls back to the roofline), learned none."""
    while getattr(op_predictor, "base", op_predictor) is not op_predictor:
        op_predictor = op_predictor.base
    op_model = getattr(op_predictor, "op_model", None)
    learned = OpClass.ATTENTION.value in (getattr(op_model, "boosters_", None) or {})
    return learned, learned and OpClass.ATTENTION.value in getattr(op_model, "backward_classes_", ())


def stack_attention_ms(
    ops: pd.DataFrame, ms: np.ndarray, gpus: Mapping[str, HardwareSpec], backward_measured: bool = False
) -> np.ndarray:
    """Attention-core times ``ms`` (aligned with ``ops``; other rows unchanged) as a training
    stack's kernels take them: a backward row is slower per FLOP than the forward the op table
    measured (:data:`ATTENTION_BACKWARD_EFFICIENCY`; not where ``backward_measured``, the op
    model having learned backward rows), and on a generation of
    :data:`PRE_FA3_ATTENTION_EFFICIENCY` no row runs above that efficiency of its dtype's dense
    peak (``gpus``: GPU id -> its spec)."""
    attn = (ops["op"] == OpType.ATTENTION.value).to_numpy()
    if not attn.any():
        return ms
    out = np.asarray(ms, dtype=float).copy()
    backward = ops["backward"].fillna(False).to_numpy(dtype=bool)
    eff = np.where(backward, ATTENTION_BACKWARD_EFFICIENCY, 1.0)
    if not backward_measured:
        out[attn] = out[attn] / eff[attn]
    rows = np.flatnonzero(attn)
    keys = list(zip(ops["gpu"].to_numpy()[rows], ops["dtype"].to_numpy()[rows], strict=True))
    ceiling_flops = {}  # (gpu, dtype) -> the ceiling's FLOP/s, each pair looked up once
    for gpu_id, dtype in set(keys):
        gpu = gpus.get(gpu_id)
        eta = None if gpu is None else PRE_FA3_ATTENTION_EFFICIENCY.get(gpu_generation(gpu))
        ceiling_flops[(gpu_id, dtype)] = np.nan if eta is None else eta * gpu.peak_tflops(dtype) * 1e12
    rate = np.array([ceiling_flops[k] for k in keys]) * eff[rows]
    floor_ms = ops["flops"].to_numpy(dtype=float)[rows] / rate * 1e3
    out[rows] = np.where(np.isnan(floor_ms), out[rows], np.fmax(out[rows], floor_ms))
    return out


def _join(parts: Sequence[Mapping[str, np.ndarray]], names: Sequence[str] = NODE_COLUMNS) -> dict[str, np.ndarray]:
    """Columns ``names`` of ``parts`` concatenated; parts repeat (the same object), so each
    distinct one is joined once and its rows gathered."""
    position: dict[int, int] = {}
    distinct: list[Mapping[str, np.ndarray]] = []
    for part in parts:
        if id(part) not in position:
            position[id(part)] = len(distinct)
            distinct.append(part)
    rows = segment_rows([len(part[names[0]]) for part in distinct], [position[id(part)] for part in parts])
    return {name: np.concatenate([part[name] for part in distinct])[rows] for name in names}


class _Batch:
    """Configs grouped by what they share: graph bodies and step nodes, each on a cluster.

    Attributes:
        clusters: one cluster per link key (:func:`_link_key`).
        bodies, body_links, body_hosts: each distinct (body, cluster, host time per kernel: 0 under
            CUDA graphs) of the batch; ``body_of`` maps configs to them.
        steps, step_links: each distinct (step nodes, cluster); ``steps_of`` maps configs to them.
    """

    def __init__(self, configs: Sequence[RunConfig]) -> None:
        link_of: dict[int, str] = {}
        model_of: dict[int, int] = {}  # model object -> number of its model: keys hash a model once
        models: dict[TransformerSpec, int] = {}
        self.clusters: dict[str, ClusterSpec] = {}
        templates: dict[tuple[Any, ...], int] = {}
        step_sets: dict[tuple[Any, ...], int] = {}
        shape_of: dict[tuple[int, int, int], tuple[int, int]] = {}  # (model, layout, gpus per node) objects
        template_list: list[BodyTemplate] = []
        step_list: list[dict[str, np.ndarray]] = []
        bodies: dict[tuple[int, str, float], int] = {}
        steps: dict[tuple[int, str], int] = {}
        self.body_of = np.empty(len(configs), dtype=np.int64)
        self.steps_of = np.empty(len(configs), dtype=np.int64)
        for i, c in enumerate(configs):
            cluster, p = c.cluster, c.parallel
            link = link_of.get(id(cluster))
            if link is None:
                link = link_of[id(cluster)] = _link_key(cluster)
                self.clusters.setdefault(link, cluster)
            gpn = cluster.nvlink_domain
            shape = shape_of.get((id(c.model), id(p), gpn))
            if shape is None:
                model = model_of.get(id(c.model))
                if model is None:
                    model = model_of[id(c.model)] = models.setdefault(c.model, len(models))
                bkey = (model, body_structure_key(p, gpn), p.vpp, p.recompute)
                if bkey not in templates:
                    templates[bkey] = len(template_list)
                    template_list.append(_BODIES.get((c.model, *bkey[1:]), _body_template, c))
                skey = (model, step_ops_key(p, gpn))
                if skey not in step_sets:
                    step_sets[skey] = len(step_list)
                    step_list.append(_STEP_OPS.get((c.model, skey[1]), build_step_ops, c.model, p, cluster))
                shape = shape_of[(id(c.model), id(p), gpn)] = (templates[bkey], step_sets[skey])
            self.body_of[i] = bodies.setdefault((shape[0], link, host_ms_per_kernel(p)), len(bodies))
            self.steps_of[i] = steps.setdefault((shape[1], link), len(steps))
        self.bodies = [template_list[k] for k, _, _ in bodies]
        self.body_links = [link for _, link, _ in bodies]
        self.body_hosts = [host for _, _, host in bodies]
        self.steps = [step_list[k] for k, _ in steps]
        self.step_links = [link for _, link in steps]


def _body_template(config: RunConfig) -> BodyTemplate:
    """The body of ``config``, from the remembered body without recomputation (of the same
    layers per pipeline rank: an uneven split can change with ``vpp``)."""
    p = config.parallel
    key = (config.model, body_structure_key(p, config.cluster.nvlink_domain), layers_per_rank(config.model, p))
    return _BASE_BODIES.get(key, _base_body, config).variant(p.vpp, p.recompute)


def _base_body(config: RunConfig) -> BodyTemplate:
    parallel = config.parallel.model_copy(update={"recompute": Recompute.NONE})
    return BodyTemplate.from_graph(build_workload_graph(config.model, parallel, config.cluster))


def _table_frame(parts: dict[str, np.ndarray], lo_ms: np.ndarray, hi_ms: np.ndarray) -> pd.DataFrame:
    """The :func:`composed_frame` of column-wise breakdowns: the same columns in the same order."""
    frame = {"step_ms": parts["step_ms"], "step_lo_ms": lo_ms, "step_hi_ms": hi_ms}
    frame.update({k: parts[k] for k in ("compute_ms", "attention_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms")})
    comm = {k: v for k, v in parts.items() if k.startswith("comm_") and not np.isnan(v).all()}
    # composed_frame's rows list their groups sorted; its columns follow first appearance
    first_row = {k: int(np.flatnonzero(~np.isnan(v))[0]) for k, v in comm.items()}
    for k in sorted(comm, key=lambda k: (first_row[k], k)):
        frame[k] = np.nan_to_num(comm[k], nan=0.0)
    return pd.DataFrame(frame)


def _link_key(cluster: ClusterSpec) -> str:
    """Identifies the link figures an alpha-beta collective time depends on."""
    return (
        f"{cluster.gpu.id}|{cluster.intra_node_bw_gbps}|{cluster.inter_node_bw_gbps}|"
        f"{cluster.intra_node_latency_us}|{cluster.inter_node_latency_us}"
    )


def _predict_collectives(model: Any, ops: pd.DataFrame, coverage: float) -> tuple[Any, Any, Any]:
    pred, interval = model.predict_with_interval(ops, coverage=coverage)
    return pred, interval[:, 0], interval[:, 1]


def _in_scope(graph: WorkloadGraph, timing_scope: str) -> np.ndarray:
    """Nodes a measurement of ``timing_scope`` covers."""
    if timing_scope == "step":
        return np.ones(graph.num_nodes, dtype=bool)
    if timing_scope == "fwd_bwd":
        return graph.column("scope") != Scope.STEP
    return graph.column("phase") == Phase.FORWARD
