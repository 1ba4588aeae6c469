"""Alpha-beta times of NCCL-style collectives on a two-level (node, cluster) topology.

A group of ``n`` ranks with ``r`` ranks per node spans ``N = ceil(n / r)`` nodes. Inside
one node the collective is a ring over the scale-up link (NVLink, Infinity Fabric,
PCIe) at ``intra_bw`` GB/s per GPU and direction; across nodes it is hierarchical, as
NCCL does it: a ring inside each node over ``B/r`` slices, and a ring across nodes in
which each GPU drives its own NIC at ``inter_bw`` GB/s (rail-optimised clusters).

With ``B`` the message size (the whole buffer, for gathers the gathered output), times
in seconds, bandwidths in bytes/s and latencies ``a`` in seconds per ring step:

* all-reduce: ``2(r-1)/r * B/intra_bw + 2(N-1)/N * (B/r)/inter_bw``, latency
  ``min(ring, tree)`` with ring ``2(r-1)*a_intra + 2(N-1)*a_inter`` and tree
  ``2(r-1)*a_intra + 2*ceil(log2 N)*a_inter``: NCCL's tree is a binary tree across
  nodes but a chain through the ranks inside each node, so inside one node it saves no
  step and a single-node all-reduce pays the ring's ``2(r-1)`` steps (nccl-tests on 8
  A100s: the small-message floor grows from 44 us at 2 ranks to 93 us at 8, vTrain's
  table);
* all-gather and reduce-scatter: half of the all-reduce traffic and of its ring's latency
  steps, ``(r-1)*a_intra + (N-1)*a_inter``: NCCL runs them as rings (it has no tree for
  them), so a group spread over many nodes pays a step per node, which is why large
  fully sharded runs shard inside a replica instead (hybrid sharding). With one rank per
  node they take ``ceil(log2 N)`` steps across nodes, as NCCL's PAT algorithm (2.23 and
  later) does for that placement;
* all-to-all: the share ``(n-r)/n`` of ``B`` that leaves the node goes over the NICs, the
  share ``(r-1)/n`` over the scale-up link, ``(n-1)`` latency steps;
* send/recv: ``B/bw + a`` over the link between the two ranks (inter-node when
  ``ranks_per_node == 1``).

These are physical lower bounds: the learned collective model corrects them.
"""

from __future__ import annotations

import numpy as np

from perfcast.features.ops import OpType

_GB = 1e9
_US = 1e-6


def collective_time_s(
    kind: np.ndarray,
    message_bytes: np.ndarray,
    n_ranks: np.ndarray,
    ranks_per_node: np.ndarray,
    *,
    intra_bw_gbps: np.ndarray | float,
    inter_bw_gbps: np.ndarray | float,
    intra_latency_us: np.ndarray | float,
    inter_latency_us: np.ndarray | float,
) -> np.ndarray:
    """Alpha-beta time of each collective, seconds.

    Args:
        kind: op names (``OpType`` values; collectives only).
        message_bytes: buffer size per rank, bytes.
        n_ranks: ranks in the group; groups of one rank take no time.
        ranks_per_node: ranks of the group inside one node (clipped to ``[1, n_ranks]``).
        intra_bw_gbps, inter_bw_gbps: per-GPU bandwidth in one direction, GB/s.
        intra_latency_us, inter_latency_us: per-step latency, microseconds.
    """
    n = np.maximum(np.asarray(n_ranks, dtype=float), 1.0)
    r = np.clip(np.asarray(ranks_per_node, dtype=float), 1.0, n)
    nodes = np.ceil(n / r)
    b = np.asarray(message_bytes, dtype=float)
    bw_in = np.asarray(intra_bw_gbps, dtype=float) * _GB
    bw_out = np.asarray(inter_bw_gbps, dtype=float) * _GB
    a_in = np.asarray(intra_latency_us, dtype=float) * _US
    a_out = np.asarray(inter_latency_us, dtype=float) * _US
    multi = nodes > 1
    a_max = np.where(multi, a_out, a_in)

    ring_bw = (r - 1) / r * b / bw_in + (nodes - 1) / nodes * (b / r) / bw_out
    ring_lat = (r - 1) * a_in + (nodes - 1) * a_out
    tree_lat = (r - 1) * a_in + np.ceil(np.log2(nodes)) * a_out
    half_allreduce = ring_bw + np.minimum(ring_lat, tree_lat)
    gather = ring_bw + np.where(r > 1, ring_lat, np.minimum(ring_lat, tree_lat))

    a2a = (n - r) / n * b / bw_out + (r - 1) / n * b / bw_in + (n - 1) * a_max
    p2p = b / np.where(multi | (r < 2), bw_out, bw_in) + np.where(multi | (r < 2), a_out, a_in)

    kind = np.asarray(kind, dtype=str)
    time = np.select(
        [
            kind == OpType.ALLREDUCE.value,
            (kind == OpType.ALLGATHER.value) | (kind == OpType.REDUCESCATTER.value),
            kind == OpType.ALLTOALL.value,
            kind == OpType.SENDRECV.value,
        ],
        [2.0 * half_allreduce, gather, a2a, p2p],
        default=np.nan,
    )
    return np.where(n > 1, time, 0.0)
