"""Compose op times into a training-step time through the pipeline schedule.

Rules (DESIGN.md decision 4), stated once here:

* Ops of one GPU run one after another on the compute stream. A collective is exposed
  (adds its whole time) unless its node names an ``overlap_with`` node, in which case
  only the part longer than that node is exposed: ring-attention K/V exchange hides
  behind the attention it feeds. Tensor-parallel, expert all-to-all and pipeline
  transfers are exposed, as in Megatron-LM without communication-overlap flags.
* The time of one microbatch on a stage is the sum over its layers, plus the embedding
  on the first stage and the LM head and loss on the last one, plus its pipeline
  transfers.
* 1F1B with ``m`` microbatches over stages with per-microbatch times ``T_s`` takes
  ``m * max(T_s) + (sum(T_s) - max(T_s)) / v``, with ``v`` virtual stages per rank
  (interleaved schedule, ``v = 1`` plain 1F1B): the fill-and-drain bubble of
  Narayanan et al. 2021, ``(p - 1) / v`` stage-times for equal stages.
* After the pipeline flush the data-parallel gradient sync is exposed (Megatron-DeepSpeed
  default); with ``overlap_grad_reduce`` it hides behind the last microbatch's backward.
  Then the optimizer step runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfcast.features.workload import Phase, Scope, WorkloadGraph

COMPUTE = "compute"


@dataclass(frozen=True)
class StepBreakdown:
    """Where one training step's time goes, ms, on the busiest pipeline stage.

    ``step_ms = compute_ms + sum(comm_ms.values()) + bubble_ms + dp_sync_ms + optimizer_ms``.
    ``comm_ms`` maps process groups (tp, cp, ep, pp, dp under ZeRO-3) to exposed time.
    """

    step_ms: float
    compute_ms: float
    bubble_ms: float
    dp_sync_ms: float
    optimizer_ms: float
    comm_ms: dict[str, float] = field(default_factory=dict)

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
    overlap = graph.nodes["overlap_with"].to_numpy(dtype=int)
    hidden_by = np.where(overlap >= 0, op_ms[np.clip(overlap, 0, None)], 0.0)
    return np.maximum(op_ms - hidden_by, 0.0)


def compose_step(graph: WorkloadGraph, op_ms: np.ndarray, *, overlap_grad_reduce: bool = False) -> StepBreakdown:
    """Step time of ``graph`` given each node's time ``op_ms`` (ms, aligned with ``graph.nodes``)."""
    nodes = graph.nodes
    exposed = exposed_time_ms(graph, np.asarray(op_ms, dtype=float)) * nodes["repeat"].to_numpy(dtype=float)
    scope = nodes["scope"].to_numpy()
    per_scope = graph.scope_multiplicity()
    mult = np.array([per_scope[s] for s in scope], dtype=float)
    weighted = exposed * mult

    def total(mask: np.ndarray) -> float:
        return float(weighted[mask].sum())

    body = np.isin(scope, [Scope.LAYER, Scope.MOE_LAYER, Scope.STAGE])
    first, last = scope == Scope.FIRST_STAGE, scope == Scope.LAST_STAGE
    stage_body, stage_first, stage_last = total(body), total(first), total(last)
    if graph.pp == 1:
        stages = np.array([stage_body + stage_first + stage_last])
        busiest = body | first | last
    else:
        stages = np.full(graph.pp, stage_body)
        stages[0] += stage_first
        stages[-1] += stage_last
        busiest = body | (first if stage_first >= stage_last else last)
    m = graph.num_microbatches
    pipeline = m * stages.max() + (stages.sum() - stages.max()) / graph.vpp
    bubble = pipeline - m * stages.max()

    stream = nodes["stream"].to_numpy()
    groups = nodes["group"].to_numpy()
    compute_ms = m * total(busiest & (stream == COMPUTE))
    comm_ms: dict[str, float] = {}
    for group in sorted(set(groups[busiest & (stream != COMPUTE)])):
        comm_ms[group] = m * total(busiest & (stream != COMPUTE) & (groups == group))

    step = scope == Scope.STEP
    is_optimizer = nodes["op"].to_numpy() == "optimizer"
    dp_sync = total(step & ~is_optimizer)
    if overlap_grad_reduce:
        last_backward = total(busiest & (nodes["phase"].to_numpy() != Phase.FORWARD))
        dp_sync = max(0.0, dp_sync - last_backward)
    optimizer = total(step & is_optimizer)
    return StepBreakdown(
        step_ms=float(pipeline + dp_sync + optimizer),
        compute_ms=compute_ms,
        bubble_ms=float(bubble),
        dp_sync_ms=dp_sync,
        optimizer_ms=optimizer,
        comm_ms=comm_ms,
    )
