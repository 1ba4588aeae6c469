"""The per-microbatch part of a training step, vectorised over many workload graphs.

A graph's *body* is every node but the once-per-step ones (``step`` scope).
:class:`BodyTemplate` reads a body's node columns into the masks and multiplicities the
schedule needs, and :class:`BodyPlan` applies the pipeline-schedule rules stated in
:mod:`perfcast.features.schedule` ("the schedule rules" below) to many bodies at once with
numpy. Units: ms.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import numpy as np

from perfcast.features.parallel import Recompute
from perfcast.features.workload import (
    NODE_COLUMNS,
    OVERLAP_PREVIOUS_LAYER,
    Group,
    Phase,
    Scope,
    WorkloadGraph,
    body_variant,
    replay_weights,
)

COMPUTE = "compute"
ATTENTION_CORE = "attn.core"
"""Name prefix of the attention-core nodes (fused or not, full or windowed), whose time
the breakdown reports apart as ``attention_ms``."""

HOST_MS_PER_KERNEL = 0.075
"""Host time to issue one graph node's kernel in an eager training framework, ms (see the schedule rules)."""


def param_gather_exposed_ms(gather_ms: np.ndarray, forward_ms: np.ndarray, layers: np.ndarray) -> np.ndarray:
    """Exposed part of a ZeRO-1/2 parameter all-gather of ``gather_ms`` under ``overlap_param_gather``, ms.

    ``gather_ms / L + max(0, gather_ms - forward_ms) * (L - 1) / L``: the first of the
    stage's ``L`` layers waits for its share, the rest hides behind the forward compute
    ``forward_ms`` of one microbatch's ``L`` layers (see the schedule rules).
    """
    n = np.maximum(np.asarray(layers, dtype=float), 1.0)
    return gather_ms / n + np.maximum(gather_ms - forward_ms, 0.0) * (n - 1.0) / n


def _layer_kind(scope: np.ndarray) -> np.ndarray:
    """Per node: 0 in a dense layer, 2 in an MoE layer, -1 elsewhere."""
    return np.where(scope == Scope.LAYER, 0, np.where(scope == Scope.MOE_LAYER, 2, -1))


def _layer_pass(kind: np.ndarray, not_forward: np.ndarray) -> np.ndarray:
    """Per node: the layer pass its time counts in for prefetched gathers (dense or MoE,
    forward or backward with recomputation: 0..3), -1 outside layers."""
    return np.where(kind >= 0, kind + not_forward, -1)


