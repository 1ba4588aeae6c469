"""Compose op times into a training-step time through the pipeline schedule.

Rules (DESIGN.md decision 4), stated once here:

* Ops of one GPU run one after another on the compute stream. A collective is exposed
  (adds its whole time) unless its node names an ``overlap_with`` node, in which case
  only the part longer than that node is exposed: ring-attention K/V exchange hides
  behind the attention it feeds. Tensor-parallel and expert all-to-all transfers are
  exposed, as in Megatron-LM without communication-overlap flags.
* The time of one microbatch on a stage is the sum over its layers, plus the embedding
  on the first stage and the LM head and loss on the last one, plus its exposed pipeline
  transfers (next rule).
* Host dispatch floor: an eager framework (PyTorch + Megatron) issues kernels from one
  host thread, ``host_ms_per_kernel`` each (Python, autograd and launch), and the GPU
  cannot run a kernel before it is issued. A stage's microbatch therefore takes at least
  ``kernels * host_ms_per_kernel``, ``kernels`` being its node count (each node one
  kernel, collectives included); the excess over the op times is a stall of the compute
  stream and is reported in ``compute_ms`` (and separately as ``host_stall_ms``). The
  default :data:`HOST_MS_PER_KERNEL` was fitted on vTrain's Megatron-DeepSpeed runs on
  2 and 4 A100s only (small GPT layers, where the measured time per layer and microbatch
  stays flat as tp shrinks the GEMMs: 3.3-3.6 ms per layer and microbatch at
  micro_batch 1 for tp = 1, 2, 4): 0.075 ms minimised the RMS of log(measured/composed)
  over those 720 runs on a 0-0.09 ms grid (op times from the shipped bundle, collectives
  from the NCCL-table model). It is per *graph node*, an effective figure: Megatron
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
* After the pipeline flush the data-parallel gradient sync is exposed (Megatron-DeepSpeed
  default); with ``overlap_grad_reduce`` it hides behind the last microbatch's backward.
  Then the optimizer step runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from perfcast.features.workload import Group, Phase, Scope, WorkloadGraph

COMPUTE = "compute"

HOST_MS_PER_KERNEL = 0.075
"""Host time to issue one graph node's kernel in an eager training framework, ms (see the module docstring)."""


@dataclass(frozen=True)
class StepBreakdown:
    """Where one training step's time goes, ms, on the busiest pipeline stage.

    ``step_ms = compute_ms + sum(comm_ms.values()) + bubble_ms + dp_sync_ms + optimizer_ms``.
    ``comm_ms`` maps process groups (tp, cp, ep, pp, dp under ZeRO-3) to exposed time.
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

    def as_row(self) -> dict[str, float]:
        """Flat columns for a breakdown table (``comm_<group>_ms`` per group)."""
        row = {
            "compute_ms": self.compute_ms,
            "bubble_ms": self.bubble_ms,
            "dp_sync_ms": self.dp_sync_ms,
            "optimizer_ms": self.optimizer_ms,
        }
        row.update({f"comm_{group}_ms": ms for group, ms in sorted(self.comm_ms.items())})
        return row


def exposed_time_ms(graph: WorkloadGraph, op_ms: np.ndarray) -> np.ndarray:
    """Time each node adds to its stream's critical path, ms (see the overlap rules)."""
    return _exposed(graph.column("overlap_with").astype(int), op_ms)


def _exposed(overlap: np.ndarray, op_ms: np.ndarray) -> np.ndarray:
    hidden_by = np.where(overlap >= 0, op_ms[np.clip(overlap, 0, None)], 0.0)
    return np.maximum(op_ms - hidden_by, 0.0)


