"""Features of collective ops: the catalog cluster of each row and its alpha-beta time.

:func:`featurize_collectives` turns op-table collective rows (``op`` in allreduce |
allgather | reducescatter | alltoall | sendrecv, ``bytes``, ``n_ranks``,
``ranks_per_node``, ``dtype``, ``gpu``, optional ``inter_node`` fabric id) into the
columns of :data:`COLLECTIVE_FEATURES`. Each distinct (gpu, n_ranks, ranks_per_node,
inter_node) gets its catalog cluster from :func:`~perfcast.features.hardware.collective_cluster`
(``ranks_per_node``: ranks in one NVLink domain; missing -> the GPU's catalog domain capped
at ``n_ranks``), and the analytic time comes
from :func:`perfcast.features.collectives.collective_time_s`, the one place the alpha-beta
formulas live.

The alpha-beta time is split into pieces that are linear in the link figures, which the
collective model refits per link kind:

* ``bw_intra_ms`` / ``bw_inter_ms``: the bandwidth term over the scale-up link / the
  scale-out fabric at catalog bandwidth (zero latencies, the other link infinitely fast);
* ``latency_steps``: the latency term in units of one catalog step (``alpha_beta_lat_ms``
  divided by the per-step latency of the row's outermost link: the fabric when the group
  spans nodes, else the scale-up link). Exact inside one node; across nodes NCCL's ring
  mixes intra- and inter-node steps, and they are all counted at the fabric's latency.

Link kinds (:data:`LINK_KINDS`) come from the catalog: the intra-node kind from the text of
``HardwareSpec.intra_node_link`` (``NVLink ...`` -> nvlink, ``Infinity Fabric ...`` ->
xgmi, ``ICI ...`` -> ici, integrated ``RoCE`` -> roce, ``PCIe ...`` -> pcie), the
inter-node kind from the fabric id (``ib-*`` -> infiniband, ``roce-*`` -> roce, NVLink
domains -> nvlink, ``*-dcn`` -> dcn). ``nvlink_bridge`` flags PCIe cards whose catalog
text mentions NVLink bridges; a row's ``nvlink_bridged`` says its cluster has them, and then
pairs inside a node run over the bridge (link kind nvlink, the catalog's bridge bandwidth).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pandas as pd

from perfcast.data.schema import DType, OpType
from perfcast.errors import SpecError
from perfcast.features.cluster import NVLINK_BRIDGE_GPUS, collective_cluster
from perfcast.features.collectives import collective_time_s
from perfcast.features.hardware_spec import HardwareSpec
from perfcast.features.ops import flag_column

__all__ = [
    "COLLECTIVE_CODES",
    "COLLECTIVE_FEATURES",
    "COLLECTIVE_FEATURES_VERSION",
    "LINK_KINDS",
    "featurize_collectives",
    "inter_link_kind",
    "intra_link_kind",
    "inter_node_fabrics",
    "nvlink_bridged_flags",
]

COLLECTIVE_FEATURES_VERSION = 4
"""Bumped when a feature changes meaning (2: NCCL's all-reduce tree is a chain inside a node;
3: rows with ``nvlink_bridged`` use the PCIe card's NVLink bridge inside a node; 4: all-gather
and reduce-scatter pay the ring's latency across nodes, log2 steps only with one rank per node)."""

# Stable integer codes (saved models depend on them: append, never reorder).
COLLECTIVE_CODES: dict[str, int] = {
    OpType.ALLREDUCE.value: 0,
    OpType.ALLGATHER.value: 1,
    OpType.REDUCESCATTER.value: 2,
    OpType.ALLTOALL.value: 3,
    OpType.SENDRECV.value: 4,
}
LINK_KINDS: tuple[str, ...] = ("nvlink", "xgmi", "ici", "roce", "pcie", "infiniband", "dcn", "other")
_LINK_CODES = {kind: i for i, kind in enumerate(LINK_KINDS)}

COLLECTIVE_FEATURES: tuple[str, ...] = (
    "collective_code",  # COLLECTIVE_CODES
    "log_bytes",  # natural log of the message size, bytes
    "log_bytes_per_rank",  # log(bytes / n_ranks)
    "dtype_bytes",  # bytes per element
    "n_ranks",
    "ranks_per_node",  # as used: the row's value or the GPU's default node size, capped at n_ranks
    "nodes",  # ceil(n_ranks / ranks_per_node)
    "intra_bw_gbps",  # catalog per-GPU scale-up bandwidth, one direction, GB/s
    "inter_bw_gbps",  # catalog per-GPU scale-out bandwidth, one direction, GB/s
    "intra_latency_us",  # catalog per-step latency inside a node, us
    "inter_latency_us",  # catalog per-step latency across nodes, us
    "intra_link_code",  # LINK_KINDS index of the scale-up link
    "inter_link_code",  # LINK_KINDS index of the scale-out fabric
    "nvlink_bridge",  # 1.0 for PCIe cards whose catalog mentions NVLink bridges
    "alpha_beta_ms",  # analytic time, ms
    "alpha_beta_bw_ms",  # its bandwidth part, ms
    "alpha_beta_lat_ms",  # its latency part, ms
    "bw_intra_ms",  # bandwidth part over the scale-up link, ms
    "bw_inter_ms",  # bandwidth part over the fabric, ms
    "latency_steps",  # latency part in catalog steps of the outermost link
    "log_alpha_beta_ms",  # log of alpha_beta_ms (floored at 1e-9 ms)
    "bw_share",  # alpha_beta_bw_ms / alpha_beta_ms (0 for one-rank groups)
)

_REQUIRED = ("op", "bytes", "n_ranks", "gpu")
_DTYPE_BYTES = {
    DType.FP32.value: 4.0,
    DType.TF32.value: 4.0,
    DType.FP16.value: 2.0,
    DType.BF16.value: 2.0,
    DType.FP8.value: 1.0,
}


def intra_link_kind(hw: HardwareSpec) -> str:
    """Link kind (a :data:`LINK_KINDS` value) of a GPU's scale-up link, from its catalog text."""
    text = (hw.intra_node_link or "").strip().lower()
    if text.startswith("nvlink"):
        return "nvlink"
    if text.startswith("infinity fabric"):
        return "xgmi"
    if text.startswith("ici"):
        return "ici"
    if "roce" in text:
        return "roce"
    if text.startswith("pcie"):
        return "pcie"
    return "other"


def inter_link_kind(fabric_id: str | None) -> str:
    """Link kind (a :data:`LINK_KINDS` value) of a scale-out fabric, from its catalog id."""
    fid = (fabric_id or "").lower()
    if fid.startswith("ib-"):
        return "infiniband"
    if fid.startswith("roce"):
        return "roce"
    if fid.startswith(("nvl", "nvlink")):
        return "nvlink"
    if fid.endswith("-dcn"):
        return "dcn"
    return "other"


def _rows(index: pd.Index, mask: np.ndarray, limit: int = 5) -> str:
    bad = list(index[mask][:limit])
    more = f" (+{int(mask.sum()) - limit} more)" if mask.sum() > limit else ""
    return f"{bad}{more}"


def _check_input(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validated op, bytes, n_ranks and ranks_per_node arrays (NaN where rpn is missing)."""
    missing = [c for c in _REQUIRED if c not in ops.columns]
    if missing:
        raise SpecError(f"collective rows lack columns {missing}; required: {list(_REQUIRED)}")
    op = ops["op"].astype(str).str.strip().str.lower().to_numpy()
    bad = ~np.isin(op, list(COLLECTIVE_CODES))
    if bad.any():
        raise SpecError(
            f"op={op[bad][0]!r} at rows {_rows(ops.index, bad)} is not a collective; allowed: {list(COLLECTIVE_CODES)}"
        )
    nbytes = pd.to_numeric(ops["bytes"], errors="coerce").astype("float64").to_numpy()
    bad = ~(np.isfinite(nbytes) & (nbytes > 0))
    if bad.any():
        raise SpecError(f"bytes must be a positive number; bad at rows {_rows(ops.index, bad)}")
    n_ranks = pd.to_numeric(ops["n_ranks"], errors="coerce").astype("float64").to_numpy()
    bad = ~(np.isfinite(n_ranks) & (n_ranks >= 1) & (n_ranks == np.round(n_ranks)))
    if bad.any():
        raise SpecError(f"n_ranks must be an integer >= 1; bad at rows {_rows(ops.index, bad)}")
    if "ranks_per_node" in ops.columns:
        rpn = pd.to_numeric(ops["ranks_per_node"], errors="coerce").astype("float64").to_numpy()
    else:
        rpn = np.full(len(ops), np.nan)
    bad = ~np.isnan(rpn) & ~((rpn >= 1) & (rpn == np.round(rpn)))
    if bad.any():
        raise SpecError(f"ranks_per_node must be empty or an integer >= 1; bad at rows {_rows(ops.index, bad)}")
    return op, nbytes, n_ranks, rpn


def inter_node_fabrics(ops: pd.DataFrame) -> np.ndarray:
    """The optional ``inter_node`` column as stripped fabric ids (``""`` where missing or empty)."""
    if "inter_node" not in ops.columns:
        return np.full(len(ops), "", dtype=object)
    col = ops["inter_node"].astype(object)
    return col.where(col.notna(), "").astype(str).str.strip().to_numpy(dtype=object)


def nvlink_bridged_flags(ops: pd.DataFrame) -> np.ndarray:
    """The optional ``nvlink_bridged`` column as bools (False where missing or empty)."""
    return flag_column(ops, "nvlink_bridged")


def featurize_collectives(ops: pd.DataFrame) -> pd.DataFrame:
    """Collective features of op-table rows, aligned with ``ops`` (same index).

    Args:
        ops: collective rows: ``op``, ``bytes`` (message size per rank, bytes),
            ``n_ranks``, optional ``ranks_per_node``, ``dtype``, ``gpu`` (catalog id or
            device name), ``inter_node`` (fabric id; the GPU's default fabric when
            missing) and ``nvlink_bridged`` (PCIe cards with their optional NVLink
            bridges: groups of up to 2 GPUs a node use the bridge, see
            :meth:`ClusterSpec.build`; False when missing).

    Returns:
        The :data:`COLLECTIVE_FEATURES` columns, in that order, plus ``intra_link_kind``,
        ``inter_link_kind`` (strings) and ``gpu_id`` (the resolved catalog id).

    Raises:
        SpecError: missing columns, a non-collective op, bad sizes or counts, an unknown
            GPU or fabric, or a cluster the catalog cannot build (the message names rows).
    """
    op, nbytes, n_ranks, rpn = _check_input(ops)
    n = len(ops)
    gpu = ops["gpu"].astype(str).to_numpy()
    fabric = inter_node_fabrics(ops)
    bridged = nvlink_bridged_flags(ops)
    keys = pd.MultiIndex.from_arrays(
        [gpu, n_ranks.astype(np.int64), np.where(np.isnan(rpn), -1, rpn).astype(np.int64), fabric, bridged]
    )
    codes, uniques = pd.factorize(keys)
    per_key: dict[str, list] = {
        k: []
        for k in (
            "gpu_id",
            "rpn",
            "intra_bw",
            "inter_bw",
            "intra_lat",
            "inter_lat",
            "intra_kind",
            "inter_kind",
            "bridge",
        )
    }
    hw_cache: dict[Hashable, HardwareSpec] = {}
    for i, (g, nr, r, fab, bridge) in enumerate(uniques):
        where = codes == i
        fab = fab or None
        try:
            hw = hw_cache.get(g) or HardwareSpec.from_name(g)
            hw_cache[g] = hw
            cluster = collective_cluster(hw, int(nr), None if r < 0 else int(r), fab, bridged=bool(bridge))
        except SpecError as exc:
            raise SpecError(f"rows {_rows(ops.index, where)} (gpu={g!r}, n_ranks={nr}): {exc}") from None
        link = (hw.intra_node_link or "").lower()
        over_bridge = bool(bridge) and link.startswith("pcie") and cluster.gpus_per_node <= NVLINK_BRIDGE_GPUS
        per_key["gpu_id"].append(hw.id)
        per_key["rpn"].append(cluster.nvlink_domain)
        per_key["intra_bw"].append(cluster.intra_node_bw_gbps)
        per_key["inter_bw"].append(cluster.inter_node_bw_gbps)
        per_key["intra_lat"].append(cluster.intra_node_latency_us)
        per_key["inter_lat"].append(cluster.inter_node_latency_us)
        per_key["intra_kind"].append("nvlink" if over_bridge else intra_link_kind(hw))
        per_key["inter_kind"].append(inter_link_kind(cluster.inter_node_fabric))
        per_key["bridge"].append(float(link.startswith("pcie") and "nvlink bridge" in link))
    col = {k: np.asarray(v, dtype=object if k in ("gpu_id", "intra_kind", "inter_kind") else float)[codes]
           for k, v in per_key.items()}  # fmt: skip
    r = np.minimum(col["rpn"], n_ranks)
    nodes = np.ceil(n_ranks / r)
    figures = {
        "intra_bw_gbps": col["intra_bw"],
        "inter_bw_gbps": col["inter_bw"],
        "intra_latency_us": col["intra_lat"],
        "inter_latency_us": col["inter_lat"],
    }
    total_s = collective_time_s(op, nbytes, n_ranks, r, **figures)
    no_lat = {**figures, "intra_latency_us": 0.0, "inter_latency_us": 0.0}
    bw_s = collective_time_s(op, nbytes, n_ranks, r, **no_lat)
    bw_intra_s = collective_time_s(op, nbytes, n_ranks, r, **{**no_lat, "inter_bw_gbps": np.inf})
    bw_inter_s = collective_time_s(op, nbytes, n_ranks, r, **{**no_lat, "intra_bw_gbps": np.inf})
    lat_s = np.maximum(total_s - bw_s, 0.0)
    step_s = np.where(nodes > 1, col["inter_lat"], col["intra_lat"]) * 1e-6
    dtype = ops["dtype"].astype(str).str.lower().map(_DTYPE_BYTES) if "dtype" in ops else pd.Series(np.nan, ops.index)
    out = pd.DataFrame(
        {
            "collective_code": np.array([COLLECTIVE_CODES[o] for o in op], dtype=float),
            "log_bytes": np.log(nbytes),
            "log_bytes_per_rank": np.log(nbytes / n_ranks),
            "dtype_bytes": dtype.to_numpy(dtype=float),
            "n_ranks": n_ranks,
            "ranks_per_node": r,
            "nodes": nodes,
            **figures,
            "intra_link_code": np.array([_LINK_CODES[k] for k in col["intra_kind"]], dtype=float),
            "inter_link_code": np.array([_LINK_CODES[k] for k in col["inter_kind"]], dtype=float),
            "nvlink_bridge": col["bridge"],
            "alpha_beta_ms": total_s * 1e3,
            "alpha_beta_bw_ms": bw_s * 1e3,
            "alpha_beta_lat_ms": lat_s * 1e3,
            "bw_intra_ms": bw_intra_s * 1e3,
            "bw_inter_ms": bw_inter_s * 1e3,
            "latency_steps": lat_s / step_s,
            "log_alpha_beta_ms": np.log(np.maximum(total_s * 1e3, 1e-9)),
            "bw_share": np.divide(bw_s, total_s, out=np.zeros(n), where=total_s > 0),
        },
        index=ops.index,
    )
    out["intra_link_kind"] = col["intra_kind"]
    out["inter_link_kind"] = col["inter_kind"]
    out["gpu_id"] = col["gpu_id"]
    return out
