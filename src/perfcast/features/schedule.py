"""Compose op times into a training-step time through the pipeline schedule.

This module states the rules and is the route from node times to step breakdowns
(:class:`StepPlan`, :func:`compose_step`); :mod:`perfcast.features.schedule_bodies` computes
the per-microbatch part of the rules, vectorised over many graphs.

Rules (DESIGN.md decision 4), stated once here:

* Ops of one GPU run one after another on the compute stream. A collective is exposed
  (adds its whole time) unless its node names an ``overlap_with`` node, in which case
  only the part longer than that node is exposed (longer than the node's time per occurrence
  of the collective, where the two repeat differently: an ``op-sac`` replay): ring-attention K/V exchange hides
  behind the attention it feeds. Tensor-parallel and expert all-to-all transfers are
  exposed, as in Megatron-LM without communication-overlap flags (the switches below).
* The framework's switches (``docs/frameworks.md``) reach the composition so:

  - ``tp_comm_overlap``: each sequence-parallel TP all-gather / reduce-scatter of a
    dense layer names the GEMM beside it in ``overlap_with``
    (:data:`~perfcast.features.workload.TP_OVERLAP_GEMMS`), so it is exposed by
    ``max(0, comm - gemm)``; the GEMM keeps its whole time.
  - ``fsdp_prefetch``: a ZeRO-3 weight gather (``overlap_with`` =
    :data:`~perfcast.features.workload.OVERLAP_PREVIOUS_LAYER`) runs beside the previous
    layer's compute in its pass (forward; backward with its recomputation), ``C`` the
    compute-stream time of one layer of its kind in that pass. Over the ``L > 0`` layers of
    the stage it adds ``(L - 1) * max(0, g - C) + g``: every gather but the first layer's
    hides, the first is exposed whole, once per microbatch and pass (once per layer kind
    when a stage holds dense and MoE layers).
  - ``overlap_param_gather``: the ZeRO-1/2 parameter all-gather (a step node) is issued
    by layer and waited for by the next step's first forward. Of the gather, the part
    ``g`` still exposed after the gradient-sync rule (last rule) is timed so: the first
    layer's share ``g / L`` is exposed, the rest only where it outlasts the forward compute
    ``F`` of the other layers of one microbatch: ``g / L + max(0, g - F) (L - 1) / L``.
    The switch therefore never lengthens a step.
  - ``ep_comm_overlap``: each expert all-to-all of an MoE layer (dispatch, combine) names
    the expert GEMM beside it (:data:`~perfcast.features.workload.EP_OVERLAP_GEMMS`), so it
    is exposed by ``max(0, a2a - gemm)``, as a TP collective under ``tp_comm_overlap``.
  - ``cuda_graphs``: kernels replay from a captured graph, so the host dispatch floor
    (next rule) is off (``host_ms_per_kernel = 0``).
  - ``torch_compile`` adds no time here: its fused vector ops would need op times that
    perfcast does not have (the learned step model reads it as a feature).

  Each hidden collective is assumed not to slow the compute it overlaps, and two
  collectives may hide behind the same compute.
* The time of one microbatch on a stage is the sum over its layers, plus the embedding
  on the first stage and the LM head and loss on the last one, plus its exposed pipeline
  transfers (next rule).
* Host dispatch floor: an eager framework (PyTorch + Megatron) issues kernels from one
  host thread, ``host_ms_per_kernel`` each (Python, autograd and launch), and the GPU
  cannot run a kernel before it is issued. A stage's microbatch therefore takes at least
  ``kernels * host_ms_per_kernel``, ``kernels`` being its node count (each node one
  kernel, collectives included); the excess over the op times is a stall of the compute
  stream and is reported in ``compute_ms`` (and separately as ``host_stall_ms``). The
  default :data:`~perfcast.features.schedule_bodies.HOST_MS_PER_KERNEL` is fitted on vTrain's
  Megatron-DeepSpeed runs on 2 and 4 A100s (small GPT layers, whose measured time per layer
  stays flat as tp shrinks the GEMMs). It is per *graph node*, an effective figure: Megatron
  launches more kernels than the graph has nodes (bias, dropout, copies, gradient
  accumulation). Pass 0 to switch the floor off.
* Pipeline transfers follow how Megatron-LM issues them
  (``megatron/core/pipeline_parallel/schedules.py``):

  - plain 1F1B (``vpp = 1``): ``send_forward_recv_backward`` /
    ``send_backward_recv_forward`` are blocking, so each microbatch's forward and
    backward transfer (``repeat = 1``) is on the stage's critical path;
  - interleaved (``vpp > 1``, ``overlap_p2p_comm`` on, the Megatron-LM and NeMo default
    for that schedule): the transfers of model chunk ``j`` are posted as
    ``isend``/``irecv`` and waited for only before chunk ``j + 1`` needs them, so in the
    steady state they hide behind the chunk computations; only the part of the
    ``vpp`` forward plus ``vpp`` backward transfers of a microbatch longer than the
    stage's compute is exposed. In the fill and drain nothing runs beside them: the
    first microbatch's forward crosses ``pp - 1`` stage boundaries before the last stage
    starts and the last backward crosses them again, so the bubble grows by
    ``(pp - 1) * (t_fwd + t_bwd)`` (one transfer is a whole microbatch's activation
    whatever the chunk, hence no division by ``vpp``).
* 1F1B with ``m`` microbatches over stages with per-microbatch times ``T_s`` takes
  ``m * max(T_s) + (sum(T_s) - max(T_s)) / v``, with ``v`` virtual stages per rank
  (interleaved schedule, ``v = 1`` plain 1F1B): the fill-and-drain bubble of
  Narayanan et al. 2021, ``(p - 1) / v`` stage-times for equal stages.
* Uneven pipelines (``graph.stage_layers``, see
  :func:`~perfcast.features.parallel.pipeline_split`): ``T_s`` of rank ``s`` counts its
  own dense and MoE layers (its chunks together), so the slowest rank times the steady
  state. The exposed communication, the host stall and the last backward (for
  ``overlap_grad_reduce``) are the slowest rank's; with equal ranks they are those of the
  busier end stage.
* After the pipeline flush the data-parallel gradient sync is exposed (Megatron-DeepSpeed
  default); with ``overlap_grad_reduce`` it hides behind the last microbatch's backward.
  The sync here includes the ZeRO-1/2 parameter all-gather, which in Megatron-Core runs
  after the optimizer instead: an optimistic budget, kept so that rows composed before
  frameworks were a column keep their times. Then the optimizer step runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from perfcast.features.parallel import ParallelConfig
from perfcast.features.schedule_bodies import (
    HOST_MS_PER_KERNEL,
    BodyPlan,
    BodyTemplate,
    param_gather_exposed_ms,
    segment_rows,
)
from perfcast.features.workload import Scope, WorkloadGraph

__all__ = [
    "HOST_MS_PER_KERNEL",
    "PARAM_GATHER_SUFFIX",
    "BodyTemplate",
    "StepBreakdown",
    "StepPlan",
    "compose_step",
    "host_ms_per_kernel",
    "param_gather_exposed_ms",
    "segment_rows",
    "step_breakdowns",
]

PARAM_GATHER_SUFFIX = ".param_allgather"
"""Name ending of the ZeRO-1/2 parameter all-gather step nodes (``overlap_param_gather`` times them apart)."""


def host_ms_per_kernel(parallel: ParallelConfig) -> float:
    """The dispatch floor's host time per kernel of a config, ms: 0 with ``cuda_graphs``."""
    return 0.0 if parallel.cuda_graphs else HOST_MS_PER_KERNEL