class _Plan:
    """What composing a graph needs besides the node times: masks and multiplicities, computed once."""

    def __init__(self, graph: WorkloadGraph, overlap_grad_reduce: bool) -> None:
        self.graph = graph
        self.overlap = graph.column("overlap_with").astype(int)
        self.repeat = graph.column("repeat").astype(float)
        scope = graph.column("scope")
        per_scope = graph.scope_multiplicity()
        self.mult = np.array([per_scope[s] for s in scope], dtype=float)
        self.kernels = self.repeat * self.mult
        self.body = np.isin(scope, [Scope.LAYER, Scope.MOE_LAYER, Scope.STAGE])
        self.first, self.last = scope == Scope.FIRST_STAGE, scope == Scope.LAST_STAGE
        groups = graph.column("group")
        self.pp_xfer = groups == Group.PP
        self.overlap_p2p = graph.vpp > 1 and graph.pp > 1
        self.on_stage = self.body & ~self.pp_xfer if self.overlap_p2p else self.body
        self.comm = graph.column("stream") != COMPUTE
        self.groups = groups
        step = scope == Scope.STEP
        is_optimizer = graph.column("op") == "optimizer"
        self.dp_sync = step & ~is_optimizer
        self.optimizer = step & is_optimizer
        self.not_forward = graph.column("phase") != Phase.FORWARD if overlap_grad_reduce else None
        self.overlap_grad_reduce = overlap_grad_reduce

    def compose(self, op_ms: np.ndarray, host_ms_per_kernel: float) -> StepBreakdown:
        graph = self.graph
        exposed = _exposed(self.overlap, np.asarray(op_ms, dtype=float)) * self.repeat
        weighted = exposed * self.mult
        kernels = self.kernels

        def total(mask: np.ndarray, values: np.ndarray = weighted) -> float:
            return float(values[mask].sum())

        body, first, last, pp_xfer, overlap_p2p = self.body, self.first, self.last, self.pp_xfer, self.overlap_p2p
        stage_body, stage_first, stage_last = total(self.on_stage), total(first), total(last)
        if graph.pp == 1:
            gpu = np.array([stage_body + stage_first + stage_last])
            busiest = body | first | last
        else:
            gpu = np.full(graph.pp, stage_body)
            gpu[0] += stage_first
            gpu[-1] += stage_last
            busiest = body | (first if stage_first >= stage_last else last)
        xfer = total(body & pp_xfer) if overlap_p2p else 0.0
        exposed_xfer = np.maximum(xfer - gpu, 0.0)  # interleaved p2p: only what outlasts the compute
        gpu = gpu + exposed_xfer
        n_kernels = np.full(graph.pp, total(body, kernels))
        n_kernels[0] += total(first, kernels) if graph.pp > 1 else total(first | last, kernels)
        n_kernels[-1] += total(last, kernels) if graph.pp > 1 else 0.0
        stages = np.maximum(gpu, n_kernels * host_ms_per_kernel)
        slowest = int(np.argmax(stages))

        m = graph.num_microbatches
        fill_drain = (graph.pp - 1) * xfer / graph.vpp  # (pp - 1) * (t_fwd + t_bwd), see the rules
        pipeline = m * stages.max() + (stages.sum() - stages.max()) / graph.vpp + fill_drain
        bubble = pipeline - m * stages.max()

        timed = busiest & ~pp_xfer if overlap_p2p else busiest
        timed_comm = timed & self.comm
        comm_ms: dict[str, float] = {}
        for group in sorted(set(self.groups[timed_comm])):
            comm_ms[group] = m * total(timed_comm & (self.groups == group))
        if overlap_p2p:
            comm_ms[Group.PP] = m * float(exposed_xfer[slowest])
        compute_ms = m * float(stages[slowest]) - sum(comm_ms.values())  # op times plus the host stall

        dp_sync = total(self.dp_sync)
        if self.overlap_grad_reduce:
            last_backward = total(busiest & self.not_forward)
            dp_sync = max(0.0, dp_sync - last_backward)
        optimizer = total(self.optimizer)
        return StepBreakdown(
            step_ms=float(pipeline + dp_sync + optimizer),
            compute_ms=compute_ms,
            bubble_ms=float(bubble),
            dp_sync_ms=dp_sync,
            optimizer_ms=optimizer,
            comm_ms=comm_ms,
            host_stall_ms=m * float(stages[slowest] - gpu[slowest]),
        )


def compose_steps(
    graph: WorkloadGraph,
    op_ms: Sequence[np.ndarray],
    *,
    overlap_grad_reduce: bool = False,
    host_ms_per_kernel: float = HOST_MS_PER_KERNEL,
) -> list[StepBreakdown]:
    """:func:`compose_step` of one graph for several node-time arrays (e.g. median, lower and upper bounds).

    The graph's masks and multiplicities are computed once for all of them, and an array
    equal to an earlier one (bounds of a predictor without an interval) reuses its breakdown.
    """
    plan = _Plan(graph, overlap_grad_reduce)
    out: list[StepBreakdown] = []
    for i, ms in enumerate(op_ms):
        same = next((out[j] for j in range(i) if np.array_equal(op_ms[j], ms)), None)
        out.append(same if same is not None else plan.compose(ms, host_ms_per_kernel))
    return out


def compose_step(
    graph: WorkloadGraph,
    op_ms: np.ndarray,
    *,
    overlap_grad_reduce: bool = False,
    host_ms_per_kernel: float = HOST_MS_PER_KERNEL,
) -> StepBreakdown:
    """Step time of ``graph`` given each node's time ``op_ms`` (ms, aligned with ``graph.nodes``).

    Args:
        graph: the config's workload graph.
        op_ms: time of each node, ms.
        overlap_grad_reduce: hide the data-parallel sync behind the last backward.
        host_ms_per_kernel: host time to issue one node's kernel, ms (the dispatch floor;
            0 turns it off).
    """
    return _Plan(graph, overlap_grad_reduce).compose(op_ms, host_ms_per_kernel)