def _prefetch_budget(
    layer_pass: np.ndarray, compute: np.ndarray, seg: np.ndarray, num_bodies: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """What :func:`_exposed` needs for prefetched gathers: each node's (body, layer pass)
    index (-1 outside layers), which nodes' compute time counts, and the number of indices."""
    index = np.where(layer_pass >= 0, seg * 4 + layer_pass, -1)
    return index, compute & (layer_pass >= 0), num_bodies * 4


def _exposed(
    overlap: np.ndarray, op_ms: np.ndarray, budget: tuple[np.ndarray, np.ndarray, int], repeat: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """Per node, the time exposed at each occurrence and, for prefetched gathers, the part
    exposed once per microbatch and pass (the first layer's: ``min(g, C)``, None when no
    node is prefetched), ms; see the schedule rules. ``repeat``: each node's occurrences per layer;
    a node hides behind its partner's time per occurrence of the node (``op_ms * repeat`` of the
    partner over the node's ``repeat``: a collective replayed on every layer beside a GEMM that
    ``op-sac`` replays on half of them hides behind half the GEMM)."""
    partner = np.clip(overlap, 0, None)
    hidden_by = np.where(overlap >= 0, op_ms[partner] * repeat[partner] / repeat, 0.0)
    prefetched = overlap == OVERLAP_PREVIOUS_LAYER
    once = None
    if prefetched.any():
        index, counts, size = budget
        work = op_ms * repeat
        layer_ms = np.bincount(index[counts], work[counts], minlength=size)
        hidden_by = np.where(prefetched, layer_ms[np.clip(index, 0, None)], hidden_by)
        once = np.where(prefetched, np.minimum(op_ms, hidden_by), 0.0)
    return np.maximum(op_ms - hidden_by, 0.0), once


class BodyPlan:
    """The pipeline schedule (the schedule rules) of many graphs' per-microbatch parts ("bodies"), vectorised.

    The schedule of a step splits in two: the per-microbatch stages (every node but the
    ``step`` scope), which fix the stage times, the bubble and the exposed communication
    per microbatch (:meth:`stages`); and the once-per-step nodes (gradient sync, optimizer),
    which add to the pipeline's time (:meth:`finish`). Many configs share one body (they
    differ only in data-parallel degree, ZeRO stage below 3, global batch), so bodies are
    composed once each, with numpy over all bodies at once, and :meth:`finish` adds each
    config's microbatch count and step nodes. :class:`StepPlan` drives both for whole steps.

    Args:
        bodies: one :class:`BodyTemplate` per body (bodies that differ only in their node
            times, e.g. their GPU, repeat one template).
    """

    def __init__(self, bodies: Sequence[BodyTemplate]) -> None:
        self.num_bodies = len(bodies)
        position: dict[int, int] = {}  # each distinct template's arrays are joined once, then gathered
        templates: list[BodyTemplate] = []
        for t in bodies:
            if id(t) not in position:
                position[id(t)] = len(templates)
                templates.append(t)
        self.group_names = sorted({name for t in templates for name in t.group_names})
        code = {name: i for i, name in enumerate(self.group_names)}
        sizes = np.array([t.num_nodes for t in bodies], dtype=np.int64)
        rows = segment_rows([t.num_nodes for t in templates], [position[id(t)] for t in bodies])
        self.seg = np.repeat(np.arange(len(bodies)), sizes)

        def cat(name: str) -> np.ndarray:
            return np.concatenate([t.arrays[name] for t in templates])[rows] if templates else np.zeros(0)

        overlap = cat("overlap").astype(np.int64)  # a node of the same body (or OVERLAP_PREVIOUS_LAYER)
        self.overlap = np.where(overlap >= 0, overlap + np.repeat(np.cumsum(sizes) - sizes, sizes), overlap)
        self.num_layers = np.array([sum(t.layers) for t in bodies], dtype=float)
        self.repeat, self.mult = cat("repeat"), cat("mult")
        self.kernels = self.repeat * self.mult
        self.pp = np.array([t.pp for t in bodies], dtype=np.int64)
        self.vpp = np.array([t.vpp for t in bodies], dtype=np.int64)
        self.overlap_p2p = (self.vpp > 1) & (self.pp > 1)
        body = cat("body").astype(bool)
        hidden_p2p = cat("pp_xfer").astype(bool) & self.overlap_p2p[self.seg]  # interleaved p2p: timed apart
        self.body, self.first, self.last = body, cat("first").astype(bool), cat("last").astype(bool)
        self.on_stage = body & ~hidden_p2p
        self.xfer = body & hidden_p2p
        comm = cat("comm").astype(bool)
        self.attention = cat("attention").astype(bool)
        codes = [np.array([code.get(g, -1) for g in t.arrays["group"]], dtype=np.int64) for t in templates]
        self.group_code = np.concatenate(codes)[rows] if templates else np.zeros(0, np.int64)
        self.comm_body, self.comm_first, self.comm_last = comm & self.on_stage, comm & self.first, comm & self.last
        self.not_forward = cat("not_forward").astype(bool)
        layer_pass = _layer_pass(cat("layer_kind").astype(np.int64), self.not_forward)
        self.budget = _prefetch_budget(layer_pass, ~comm, self.seg, self.num_bodies)
        self.layer_forward = (layer_pass >= 0) & ~self.not_forward & ~comm
        # uneven bodies: one row per pipeline rank (body, dense layers, MoE layers, first, last)
        uneven = [(i, t.stage_layers) for i, t in enumerate(bodies) if t.stage_layers is not None]
        self.rank_body = np.array([i for i, ranks in uneven for _ in ranks], dtype=np.int64)
        counts = np.array([layers for _, ranks in uneven for layers in ranks], dtype=float).reshape(-1, 2)
        self.rank_dense, self.rank_moe = counts[:, 0], counts[:, 1]
        rank = np.concatenate([np.arange(len(ranks)) for _, ranks in uneven]) if uneven else np.zeros(0, np.int64)
        self.rank_first, self.rank_last = rank == 0, rank == self.pp[self.rank_body] - 1
        if uneven:
            self.layer, self.moe_layer = cat("layer").astype(bool), cat("moe_layer").astype(bool)

    def _sum(self, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.seg[mask], values[mask], minlength=self.num_bodies)

    def _group_sum(self, mask: np.ndarray, values: np.ndarray) -> np.ndarray:
        """(bodies, groups) sums of ``values`` over the nodes of ``mask``."""
        n_groups = len(self.group_names)
        index = self.seg[mask] * n_groups + self.group_code[mask]
        return np.bincount(index, values[mask], minlength=self.num_bodies * n_groups).reshape(self.num_bodies, n_groups)

    def stages(
        self, op_ms: np.ndarray, host_ms_per_kernel: float | np.ndarray = HOST_MS_PER_KERNEL
    ) -> dict[str, np.ndarray]:
        """Per-body schedule terms from the node times ``op_ms`` (ms, the bodies' nodes concatenated).

        ``host_ms_per_kernel``: the dispatch floor's host time per kernel, ms, for all bodies
        or per body (0 for a body run under CUDA graphs).

        Returns arrays over bodies: ``slowest_ms`` (the slowest stage's microbatch time),
        ``fixed_ms`` (fill, drain and interleaved transfers: the pipeline minus
        ``m * slowest_ms``), ``attention_ms`` (the slowest stage's attention-core time per
        microbatch), ``pp_exposed_ms`` (the slowest stage's exposed interleaved
        transfer), ``last_backward_ms``, ``forward_ms`` (the forward compute of one
        microbatch's layers on the busiest stage); and over (bodies, groups) ``comm_ms`` and
        ``comm_present`` (the exposed communication per microbatch of each group in
        :attr:`group_names`, and whether the busiest stage has such nodes).
        """
        op_ms = np.asarray(op_ms, dtype=float)
        host = np.broadcast_to(np.asarray(host_ms_per_kernel, dtype=float), (self.num_bodies,))
        node_exposed, once = _exposed(self.overlap, op_ms, self.budget, self.repeat)
        weighted = node_exposed * self.repeat * self.mult
        if once is not None:  # prefetched gathers: the first layer's part, once per microbatch
            once = once * self.repeat
            weighted = weighted + once * (self.mult > 0)
        stage_body, stage_first, stage_last = (self._sum(m, weighted) for m in (self.on_stage, self.first, self.last))
        xfer = np.where(self.overlap_p2p, self._sum(self.xfer, weighted), 0.0)
        k_body, k_first, k_last = (self._sum(m, self.kernels) for m in (self.body, self.first, self.last))
        one = self.pp == 1
        gpu = [np.where(one, stage_body + stage_first + stage_last, stage_body + stage_first), stage_body,
               stage_body + stage_last]  # fmt: skip  # first, middle and last stage
        exposed = [np.maximum(xfer - g, 0.0) for g in gpu]
        gpu = [g + e for g, e in zip(gpu, exposed, strict=True)]
        kernels = [np.where(one, k_body + k_first + k_last, k_body + k_first), k_body, k_body + k_last]
        first, middle, last = (np.maximum(g, k * host) for g, k in zip(gpu, kernels, strict=True))
        has_middle, has_last = self.pp > 2, ~one
        # np.argmax over [first, middle * (pp - 2), last]: the first stage of the largest time
        slowest_ms = np.maximum(first, np.where(has_middle, middle, -np.inf))
        slowest_ms = np.where(has_last, np.maximum(slowest_ms, last), slowest_ms)
        is_first = first >= slowest_ms
        is_middle = ~is_first & has_middle & (middle >= slowest_ms)
        pp_exposed = np.where(is_first, exposed[0], np.where(is_middle, exposed[1], exposed[2]))
        stall = slowest_ms - np.where(is_first, gpu[0], np.where(is_middle, gpu[1], gpu[2]))
        total = first + np.where(has_middle, (self.pp - 2) * middle, 0.0) + np.where(has_last, last, 0.0)
        fixed = (total - slowest_ms) / self.vpp + (self.pp - 1) * xfer / self.vpp

        busiest_first = one | (stage_first >= stage_last)  # the busiest end stage (both when pp == 1)
        busiest_last = one | ~busiest_first
        comm = self._group_sum(self.comm_body, weighted)
        count = self._group_sum(self.comm_body, np.ones(len(weighted)))
        for mask, on in ((self.comm_first, busiest_first), (self.comm_last, busiest_last)):
            comm = comm + np.where(on[:, None], self._group_sum(mask, weighted), 0.0)
            count = count + np.where(on[:, None], self._group_sum(mask, np.ones(len(weighted))), 0.0)
        nf = self.not_forward
        last_backward = self._sum(self.body & nf, weighted)
        last_backward += np.where(busiest_first, self._sum(self.first & nf, weighted), 0.0)
        last_backward += np.where(busiest_last, self._sum(self.last & nf, weighted), 0.0)
        out = {"slowest_ms": slowest_ms, "fixed_ms": fixed, "pp_exposed_ms": pp_exposed,
               "last_backward_ms": last_backward, "comm_ms": comm, "comm_present": count > 0,
               "stall_ms": stall, "forward_ms": self._sum(self.layer_forward, weighted),
               "attention_ms": self._sum(self.on_stage & self.attention, weighted)}  # fmt: skip
        if len(self.rank_body):
            self._uneven_stages(out, node_exposed * self.repeat, once, xfer, host)
        return out

    def _uneven_stages(
        self,
        out: dict[str, np.ndarray],
        unit_ms: np.ndarray,
        once_ms: np.ndarray | None,
        xfer: np.ndarray,
        host_ms_per_kernel: np.ndarray,
    ) -> None:
        """Overwrite ``out`` (:meth:`stages`) for the bodies whose ranks hold layers of their own.

        ``unit_ms`` is each node's exposed time times its repeat, once (no layer
        multiplicity); ``once_ms`` the first layer's part of prefetched gathers, which a rank
        adds once per layer kind it holds (None: none). Each body's sums per dense layer, per
        MoE layer, per stage and per end stage are taken once; a rank's microbatch time is
        its layers times those sums (see the schedule rules), and the slowest rank (the first
        of equals) gives the rest.
        """
        b = self.rank_body
        ends = self.first | self.last
        parts = (self.layer, self.moe_layer, self.body & ~self.layer & ~self.moe_layer, self.first, self.last)
        weight = np.stack([self.rank_dense, self.rank_moe, np.ones(len(b)), self.rank_first, self.rank_last], axis=1)
        holds = (weight[:, :2] > 0).astype(float)  # the rank holds dense / MoE layers

        def sums(on: np.ndarray, values: np.ndarray) -> np.ndarray:
            """(bodies, parts): the sums of ``values`` over the nodes of ``on`` in each part."""
            return np.stack([self._sum(part & on, values) for part in parts], axis=1)

        def first_layer(on: np.ndarray) -> np.ndarray:
            """Per rank, the once-per-microbatch part of its prefetched gathers among nodes ``on``."""
            if once_ms is None:
                return np.zeros(len(b))
            kinds = np.stack([self._sum(part & on, once_ms) for part in parts[:2]], axis=1)
            return (kinds[b] * holds).sum(axis=1)

        gpu = (sums(self.on_stage | ends, unit_ms)[b] * weight).sum(axis=1) + first_layer(self.on_stage)
        exposed = np.maximum(xfer[b] - gpu, 0.0)  # interleaved p2p: only what outlasts the compute
        gpu = gpu + exposed
        kernels = (sums(self.body | ends, self.repeat)[b] * weight).sum(axis=1)
        stage_ms = np.maximum(gpu, kernels * host_ms_per_kernel[b])
        slowest = np.full(self.num_bodies, -np.inf)
        np.maximum.at(slowest, b, stage_ms)
        at_max = np.flatnonzero(stage_ms >= slowest[b])
        s = at_max[np.unique(b[at_max], return_index=True)[1]]  # each body's first slowest rank
        bodies, w = b[s], weight[s]
        total = np.bincount(b, stage_ms, minlength=self.num_bodies)[bodies]
        pp, vpp = self.pp[bodies], self.vpp[bodies]
        out["slowest_ms"][bodies] = slowest[bodies]
        out["fixed_ms"][bodies] = (total - slowest[bodies]) / vpp + (pp - 1) * xfer[bodies] / vpp
        out["pp_exposed_ms"][bodies] = exposed[s]
        out["stall_ms"][bodies] = stage_ms[s] - gpu[s]
        out["attention_ms"][bodies] = (sums(self.attention, unit_ms)[bodies] * w).sum(1)
        out["last_backward_ms"][bodies] = (sums((self.body | ends) & self.not_forward, unit_ms)[bodies] * w).sum(1)
        out["last_backward_ms"][bodies] += first_layer(self.body & self.not_forward)[s]
        comm = self.comm_body | self.comm_first | self.comm_last
        ones = np.ones(len(unit_ms))
        comm_ms = sum(w[:, j, None] * self._group_sum(comm & part, unit_ms)[bodies] for j, part in enumerate(parts))
        if once_ms is not None:
            comm_ms = comm_ms + sum((w[:, j, None] > 0) * self._group_sum(comm & part, once_ms)[bodies]
                                    for j, part in enumerate(parts[:2]))  # fmt: skip
        count = sum((w[:, j, None] > 0) * self._group_sum(comm & part, ones)[bodies] for j, part in enumerate(parts))
        out["comm_ms"][bodies] = comm_ms
        out["comm_present"][bodies] = count > 0

    def finish(
        self,
        stages: dict[str, np.ndarray],
        body: np.ndarray,
        num_microbatches: np.ndarray,
        dp_sync_ms: np.ndarray,
        optimizer_ms: np.ndarray,
        param_gather_ms: np.ndarray,
        *,
        overlap_grad_reduce: np.ndarray,
        overlap_param_gather: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """Breakdown columns of configs from :meth:`stages`: config ``i`` runs body ``body[i]``
        with ``num_microbatches[i]`` microbatches and its step nodes.

        Args:
            stages: :meth:`stages` of the bodies.
            body, num_microbatches: per config, its body and microbatch count.
            dp_sync_ms, optimizer_ms: per config, the summed times of its step nodes other
                than the optimizer and of its optimizer step, ms.
            param_gather_ms: per config, the ZeRO-1/2 parameter all-gather within
                ``dp_sync_ms``, ms.
            overlap_grad_reduce: per config, hide the data-parallel sync behind the last backward.
            overlap_param_gather: per config, time the parameter all-gather behind the next
                forward (:func:`param_gather_exposed_ms`).

        Returns:
            ``step_ms, compute_ms, attention_ms, bubble_ms, dp_sync_ms, optimizer_ms``,
            ``comm_<group>_ms`` (NaN where the config has no such group) and
            ``host_stall_ms`` (within ``compute_ms``), arrays over configs.
        """
        m = np.asarray(num_microbatches, dtype=float)
        slowest = stages["slowest_ms"][body]
        pipeline = m * slowest + stages["fixed_ms"][body]
        comm_ms: dict[str, np.ndarray] = {}
        overlap_p2p = self.overlap_p2p[body]
        for j, group in enumerate(self.group_names):
            present = stages["comm_present"][body, j]
            if group == Group.PP:
                present = present & ~overlap_p2p
            comm_ms[group] = np.where(present, m * stages["comm_ms"][body, j], np.nan)
        if overlap_p2p.any():
            pp = np.where(overlap_p2p, m * stages["pp_exposed_ms"][body], np.nan)
            comm_ms[Group.PP] = np.where(np.isnan(pp), comm_ms.get(Group.PP, np.nan), pp)
        exposed_comm = np.zeros(len(m))
        for values in comm_ms.values():
            exposed_comm = exposed_comm + np.nan_to_num(values)
        dp_sync = np.asarray(dp_sync_ms, dtype=float)
        hide = np.asarray(overlap_grad_reduce, dtype=bool)
        dp_sync = np.where(hide, np.maximum(0.0, dp_sync - stages["last_backward_ms"][body]), dp_sync)
        # what is left of the parameter gather hides behind the next forward
        left = np.minimum(dp_sync, np.where(np.asarray(overlap_param_gather, dtype=bool), param_gather_ms, 0.0))
        exposed = param_gather_exposed_ms(left, stages["forward_ms"][body], self.num_layers[body])
        dp_sync = dp_sync - left + exposed
        optimizer = np.asarray(optimizer_ms, dtype=float)
        attention = m * stages["attention_ms"][body]
        return {
            "step_ms": pipeline + dp_sync + optimizer,
            "compute_ms": m * slowest - exposed_comm - attention,
            "attention_ms": attention,
            "bubble_ms": pipeline - m * slowest,
            "dp_sync_ms": dp_sync,
            "optimizer_ms": optimizer,
            **{f"comm_{group}_ms": values for group, values in sorted(comm_ms.items())},
            "host_stall_ms": m * stages["stall_ms"][body],
        }


def segment_rows(sizes: Sequence[int], which: Sequence[int]) -> np.ndarray:
    """Rows of a concatenation of segments (of ``sizes`` rows) that spell segments ``which``, in turn.

    ``np.concatenate([segments[k] for k in which])`` equals ``np.concatenate(segments)[segment_rows(...)]``.
    """
    sizes, which = np.asarray(sizes, dtype=np.int64), np.asarray(which, dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    picked = sizes[which] if len(which) else np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts[which] - (np.cumsum(picked) - picked), picked) if len(which) else picked
    return np.arange(int(picked.sum())) + offsets


class BodyTemplate:
    """A graph's per-microbatch nodes (all but the ``step`` scope), as :class:`BodyPlan` reads them.

    A template either holds its nodes (``columns``), or is a variant of a ``base``
    template (:meth:`variant`): its nodes are rows ``source`` of the base's, so the base's
    node times give its own.

    Args:
        columns: the nodes' ``NODE_COLUMNS`` (what timing them needs).
        layers: dense and MoE layers on the busiest stage.
        pp, vpp: the pipeline schedule's parameters.
        stage_layers: ``(dense, moe)`` layers of each pipeline rank when ranks differ
            (``WorkloadGraph.stage_layers``); ``None`` when every rank holds ``layers``.

    Attributes:
        arrays: per-node masks and multiplicities derived from the node columns.
        group_names: process groups of the body's collectives.
        base, source: the template holding the node columns these nodes are rows of
            (itself when it holds its nodes), and which rows. A variant's ``columns``
            are its base's: time ``base.columns`` and gather ``source``.
    """

    def __init__(
        self,
        columns: dict[str, np.ndarray],
        *,
        layers: tuple[int, int],
        pp: int,
        vpp: int,
        stage_layers: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        self.columns, self.layers, self.pp, self.vpp = columns, layers, pp, vpp
        self.stage_layers = stage_layers
        scope, groups = columns["scope"], columns["group"]
        self.num_nodes = len(scope)
        self.base, self.source = self, np.arange(self.num_nodes)
        comm = columns["stream"] != COMPUTE
        layer, moe = scope == Scope.LAYER, scope == Scope.MOE_LAYER
        self.arrays = {
            "mult": np.where(layer, float(layers[0]), np.where(moe, float(layers[1]), 1.0)),
            "layer": layer,
            "moe_layer": moe,
            "layer_kind": _layer_kind(scope),
            "body": layer | moe | (scope == Scope.STAGE),
            "first": scope == Scope.FIRST_STAGE,
            "last": scope == Scope.LAST_STAGE,
            "pp_xfer": groups == Group.PP,
            "comm": comm,
            "attention": _attention_nodes(columns["name"], comm),
            "group": groups,
            **_schedule_arrays(columns),
        }
        self.group_names = sorted(set(groups[comm]))
        self._replayed: dict[Recompute, np.ndarray] = {}

    @classmethod
    def from_graph(cls, graph: WorkloadGraph) -> BodyTemplate:
        """The body of ``graph`` (:func:`build_workload_graph` appends the step nodes last)."""
        n = int((graph.column("scope") != Scope.STEP).sum())
        columns = {name: graph.column(name)[:n].copy() for name in NODE_COLUMNS}
        layers = (graph.dense_layers_per_stage, graph.moe_layers_per_stage)
        return cls(columns, layers=layers, pp=graph.pp, vpp=graph.vpp, stage_layers=graph.stage_layers)

    def variant(self, vpp: int, recompute: Recompute) -> BodyTemplate:
        """The body of the same config with ``vpp`` and ``recompute``; this template must hold
        its nodes and recompute none (see :func:`~perfcast.features.workload.body_variant`).
        The layers per stage stay this template's: an uneven split, which depends on ``vpp``,
        needs a base body of its own ``vpp``."""
        if recompute not in self._replayed:
            self._replayed[recompute] = replay_weights(self.columns, recompute)
        source, changed = body_variant(self.columns, vpp, self._replayed[recompute])
        out = copy.copy(self)
        out.vpp, out.base, out.source, out.num_nodes = vpp, self, source, len(source)
        out.arrays = {name: values[source] for name, values in self.arrays.items()}
        out.arrays.update(_schedule_arrays(changed))
        out._replayed = {}
        return out


def _attention_nodes(names: np.ndarray, comm: np.ndarray) -> np.ndarray:
    """Per node: an attention core (:data:`ATTENTION_CORE`) on the compute stream."""
    return np.char.startswith(names.astype(str), ATTENTION_CORE) & ~comm


def _schedule_arrays(columns: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays of a :class:`BodyTemplate` that a variant changes: from ``repeat``, ``phase``, ``overlap_with``."""
    return {
        "overlap": columns["overlap_with"].astype(np.int64),
        "repeat": columns["repeat"].astype(float),
        "not_forward": columns["phase"] != Phase.FORWARD,
    }