@dataclass(frozen=True)
class StepBreakdown:
    """Where one training step's time goes, ms, on the busiest pipeline stage.

    ``step_ms = compute_ms + attention_ms + sum(comm_ms.values()) + bubble_ms + dp_sync_ms + optimizer_ms``.
    ``attention_ms`` is the attention cores' kernel time
    (:data:`~perfcast.features.schedule_bodies.ATTENTION_CORE`) on the busiest stage and
    ``compute_ms`` the rest of its compute stream. ``comm_ms`` maps process groups (tp, cp,
    ep, pp, dp under ZeRO-3) to exposed time.
    ``host_stall_ms`` is the part of ``compute_ms`` the compute stream waits for the host to
    issue kernels (the dispatch floor); it is not added again, and not a column of
    :meth:`as_row`, whose columns sum to ``step_ms``.
    """

    step_ms: float
    compute_ms: float
    bubble_ms: float
    dp_sync_ms: float
    optimizer_ms: float
    comm_ms: dict[str, float] = field(default_factory=dict)
    host_stall_ms: float = 0.0
    attention_ms: float = 0.0

    def as_row(self) -> dict[str, float]:
        """Flat columns for a breakdown table (``comm_<group>_ms`` per group)."""
        row = {
            "compute_ms": self.compute_ms,
            "attention_ms": self.attention_ms,
            "bubble_ms": self.bubble_ms,
            "dp_sync_ms": self.dp_sync_ms,
            "optimizer_ms": self.optimizer_ms,
        }
        row.update({f"comm_{group}_ms": ms for group, ms in sorted(self.comm_ms.items())})
        return row


