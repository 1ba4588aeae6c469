"""Rank placement: where each process group of a layout sits on the cluster's levels.

Megatron-Core orders the ranks of one pipeline stage tp innermost, then cp, then dp
(pipeline stages outermost). The expert layers fold their own grid over the same
``tp*cp*dp`` ranks, etp innermost, then ep, then expert-dp (``edp``), so a group with
rank stride ``s`` and ``n`` ranks has ``min(n, D // s)`` of them (rounded down to a
divisor of ``n``) inside one NVLink domain of ``D`` GPUs. This module is the one home
of that rule; the workload graph and the ``comm_<group>_level`` breakdown read it.
"""

from __future__ import annotations

from functools import lru_cache

from perfcast.features.parallel import ParallelConfig


class Group:
    """Which process group a collective runs in (the workload graph's ``group`` column).

    The expert-tensor-parallel gathers of ``etp > 1`` run in the ``ep`` group's
    breakdown (expert communication): ``etp`` has no group column of its own.
    """

    TP = "tp"
    CP = "cp"
    EP = "ep"
    PP = "pp"
    DP = "dp"
    EXPERT_DP = "edp"
    EMBEDDING = "emb"


EXPERT_TP = "etp"
"""Key of the expert-tensor-parallel group in :func:`group_placement` (timed in the ``ep`` group)."""
DP_SHARD, DP_REPLICATE = "dp_shard", "dp_replicate"
"""Keys in :func:`group_placement` of the ranks one replica shards ZeRO state over and of the
replicas of one shard (the data-parallel group split by ``dp_replicate``; timed in the ``dp`` group)."""
EXPERT_DP_SHARD, EXPERT_DP_REPLICATE = "edp_shard", "edp_replicate"
"""The same split of the expert-data-parallel group (timed in the ``edp`` group)."""


@lru_cache(maxsize=1024)
def group_ranks_per_node(stride: int, size: int, gpus_per_node: int) -> int:
    """Ranks of a process group (rank stride ``stride``, ``size`` ranks) inside one NVLink
    domain of ``gpus_per_node`` GPUs: the most that fit, rounded down to a divisor of
    ``size`` so every domain holds the same share (a 32-rank group over 72-GPU racks at
    stride 4 keeps 16 per rack, as a launcher placing whole groups would)."""
    if size <= 1:
        return 1
    fit = max(1, min(size, gpus_per_node // max(stride, 1)))
    return max(d for d in range(1, fit + 1) if size % d == 0)


def group_placement(parallel: ParallelConfig, nvlink_domain: int) -> dict[str, tuple[int, int]]:
    """Each process group's (ranks, ranks inside one NVLink domain) under Megatron-Core's
    rank order: tp innermost, then cp, dp, pp outermost; the expert groups folded over the
    ``tp*cp*dp`` ranks of a stage, etp innermost (stride 1), then ep (stride ``etp``),
    then edp (stride ``etp*ep``).

    Keys: the :class:`Group` names, :data:`EXPERT_TP` and the hybrid-sharding split of
    the data-parallel groups (:data:`DP_SHARD`, :data:`DP_REPLICATE` and their expert
    twins): a replica's shard ranks are consecutive in the group, the replicas of one
    shard one replica apart. ``pp`` and ``emb`` are
    point-to-point pairs (neighbouring stages; first and last stage), inside one domain
    when the ranks between them fit in it.
    """
    p, d = parallel, nvlink_domain
    dp_ranks = p.dp * p.cp
    shard, expert_shard, expert_stride = p.zero_shard_ranks, p.expert_shard_ranks, p.etp * p.ep
    return {
        Group.TP: (p.tp, group_ranks_per_node(1, p.tp, d)),
        Group.CP: (p.cp, group_ranks_per_node(p.tp, p.cp, d)),
        EXPERT_TP: (p.etp, group_ranks_per_node(1, p.etp, d)),
        Group.EP: (p.ep, group_ranks_per_node(p.etp, p.ep, d)),
        Group.DP: (dp_ranks, group_ranks_per_node(p.tp, dp_ranks, d)),
        Group.EXPERT_DP: (p.edp, group_ranks_per_node(expert_stride, p.edp, d)),
        DP_SHARD: (shard, group_ranks_per_node(p.tp, shard, d)),
        DP_REPLICATE: (p.dp_replicate, group_ranks_per_node(p.tp * shard, p.dp_replicate, d)),
        EXPERT_DP_SHARD: (expert_shard, group_ranks_per_node(expert_stride, expert_shard, d)),
        EXPERT_DP_REPLICATE: (p.dp_replicate, group_ranks_per_node(expert_stride * expert_shard, p.dp_replicate, d)),
        Group.PP: (2 if p.pp > 1 else 1, 2 if p.tp * p.cp * p.dp < d else 1),
        Group.EMBEDDING: (2 if p.pp > 1 else 1, 2 if p.tp * p.cp * p.dp * (p.pp - 1) < d else 1),
    }


def fabric_level(n_ranks: int, ranks_in_domain: int, fabric: str | None) -> str:
    """The links a collective of ``n_ranks`` crosses: ``nvlink`` inside one domain, the
    scale-out ``fabric`` id when each domain holds one rank, both joined by ``+`` otherwise;
    "" for a group of one rank (no communication)."""
    if n_ranks <= 1:
        return ""
    if ranks_in_domain >= n_ranks:
        return "nvlink"
    outside = fabric or "scale-out"
    return outside if ranks_in_domain <= 1 else f"nvlink+{outside}"
