"""Cost guesses that keep a sweep inside its caps and budget: the device's calibrated GEMM,
copy and element rates, and a roofline-free time per row (:func:`estimate_op_s`).

Caps (:func:`run_profile`): a short calibration (one GEMM per dtype and one copy) gives
throughput, bandwidth and element-rate guesses; a row's roofline-free estimate is
``max(FLOPs / gemm_rate, bytes / copy_bandwidth)`` (vector ops: elements / gelu rate in
place of the FLOPs term, see :func:`estimate_op_s`). On CPU, rows whose estimate exceeds
``cpu_op_cap_s`` (0.5 s) are skipped with reason ``cpu-time-cap`` (decided again on resume,
as the calibration of a busy machine can be pessimistic); on every device a row
whose estimated cost no longer fits the remaining budget is not started, and rows whose
tensors would not fit in free memory are skipped (``out-of-memory``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from perfcast.data.profiler.device import _TORCH_DTYPES, DeviceInfo, _torch
from perfcast.data.profiler.rows import _element_counts, _element_size, _flag, _int
from perfcast.data.schema import COLLECTIVE_OP_NAMES, GEMM_OP_NAMES, DType, OpType

_SETUP_FACTOR = 10.0
"""Filling a tensor with ``randn`` costs about this many copies of it (budget guard only)."""


class _Rates:
    """Calibrated GEMM throughput (per dtype) and copy bandwidth of the device: guesses for caps."""

    def __init__(self, info: DeviceInfo) -> None:
        self.info = info
        self.gemm_flops_per_s: dict[DType, float] = {}
        self.copy_bytes_per_s = self._copy_rate()
        self.vector_elems_per_s = self._vector_rate()

    def _best_s(self, fn: Callable[[], Any], calls: int = 5) -> float:
        torch, cuda = _torch(), self.info.kind == "cuda"
        fn()
        best = math.inf
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return max(best, 1e-7)

    def _copy_rate(self) -> float:
        torch = _torch()
        numel = (256 if self.info.kind == "cuda" else 16) * 2**20
        src = torch.randn(numel // 4, device=self.info.kind)
        dst = torch.empty_like(src)
        return 2.0 * numel / self._best_s(lambda: dst.copy_(src))

    def _vector_rate(self) -> float:
        """Elements per second of ``gelu`` (erf-heavy: a slow element-wise op), fp32."""
        import torch.nn.functional as F  # noqa: N812

        numel = (64 if self.info.kind == "cuda" else 1) * 2**20
        x = _torch().randn(numel, device=self.info.kind)
        return numel / self._best_s(lambda: F.gelu(x))

    def gemm_rate(self, dtype: DType) -> float:
        base = DType.BF16 if dtype is DType.FP8 else (DType.FP32 if dtype is DType.TF32 else dtype)
        if base not in self.gemm_flops_per_s:
            torch = _torch()
            size = 2048 if self.info.kind == "cuda" else 256
            tdt = getattr(torch, _TORCH_DTYPES[base])
            a = torch.randn((size, size), dtype=tdt, device=self.info.kind)
            b = torch.randn((size, size), dtype=tdt, device=self.info.kind)
            self.gemm_flops_per_s[base] = 2.0 * size**3 / self._best_s(lambda: a @ b)
        speedup = {DType.FP8: 2.0, DType.TF32: 4.0}.get(dtype, 1.0) if self.info.kind == "cuda" else 1.0
        return self.gemm_flops_per_s[base] * speedup


def estimate_op_s(
    row: Mapping[str, Any], gemm_flops_per_s: float, copy_bytes_per_s: float, vector_elems_per_s: float = math.inf
) -> float:
    """Roofline-free guess of one call's time, s.

    GEMMs and attention: ``max(FLOPs / gemm rate, bytes / copy bandwidth)``; vector ops:
    ``max(elements / vector rate, bytes / copy bandwidth)`` (doubled for backward);
    collectives: bytes / copy bandwidth. The profiler uses it for caps and the budget
    only; it is no prediction.
    """
    op = OpType(str(row["op"]))
    dtype = DType.parse(str(row["dtype"]))
    flops, elems = _element_counts(row, op)
    moved = elems if op in COLLECTIVE_OP_NAMES else elems * _element_size(dtype)
    if op in GEMM_OP_NAMES or op is OpType.ATTENTION:
        compute = flops / gemm_flops_per_s
    elif op in COLLECTIVE_OP_NAMES:
        compute = 0.0
    else:
        compute = _int(row, "rows") * _int(row, "cols") * (2.0 if _flag(row, "backward") else 1.0) / vector_elems_per_s
    return max(compute, moved / copy_bytes_per_s)