def compose_step(
    graph: WorkloadGraph,
    op_ms: np.ndarray,
    *,
    overlap_grad_reduce: bool = False,
    overlap_param_gather: bool = False,
    host_ms_per_kernel: float = HOST_MS_PER_KERNEL,
) -> StepBreakdown:
    """Step time of ``graph`` given each node's time ``op_ms`` (ms, aligned with ``graph.nodes``).

    A one-graph :class:`StepPlan` (see the module rules).

    Args:
        graph: the config's workload graph.
        op_ms: time of each node, ms.
        overlap_grad_reduce: hide the data-parallel sync behind the last backward.
        overlap_param_gather: time the ZeRO-1/2 parameter all-gather behind the next
            forward (see the module rules).
        host_ms_per_kernel: host time to issue one node's kernel, ms (the dispatch floor;
            0 turns it off: :func:`host_ms_per_kernel` of the config).
    """
    plan = StepPlan.from_graphs(
        [graph],
        overlap_grad_reduce=[overlap_grad_reduce],
        overlap_param_gather=[overlap_param_gather],
        host_ms_per_kernel=[host_ms_per_kernel],
    )
    return step_breakdowns(plan.compose([op_ms])[0])[0]


def step_breakdowns(parts: Mapping[str, np.ndarray]) -> list[StepBreakdown]:
    """One :class:`StepBreakdown` per config of the columns of :meth:`StepPlan.compose`
    (a group whose ``comm_<group>_ms`` is NaN for a config is left out of its ``comm_ms``)."""
    names = ("step_ms", "compute_ms", "bubble_ms", "dp_sync_ms", "optimizer_ms", "host_stall_ms", "attention_ms")
    columns = {name: parts[name].tolist() for name in names}
    comm = {name[len("comm_") : -len("_ms")]: v.tolist() for name, v in parts.items() if name.startswith("comm_")}
    return [
        StepBreakdown(
            **{name: values[i] for name, values in columns.items()},
            comm_ms={group: values[i] for group, values in comm.items() if not np.isnan(values[i])},
        )
        for i in range(len(parts["step_ms"]))
    ]


