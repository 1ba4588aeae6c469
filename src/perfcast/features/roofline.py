"""Analytic op times: the roofline for compute ops, alpha-beta for collectives.

An op takes at least ``max(FLOPs / peak, bytes / memory bandwidth)``. GEMMs and
attention run at the tensor-core peak of their dtype, every other op at the vector
(non-tensor) fp32 peak. These are bounds at 100% of datasheet peaks: the learned models
predict the efficiency on top of them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfcast.data.schema import DType
from perfcast.features.collectives import collective_time_s
from perfcast.features.hardware import ClusterSpec, HardwareSpec
from perfcast.features.ops import COLLECTIVE_OPS, OpClass, op_classes, op_flops, op_kinds, op_memory_bytes

MS_PER_S = 1e3


def _peaks_flops(kinds: np.ndarray, dtypes: pd.Series, hw: HardwareSpec) -> np.ndarray:
    """Peak FLOP/s of each row's execution unit; each distinct (unit, dtype) is resolved once."""
    tensor = np.isin(op_classes(kinds), [OpClass.GEMM.value, OpClass.ATTENTION.value])
    dtype_codes, dtype_values = pd.factorize(np.asarray(dtypes, dtype=object), use_na_sentinel=False)
    codes = dtype_codes * 2 + tensor
    distinct, inverse = np.unique(codes, return_inverse=True)
    peaks = np.empty(len(distinct), dtype=float)
    for i, code in enumerate(distinct):
        dtype = DType.parse(dtype_values[code // 2])
        peaks[i] = (hw.peak_tflops(dtype) if code % 2 else hw.vector_tflops(dtype)) * 1e12
    return peaks[inverse.reshape(-1)]


def roofline_time_s(ops: pd.DataFrame, hw: HardwareSpec) -> np.ndarray:
    """Roofline time of each compute op on ``hw``, seconds (collective rows give NaN).

    ``ops`` needs the op-table columns of its ops; ``flops`` and ``mem_bytes`` are used
    when present and computed otherwise.
    """
    kinds = op_kinds(ops)
    flops = ops["flops"].to_numpy(dtype=float) if "flops" in ops else op_flops(ops)
    mem = ops["mem_bytes"].to_numpy(dtype=float) if "mem_bytes" in ops else op_memory_bytes(ops)
    dtypes = ops["dtype"] if "dtype" in ops else pd.Series(DType.BF16.value, index=ops.index)
    is_comm = np.isin(kinds, [o.value for o in COLLECTIVE_OPS])
    return np.where(is_comm, np.nan, roofline_s(flops, mem, _peaks_flops(kinds, dtypes, hw), hw.mem_bw_gbps))


def roofline_s(flops: np.ndarray, mem_bytes: np.ndarray, peak_flops: np.ndarray, mem_bw_gbps: float) -> np.ndarray:
    """``max(flops / peak_flops, mem_bytes / bandwidth)``, seconds: peak in FLOP/s, bandwidth in GB/s."""
    return np.maximum(flops / peak_flops, mem_bytes / (mem_bw_gbps * 1e9))


def _numeric(ops: pd.DataFrame, name: str) -> np.ndarray:
    """A numeric column as floats; zeros when the table has no such column (compute-only tables)."""
    if name not in ops:
        return np.zeros(len(ops))
    return pd.to_numeric(ops[name], errors="coerce").fillna(0).to_numpy(dtype=float)


def op_time_ms(ops: pd.DataFrame, cluster: ClusterSpec) -> np.ndarray:
    """Analytic time of every op (compute and collective) on one GPU of ``cluster``, ms."""
    kinds = op_kinds(ops)
    compute = roofline_time_s(ops, cluster.gpu)
    comm = collective_time_s(
        kinds,
        _numeric(ops, "bytes"),
        _numeric(ops, "n_ranks"),
        _numeric(ops, "ranks_per_node"),
        intra_bw_gbps=cluster.intra_node_bw_gbps,
        inter_bw_gbps=cluster.inter_node_bw_gbps,
        intra_latency_us=cluster.intra_node_latency_us,
        inter_latency_us=cluster.inter_node_latency_us,
    )
    is_comm = np.isin(kinds, [o.value for o in COLLECTIVE_OPS])
    return np.where(is_comm, comm, compute) * MS_PER_S