class StepPlan:
    """The training steps of many configs: a :class:`BodyPlan` of their bodies, and each
    config's microbatch count, step nodes and switches. The one route from node times to
    step breakdowns (:func:`compose_step` is a one-graph plan).

    Args:
        bodies: the distinct bodies, :class:`BodyTemplate` (see :class:`BodyPlan`).
        steps: the ``op`` and ``name`` columns of every distinct set of step nodes
            (``step`` scope), the sets concatenated.
        step_sizes: the number of nodes of each set.
        body_of, steps_of: per config, its body and its set of step nodes (indices).
        num_microbatches: per config.
        host_ms_per_kernel: per body, the dispatch floor's host time per kernel, ms.
        overlap_grad_reduce, overlap_param_gather: per config, the switches (module rules).
        body_rows, step_rows: where :meth:`compose`'s node-time arrays hold the bodies'
            nodes (concatenated in the order of ``bodies``) and the step nodes (in the order
            of ``steps``).
    """

    def __init__(
        self,
        bodies: Sequence[BodyTemplate],
        steps: Mapping[str, np.ndarray],
        step_sizes: Sequence[int],
        *,
        body_of: np.ndarray,
        steps_of: np.ndarray,
        num_microbatches: np.ndarray,
        host_ms_per_kernel: np.ndarray,
        overlap_grad_reduce: np.ndarray,
        overlap_param_gather: np.ndarray,
        body_rows: np.ndarray,
        step_rows: np.ndarray,
    ) -> None:
        self.bodies = BodyPlan(bodies)
        self.num_step_sets = len(step_sizes)
        self.step_seg = np.repeat(np.arange(self.num_step_sets), step_sizes)
        self.is_optimizer = steps["op"] == "optimizer"
        self.is_gather = np.char.endswith(steps["name"].astype(str), PARAM_GATHER_SUFFIX)
        self.body_of, self.steps_of = np.asarray(body_of, dtype=np.int64), np.asarray(steps_of, dtype=np.int64)
        self.num_microbatches = np.asarray(num_microbatches, dtype=float)
        self.host_ms_per_kernel = np.asarray(host_ms_per_kernel, dtype=float)
        self.overlap_grad_reduce = np.asarray(overlap_grad_reduce, dtype=bool)
        self.overlap_param_gather = np.asarray(overlap_param_gather, dtype=bool)
        self.body_rows, self.step_rows = body_rows, step_rows

    @classmethod
    def from_graphs(
        cls,
        graphs: Sequence[WorkloadGraph],
        *,
        overlap_grad_reduce: Sequence[bool] | np.ndarray,
        overlap_param_gather: Sequence[bool] | np.ndarray,
        host_ms_per_kernel: Sequence[float] | np.ndarray,
    ) -> StepPlan:
        """The plan of one config per graph (switches per graph); :meth:`compose` takes the
        graphs' node times concatenated in order."""
        step = np.concatenate([g.column("scope") == Scope.STEP for g in graphs])
        steps = {name: np.concatenate([g.column(name) for g in graphs])[step] for name in ("op", "name")}
        bodies = [BodyTemplate.from_graph(g) for g in graphs]
        index = np.arange(len(graphs))
        return cls(
            bodies,
            steps,
            [g.num_nodes - b.num_nodes for g, b in zip(graphs, bodies, strict=True)],
            body_of=index,
            steps_of=index,
            num_microbatches=np.array([g.num_microbatches for g in graphs]),
            host_ms_per_kernel=np.asarray(host_ms_per_kernel, dtype=float),
            overlap_grad_reduce=np.asarray(overlap_grad_reduce, dtype=bool),
            overlap_param_gather=np.asarray(overlap_param_gather, dtype=bool),
            body_rows=np.flatnonzero(~step),
            step_rows=np.flatnonzero(step),
        )

    def compose(self, node_ms: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
        """The :meth:`BodyPlan.finish` columns of every config for each node-time array (ms;
        e.g. median, lower and upper bounds); an array equal to an earlier one reuses its columns."""
        out: list[dict[str, np.ndarray]] = []
        for k, ms in enumerate(node_ms):
            same = next((out[j] for j in range(k) if np.array_equal(node_ms[j], ms)), None)
            out.append(same if same is not None else self._compose(np.asarray(ms, dtype=float)))
        return out

    def _compose(self, node_ms: np.ndarray) -> dict[str, np.ndarray]:
        step_ms = node_ms[self.step_rows]
        n = self.num_step_sets
        dp_sync = np.bincount(self.step_seg, np.where(self.is_optimizer, 0.0, step_ms), minlength=n)
        optimizer = np.bincount(self.step_seg, np.where(self.is_optimizer, step_ms, 0.0), minlength=n)
        gather = np.bincount(self.step_seg, np.where(self.is_gather, step_ms, 0.0), minlength=n)
        stages = self.bodies.stages(node_ms[self.body_rows], self.host_ms_per_kernel)
        at = self.steps_of
        return self.bodies.finish(stages, self.body_of, self.num_microbatches, dp_sync[at], optimizer[at], gather[at],
                                  overlap_grad_reduce=self.overlap_grad_reduce,
                                  overlap_param_gather=self.overlap_param_gather)  # fmt: skip

    def any_node(self, flags: np.ndarray) -> np.ndarray:
        """Per config: whether any of its nodes is flagged (``flags``: per node, laid out as
        :meth:`compose`'s arrays)."""
        flags = np.asarray(flags, dtype=bool)
        body = np.bincount(self.bodies.seg, flags[self.body_rows], minlength=self.bodies.num_bodies) > 0
        step = np.bincount(self.step_seg, flags[self.step_rows], minlength=self.num_step_sets) > 0
        return body[self.body_of] | step[self.steps_of]
