"""perfcast's own op profiler: time op-table rows with torch on this machine's CPU or GPU.

Source of the ``perfcast-profiler`` op records. This module runs ops; it knows nothing of
catalogs (the device name is recorded as torch prints it, ``cpu`` for host runs).

How an op is measured (:func:`time_op`):

* **Inputs**: fresh ``torch.randn`` tensors on the device, seeded (never zeros, which can
  run faster than real data). GEMMs: ``torch.matmul`` (``m x k @ k x n``), ``torch.bmm``,
  ``F.linear`` (with bias); fp8 GEMMs ``torch._scaled_mm`` on e4m3 operands with unit
  scales and bf16 output, on CUDA devices of capability >= 8.9 only; tf32 GEMMs are fp32
  GEMMs with ``torch.backends.cuda.matmul.allow_tf32`` on (CUDA only), fp32 GEMMs run with
  it off (true fp32). Attention:
  ``F.scaled_dot_product_attention`` on ``batch x heads x seq x head_dim`` tensors
  (``enable_gqa`` when ``kv_heads < heads``; torch without it gets K and V repeated
  before timing). Norms: ``F.layer_norm`` and ``F.rms_norm`` (a hand-written RMS norm on
  torch without it) with weights; softmax over the last dimension; element-wise ops
  tensor-tensor, or tensor-scalar with ``scalar=True``. Backward rows time
  ``torch.autograd.grad`` of the forward output (graph built before timing).
* **Timer**: on CUDA a pair of CUDA events around every repeat (``elapsed_time``, one
  synchronize after the batch); on CPU ``time.perf_counter_ns`` around every call (CPU
  ops are synchronous).
* **Warm-up**: ``warmup`` calls first (stopping early once they took a quarter of
  ``max_time_s``), so handle creation and kernel selection stay out of the numbers.
* **Repeats** (:class:`RepeatPolicy`): repeat until both ``min_repeats`` calls and
  ``min_time_s`` of measured time, or ``max_repeats`` calls; once ``max_time_s`` of
  measured time passed, stop at 3 calls. On CUDA the count is set from one synchronised
  probe call (the events are only read at the end).
* **Statistic**: the median (``measured_ms``), with min, max, standard deviation
  (``ddof=1``) and the number of repeats.
* **L2 flush** (CUDA, off by default): with ``flush_l2`` a buffer twice the L2 size is
  zeroed before every repeat, outside the timed events, so inputs start cold in L2.
  Off, back-to-back repeats find small inputs in L2, as consecutive ops of a step do.

Caps (:func:`run_profile`): a short calibration (one GEMM per dtype and one copy) gives
throughput, bandwidth and element-rate guesses; a row's roofline-free estimate is
``max(FLOPs / gemm_rate, bytes / copy_bandwidth)`` (vector ops: elements / gelu rate in
place of the FLOPs term, see :func:`estimate_op_s`). On CPU, rows whose estimate exceeds
``cpu_op_cap_s`` (0.5 s) are skipped with reason ``cpu-time-cap`` (decided again on resume,
as the calibration of a busy machine can be pessimistic); on every device a row
whose estimated cost no longer fits the remaining budget is not started, and rows whose
tensors would not fit in free memory are skipped (``out-of-memory``).

Collectives run only with CUDA and more than one device: ``torch.multiprocessing``
spawns one worker per extra GPU, all ranks join an NCCL process group (the calling
process is rank 0) with one subgroup per group size, and rank 0's CUDA events time each
call; the ranks run the same fixed number of repeats in lock-step. Elsewhere collective
rows are skipped (``needs-multi-gpu``).

Journal and output (:func:`run_profile`): every measured or skipped row is appended as one
JSON line to ``OUT/.partial/measurements.jsonl`` (flushed and fsynced), so a sweep
stopped by the budget, Ctrl-C or a crash resumes where it stopped. At the end the dataset
is written with :func:`perfcast.data.dataset.write_dataset` (a temporary sibling folder
that then replaces ``OUT``), so ``.partial`` goes with the old folder only after that
succeeded. The profiler's fields (device, method, plan counts, skipped rows) are in the
card's ``extra``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from perfcast._optional import require
from perfcast.data.dataset import CARD_FILE, DATASET_ENTRIES, PARTIAL_DIR, TABLE_FILES, read_card, write_dataset
from perfcast.data.schema import COLLECTIVE_OP_NAMES, GEMM_OP_NAMES, DType, OpType, shape_columns
from perfcast.data.tables import OP_COLUMNS
from perfcast.errors import DatasetError, SpecError

__all__ = [
    "DeviceInfo",
    "Measurement",
    "OpSkipped",
    "ProfileProgress",
    "ProfileResult",
    "RepeatPolicy",
    "SOURCE",
    "detect_device",
    "estimate_op_s",
    "run_profile",
    "time_op",
]

logger = logging.getLogger(__name__)

SOURCE = "perfcast-profiler"
JOURNAL_FILE = "measurements.jsonl"
META_FILE = "meta.json"
OPS_FILE = TABLE_FILES["ops"]
DEFAULT_CPU_OP_CAP_S = 0.5
MIN_FLOOR_REPEATS = 3
_ROW_COLUMNS = (*(c for c in OP_COLUMNS if c != "gpu"), "backward")
_VECTOR_PASSES = {OpType.SOFTMAX: 3.0, OpType.LAYERNORM: 3.0, OpType.RMSNORM: 3.0}
"""Memory passes of the vector ops (read + write = 2 for plain element-wise ops)."""


# ----------------------------------------------------------------------------- types


@dataclass(frozen=True)
class DeviceInfo:
    """The device a profile runs on.

    Attributes:
        kind: ``cpu`` or ``cuda``.
        name: as torch prints it (``torch.cuda.get_device_name``), or the CPU model.
        count: CUDA devices visible (1 for the CPU).
        torch_version, cuda_version, driver_version: software versions (CUDA ones only on cuda).
        properties: ``total_memory`` (bytes), ``multi_processor_count``, ``capability``,
            ``l2_cache_bytes`` on CUDA; ``logical_cpus``, ``torch_threads``, ``machine`` on CPU.
    """

    kind: str
    name: str
    count: int
    torch_version: str
    cuda_version: str | None = None
    driver_version: str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def record_gpu(self) -> str:
        """The records' ``gpu``: the printed device name, ``cpu`` for host runs."""
        return "cpu" if self.kind == "cpu" else self.name

    @property
    def capability(self) -> tuple[int, int] | None:
        """CUDA compute capability (major, minor), None on the CPU."""
        cap = self.properties.get("capability")
        return (int(cap[0]), int(cap[1])) if cap else None


@dataclass(frozen=True)
class Measurement:
    """Statistics of the repeats of one op, ms."""

    median_ms: float
    min_ms: float
    max_ms: float
    std_ms: float
    n_repeats: int

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> Measurement:
        """Summarise per-repeat times (ms); the standard deviation uses ``ddof=1``."""
        if not samples_ms:
            raise ValueError("no samples")
        std = statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0
        return cls(
            median_ms=float(statistics.median(samples_ms)),
            min_ms=float(min(samples_ms)),
            max_ms=float(max(samples_ms)),
            std_ms=float(std),
            n_repeats=len(samples_ms),
        )


@dataclass(frozen=True)
class RepeatPolicy:
    """How many times an op runs (see the module docstring, "Repeats")."""

    warmup: int = 3
    min_repeats: int = 5
    max_repeats: int = 100
    min_time_s: float = 0.1
    max_time_s: float = 1.0

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            raise SpecError(
                f"repeat policy warmup={self.warmup}, min_repeats={self.min_repeats}, "
                f"max_repeats={self.max_repeats}: need warmup >= 0 and 1 <= min_repeats <= max_repeats"
            )

    def describe(self) -> str:
        return (
            f"repeat until >= {self.min_repeats} calls and >= {self.min_time_s:g} s measured, or "
            f"{self.max_repeats} calls; after {self.max_time_s:g} s measured stop at {MIN_FLOOR_REPEATS} calls"
        )


class OpSkipped(Exception):  # noqa: N818  (a skip, not an error)
    """A row that cannot or should not run here; ``reason`` is a short code, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ProfileProgress:
    """What :func:`run_profile` reports to its ``progress`` callback before each row and at the end."""

    done: int  # plan rows finished (measured, skipped or found in the journal)
    total: int
    measured: int
    skipped: int
    elapsed_s: float
    budget_s: float
    current: str  # the row about to run; "" at the end


@dataclass(frozen=True)
class ProfileResult:
    """What :func:`run_profile` wrote and how the sweep went."""

    out_dir: Path
    records: pd.DataFrame
    card: dict[str, Any]
    n_measured: int
    n_skipped: int
    skipped_by_reason: dict[str, int]
    n_not_reached: int
    elapsed_s: float

    @property
    def complete(self) -> bool:
        """True when every plan row was measured or skipped."""
        return self.n_not_reached == 0


# ----------------------------------------------------------------------------- device


def _torch() -> Any:
    require("torch", purpose="perfcast profile")
    import torch

    return torch


def detect_device(kind: str) -> DeviceInfo:
    """Describe the CPU (``kind="cpu"``) or the first CUDA device (``"cuda"``).

    Raises:
        DatasetError: ``cuda`` is asked for but torch sees no CUDA device.
        SpecError: ``kind`` is neither ``cpu`` nor ``cuda``.
    """
    torch = _torch()
    kind = str(kind).strip().lower()
    if kind == "cpu":
        return DeviceInfo(
            kind="cpu",
            name=_cpu_name(),
            count=1,
            torch_version=torch.__version__,
            properties={
                "logical_cpus": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "machine": platform.machine(),
            },
        )
    if kind != "cuda":
        raise SpecError(f"device={kind!r} is not supported; allowed: cpu, cuda")
    if not torch.cuda.is_available():
        raise DatasetError(
            f"device=cuda was requested but torch {torch.__version__} sees no CUDA device "
            f"(torch built with CUDA {torch.version.cuda or 'none'}); use --device cpu or a CUDA build of torch"
        )
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        kind="cuda",
        name=torch.cuda.get_device_name(0),
        count=torch.cuda.device_count(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        driver_version=_driver_version(),
        properties={
            "total_memory": int(props.total_memory),
            "multi_processor_count": int(props.multi_processor_count),
            "capability": [int(props.major), int(props.minor)],
            "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        },
    )


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


# ----------------------------------------------------------------------------- building ops

_TORCH_DTYPES = {DType.FP32: "float32", DType.TF32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16"}


def _int(row: Mapping[str, Any], col: str) -> int:
    value = row.get(col)
    return 0 if value is None or pd.isna(value) else int(value)


def _flag(row: Mapping[str, Any], col: str) -> bool:
    value = row.get(col)
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "t", "y")
    return bool(value)


def _element_counts(row: Mapping[str, Any], op: OpType) -> tuple[float, float]:
    """(FLOPs, elements read + written) of one call of a row, roofline-free."""
    if op in GEMM_OP_NAMES:
        b, m, n, k = (_int(row, c) for c in ("batch", "m", "n", "k"))
        return 2.0 * b * m * n * k, float(b * (m * k + k * n + m * n))
    if op is OpType.ATTENTION:
        b, h, kv, sq, skv, d = (_int(row, c) for c in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"))
        kv = kv or h
        flops = 4.0 * b * h * sq * skv * d * (0.5 if _flag(row, "causal") else 1.0)
        elems = float(b * d * (2 * h * sq + 2 * kv * skv))
        return (flops * 2.5, elems * 2) if _flag(row, "backward") else (flops, elems)
    if op in COLLECTIVE_OP_NAMES:
        return 0.0, float(_int(row, "bytes"))
    elems = float(_int(row, "rows") * _int(row, "cols"))
    passes = _VECTOR_PASSES.get(op, 2.0 if _flag(row, "scalar") or op not in _BINARY else 3.0)
    return elems * 8.0, elems * passes * (2.0 if _flag(row, "backward") else 1.0)


_BINARY = frozenset({OpType.ADD, OpType.MUL, OpType.DIV, OpType.POW})
_REDECIDED = frozenset({"cpu-time-cap"})
"""Skip reasons that rest on this run's calibration: a resumed sweep decides those rows again."""
_TIMED_COLLECTIVES = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCESCATTER})
_SETUP_FACTOR = 10.0
"""Filling a tensor with ``randn`` costs about this many copies of it (budget guard only)."""


def _element_size(dtype: DType) -> int:
    return max(dtype.bytes_per_element, 2) if dtype is DType.FP8 else dtype.bytes_per_element


def _footprint_bytes(row: Mapping[str, Any], op: OpType, dtype: DType) -> float:
    _, elems = _element_counts(row, op)
    if op in COLLECTIVE_OP_NAMES:
        return 2.0 * elems
    return elems * _element_size(dtype) * (3.0 if _flag(row, "backward") else 1.5)


def _check_supported(row: Mapping[str, Any], op: OpType, dtype: DType, info: DeviceInfo) -> None:
    torch = _torch()
    if op in COLLECTIVE_OP_NAMES:
        if info.kind != "cuda" or info.count < 2:
            raise OpSkipped(
                "needs-multi-gpu", f"{op.value} needs >= 2 CUDA devices; this run has {info.count} {info.kind}"
            )
        if _int(row, "n_ranks") > info.count:
            raise OpSkipped("needs-multi-gpu", f"n_ranks={_int(row, 'n_ranks')} > {info.count} CUDA devices")
        if op not in _TIMED_COLLECTIVES:
            raise OpSkipped("unsupported-op", f"the profiler does not time {op.value}")
        if dtype is DType.FP8:
            raise OpSkipped("unsupported-dtype", "fp8 collectives are not timed")
        return
    if dtype is DType.TF32:
        if info.kind != "cuda":
            raise OpSkipped("unsupported-dtype", "tf32 is a CUDA tensor-core mode; the CPU has none")
        if op not in GEMM_OP_NAMES:
            raise OpSkipped("unsupported-dtype", f"tf32 applies to GEMMs, not {op.value}")
    if dtype is DType.FP8:
        if op not in GEMM_OP_NAMES:
            raise OpSkipped("unsupported-dtype", f"fp8 applies to GEMMs, not {op.value}")
        cap = info.capability
        if info.kind != "cuda" or cap is None or cap < (8, 9):
            raise OpSkipped("unsupported-dtype", f"fp8 GEMMs need a CUDA device of capability >= 8.9 (have {cap})")
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            raise OpSkipped("unsupported-dtype", f"torch {torch.__version__} has no torch._scaled_mm")
        if _int(row, "batch") > 1:
            raise OpSkipped("fp8-shape", "torch._scaled_mm has no batched form")
        if any(_int(row, c) % 16 for c in ("m", "n", "k")):
            raise OpSkipped("fp8-shape", "torch._scaled_mm needs m, n and k divisible by 16")
    if _flag(row, "backward") and op in GEMM_OP_NAMES:
        raise OpSkipped("unsupported-op", "GEMM backward is profiled as its data- and weight-gradient GEMMs")
    if op not in _BUILDERS:
        raise OpSkipped("unsupported-op", f"the profiler cannot run op={op.value}")


def _randn(shape: tuple[int, ...], dtype: Any, dev: Any, gen: Any, grad: bool = False) -> Any:
    torch = _torch()
    return torch.randn(shape, dtype=dtype, device=dev, generator=gen).requires_grad_(grad)


def _build_gemm(row: Mapping[str, Any], op: OpType, dtype: DType, dev: Any, gen: Any) -> Callable[[], Any]:
    torch = _torch()
    import torch.nn.functional as F  # noqa: N812

    b, m, n, k = (_int(row, c) for c in ("batch", "m", "n", "k"))
    if dtype is DType.FP8:
        a = _randn((m, k), torch.bfloat16, dev, gen).to(torch.float8_e4m3fn)
        w = _randn((n, k), torch.bfloat16, dev, gen).to(torch.float8_e4m3fn).t()  # column-major k x n
        one = torch.ones((), device=dev, dtype=torch.float32)
        return lambda: torch._scaled_mm(a, w, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    if op is OpType.LINEAR:
        x = _randn((b, m, k) if b > 1 else (m, k), tdt, dev, gen)
        w, bias = _randn((n, k), tdt, dev, gen), _randn((n,), tdt, dev, gen)
        return lambda: F.linear(x, w, bias)
    if op is OpType.BMM or b > 1:
        x, y = _randn((b, m, k), tdt, dev, gen), _randn((b, k, n), tdt, dev, gen)
        return lambda: torch.bmm(x, y)
    x, y = _randn((m, k), tdt, dev, gen), _randn((k, n), tdt, dev, gen)
    return lambda: torch.matmul(x, y)


def _build_attention(row: Mapping[str, Any], grad: bool, tdt: Any, dev: Any, gen: Any) -> tuple[Callable, list]:
    import torch.nn.functional as F  # noqa: N812

    b, h, sq, skv, d = (_int(row, c) for c in ("batch", "heads", "seq_q", "seq_kv", "head_dim"))
    kv = _int(row, "kv_heads") or h
    if h % kv:
        raise OpSkipped("unsupported-op", f"kv_heads={kv} does not divide heads={h}")
    q = _randn((b, h, sq, d), tdt, dev, gen, grad)
    k, v = _randn((b, kv, skv, d), tdt, dev, gen, grad), _randn((b, kv, skv, d), tdt, dev, gen, grad)
    causal = _flag(row, "causal")
    if kv == h:
        return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)), [q, k, v]
    try:
        F.scaled_dot_product_attention(q[:1, :, :1], k[:1, :, :1], v[:1, :, :1], is_causal=False, enable_gqa=True)
    except TypeError:  # torch < 2.5: repeat K and V outside the timed call
        k2, v2 = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
        return (lambda: F.scaled_dot_product_attention(q, k2, v2, is_causal=causal)), [q, k, v]
    return (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)), [q, k, v]


def _build_vector(
    row: Mapping[str, Any], op: OpType, grad: bool, tdt: Any, dev: Any, gen: Any
) -> tuple[Callable, list]:
    torch = _torch()
    import torch.nn.functional as F  # noqa: N812

    rows, cols = _int(row, "rows"), _int(row, "cols")
    x = _randn((rows, cols), tdt, dev, gen, grad)
    if op is OpType.SOFTMAX:
        return (lambda: torch.softmax(x, dim=-1)), [x]
    if op in (OpType.LAYERNORM, OpType.RMSNORM):
        w = _randn((cols,), tdt, dev, gen, grad)
        if op is OpType.LAYERNORM:
            bias = _randn((cols,), tdt, dev, gen, grad)
            return (lambda: F.layer_norm(x, (cols,), w, bias)), [x, w, bias]
        if hasattr(F, "rms_norm"):
            return (lambda: F.rms_norm(x, (cols,), w)), [x, w]
        return (lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w), [x, w]
    unary = {OpType.RELU: F.relu, OpType.GELU: F.gelu, OpType.SILU: F.silu, OpType.TANH: torch.tanh}
    if op in unary:
        fn = unary[op]
        return (lambda: fn(x)), [x]
    binary = {OpType.ADD: torch.add, OpType.MUL: torch.mul, OpType.DIV: torch.div, OpType.POW: torch.pow}
    fn = binary[op]
    if _flag(row, "scalar"):
        return (lambda: fn(x, 1.5)), [x]
    y = _randn((rows, cols), tdt, dev, gen, grad)
    if op is OpType.POW:
        y = (y.abs().detach() * 0.1).requires_grad_(grad)  # keep x ** y finite and its gradient defined
        x = (x.abs().detach() + 0.5).requires_grad_(grad)
    return (lambda: fn(x, y)), [x, y]


_BUILDERS = frozenset(
    {
        OpType.MATMUL,
        OpType.BMM,
        OpType.LINEAR,
        OpType.ATTENTION,
        OpType.SOFTMAX,
        OpType.LAYERNORM,
        OpType.RMSNORM,
        OpType.RELU,
        OpType.GELU,
        OpType.SILU,
        OpType.TANH,
        OpType.ADD,
        OpType.MUL,
        OpType.DIV,
        OpType.POW,
    }
)


def _build_op(row: Mapping[str, Any], op: OpType, dtype: DType, dev: Any, gen: Any) -> Callable[[], Any]:
    """A zero-argument callable that runs the row's op once on prepared tensors."""
    torch = _torch()
    if op in GEMM_OP_NAMES:
        return _build_gemm(row, op, dtype, dev, gen)
    tdt = getattr(torch, _TORCH_DTYPES[dtype])
    grad = _flag(row, "backward")
    if op is OpType.ATTENTION:
        fn, inputs = _build_attention(row, grad, tdt, dev, gen)
    else:
        fn, inputs = _build_vector(row, op, grad, tdt, dev, gen)
    if not grad:
        return fn
    out = fn()
    grad_out = torch.randn_like(out)
    leaves = [t for t in inputs if t.requires_grad]
    return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)


# ----------------------------------------------------------------------------- timing


def _free_bytes(info: DeviceInfo) -> float:
    if info.kind == "cuda":
        return float(_torch().cuda.mem_get_info()[0]) * 0.9
    with contextlib.suppress(ValueError, OSError, AttributeError):
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")) * 0.5
    return math.inf


@contextlib.contextmanager
def _tf32(dtype: DType) -> Iterator[None]:
    torch = _torch()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = dtype is DType.TF32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def time_op(
    row: Mapping[str, Any],
    device: DeviceInfo | str,
    *,
    warmup: int | None = None,
    repeats: int | None = None,
    policy: RepeatPolicy | None = None,
    flush_l2: bool = False,
    seed: int = 0,
) -> Measurement:
    """Time one op-table row on ``device`` (see the module docstring for the method).

    Args:
        row: an op-table row (mapping or Series): ``op``, ``dtype`` and the op's shape columns.
        device: a :class:`DeviceInfo`, or ``"cpu"`` / ``"cuda"``.
        warmup: overrides the policy's warm-up calls.
        repeats: a fixed number of timed calls instead of the adaptive policy.
        policy: the adaptive repeat policy (default :class:`RepeatPolicy`).
        flush_l2: zero a buffer twice the L2 size before each CUDA repeat (outside the timing).
        seed: seeds the random inputs.

    Raises:
        OpSkipped: the row cannot run here (dtype or op unsupported, too little memory ...).
    """
    info = device if isinstance(device, DeviceInfo) else detect_device(device)
    policy = policy or RepeatPolicy()
    if warmup is not None:
        policy = replace(policy, warmup=warmup)
    if repeats is not None:
        policy = replace(policy, min_repeats=repeats, max_repeats=repeats, min_time_s=0.0, max_time_s=math.inf)
    try:
        op = OpType(str(row["op"]).strip().lower())
        dtype = DType.parse(str(row["dtype"]))
    except (KeyError, ValueError) as exc:
        raise OpSkipped("bad-row", f"op={row.get('op')!r}, dtype={row.get('dtype')!r}: {exc}") from None
    _check_supported(row, op, dtype, info)
    missing = [c for c in shape_columns(op) if _int(row, c) <= 0]
    if missing:
        raise OpSkipped("bad-row", f"{', '.join(missing)} must be positive for op={op.value}")
    need, free = _footprint_bytes(row, op, dtype), _free_bytes(info)
    if need > free:
        raise OpSkipped("out-of-memory", f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
    if op in COLLECTIVE_OP_NAMES:
        with _CollectiveGroup(info.count) as group:
            return group.time(row, policy)
    torch = _torch()
    dev = torch.device("cuda", 0) if info.kind == "cuda" else torch.device("cpu")
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)
    try:
        with _tf32(dtype):
            fn = _build_op(row, op, dtype, dev, gen)
            flush = _l2_flush_buffer(info) if flush_l2 and info.kind == "cuda" else None
            samples = _measure_cuda(fn, policy, flush) if info.kind == "cuda" else _measure_cpu(fn, policy)
    except torch.cuda.OutOfMemoryError as exc:
        raise OpSkipped("out-of-memory", str(exc).splitlines()[0]) from None
    finally:
        fn = flush = None  # noqa: F841  (release tensors before the next row)
        if info.kind == "cuda":
            torch.cuda.empty_cache()
    return Measurement.from_samples(samples)


def _l2_flush_buffer(info: DeviceInfo) -> Any:
    torch = _torch()
    l2 = info.properties.get("l2_cache_bytes") or 64 * 2**20
    return torch.empty(int(2 * l2), dtype=torch.uint8, device="cuda")


def _measure_cpu(fn: Callable[[], Any], policy: RepeatPolicy) -> list[float]:
    spent = 0.0
    for _ in range(policy.warmup):
        t0 = time.perf_counter_ns()
        fn()
        spent += (time.perf_counter_ns() - t0) / 1e9
        if spent >= policy.max_time_s / 4:
            break
    samples: list[float] = []
    total = 0.0
    while True:
        t0 = time.perf_counter_ns()
        fn()
        dt = time.perf_counter_ns() - t0
        samples.append(dt / 1e6)
        total += dt / 1e9
        n = len(samples)
        if n >= policy.max_repeats or (n >= policy.min_repeats and total >= policy.min_time_s):
            return samples
        if n >= min(MIN_FLOOR_REPEATS, policy.min_repeats) and total >= policy.max_time_s:
            return samples


def _measure_cuda(fn: Callable[[], Any], policy: RepeatPolicy, flush: Any) -> list[float]:
    torch = _torch()
    spent = 0.0
    for _ in range(policy.warmup):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        spent += time.perf_counter() - t0
        if spent >= policy.max_time_s / 4:
            break
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    probe = max(time.perf_counter() - t0, 1e-6)
    n = min(max(math.ceil(policy.min_time_s / probe), policy.min_repeats), policy.max_repeats)
    if probe * n > policy.max_time_s:
        n = max(min(MIN_FLOOR_REPEATS, policy.min_repeats), min(n, int(policy.max_time_s / probe)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for start, end in zip(starts, ends, strict=True):
        if flush is not None:
            flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]


# ----------------------------------------------------------------------------- collectives

_COLLECTIVE_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collective_setup(rank: int, world: int, port: int) -> dict[int, Any]:
    """Join the NCCL group as ``rank`` and create one subgroup per size (every rank, same order)."""
    torch = _torch()
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=_COLLECTIVE_TIMEOUT_S),
    )
    return {n: dist.new_group(list(range(n))) for n in range(2, world + 1)}


def _run_collective(rank: int, groups: dict[int, Any], row: Mapping[str, Any], n_calls: int, warmup: int) -> list:
    """Run one collective row on this rank; returns per-call times (ms) measured with CUDA events."""
    torch = _torch()
    import torch.distributed as dist

    op, n = OpType(row["op"]), _int(row, "n_ranks")
    if rank >= n:
        return []
    dtype = getattr(torch, _TORCH_DTYPES[DType.parse(row["dtype"])])
    numel = max(n, _int(row, "bytes") // torch.tensor([], dtype=dtype).element_size() // n * n)
    group = groups[n]
    if op is OpType.ALLREDUCE:
        buf = torch.randn(numel, dtype=dtype, device="cuda")

        def call() -> None:
            dist.all_reduce(buf, group=group)
    elif op is OpType.ALLGATHER:
        out, part = torch.empty(numel, dtype=dtype, device="cuda"), torch.randn(numel // n, dtype=dtype, device="cuda")

        def call() -> None:
            dist.all_gather_into_tensor(out, part, group=group)
    elif op is OpType.REDUCESCATTER:
        full, part = torch.randn(numel, dtype=dtype, device="cuda"), torch.empty(numel // n, dtype=dtype, device="cuda")

        def call() -> None:
            dist.reduce_scatter_tensor(part, full, group=group)
    else:
        raise OpSkipped("unsupported-op", f"the profiler does not time {op.value}")
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_calls)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]


def _collective_worker(rank: int, world: int, port: int, commands: Any, errors: Any) -> None:
    """Body of ranks 1..world-1: run the rows rank 0 sends until it sends None."""
    import torch.distributed as dist

    try:
        groups = _collective_setup(rank, world, port)
        while (job := commands.get()) is not None:
            row, n_calls, warmup = job
            _run_collective(rank, groups, row, n_calls, warmup)
        dist.destroy_process_group()
    except Exception:  # reported to rank 0, which would otherwise wait for the NCCL timeout
        errors.put(f"rank {rank}: {traceback.format_exc()}")


class _CollectiveGroup:
    """An NCCL group over every visible GPU: this process is rank 0, spawned workers the rest."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.procs: list[Any] = []
        self.queues: list[Any] = []

    def __enter__(self) -> _CollectiveGroup:
        torch = _torch()
        ctx = torch.multiprocessing.get_context("spawn")
        port = _free_port()
        self.errors = ctx.Queue()
        for rank in range(1, self.world):
            q = ctx.Queue()
            proc = ctx.Process(target=_collective_worker, args=(rank, self.world, port, q, self.errors), daemon=True)
            proc.start()
            self.queues.append(q)
            self.procs.append(proc)
        self.groups = _collective_setup(0, self.world, port)
        return self

    def time(self, row: Mapping[str, Any], policy: RepeatPolicy) -> Measurement:
        if not self.errors.empty():
            raise DatasetError(f"a collective worker failed: {self.errors.get()}")
        n_calls = max(policy.min_repeats, 10)
        job = ({c: row.get(c) for c in ("op", "dtype", "bytes", "n_ranks")}, n_calls, max(policy.warmup, 1))
        for q in self.queues:
            q.put(job)
        return Measurement.from_samples(_run_collective(0, self.groups, job[0], n_calls, job[2]))

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        for q in self.queues:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- estimates


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


# ----------------------------------------------------------------------------- the sweep


def _now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _clean_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """Shape columns of a plan row as JSON-safe Python values (0 / False for unused)."""
    out: dict[str, Any] = {}
    for col in _ROW_COLUMNS:
        if col in ("op", "dtype"):
            out[col] = str(row.get(col))
        elif col in ("scalar", "causal", "backward"):
            out[col] = _flag(row, col)
        else:
            out[col] = _int(row, col)
    return out


def _describe(row: Mapping[str, Any]) -> str:
    op = str(row.get("op"))
    names = ("batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "head_dim", "bytes", "n_ranks")
    shape = " ".join(f"{c}={_int(row, c)}" for c in names if _int(row, c))
    flags = "".join(f" {c}" for c in ("scalar", "causal", "backward") if _flag(row, c))
    return f"{op} {row.get('dtype')} {shape}{flags}"


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise DatasetError(f"output {out_dir} exists and is not a directory")
    if out_dir.is_dir():
        other = sorted(p.name for p in out_dir.iterdir() if p.name not in DATASET_ENTRIES)
        if other:
            raise DatasetError(
                f"output directory {out_dir} holds files that are not a perfcast profile "
                f"({', '.join(other[:5])}); give a new or empty directory"
            )


def _read_journal(path: Path) -> list[dict[str, Any]]:
    """Entries of a journal; a torn last line (a crash mid-write) is dropped."""
    entries = []
    if not path.exists():
        return entries
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: line %d is not JSON (an interrupted write?); ignored", path, i + 1)
    return entries


def _check_same_device(found: str | None, info: DeviceInfo, where: Path) -> None:
    if found is not None and found != info.name:
        raise DatasetError(
            f"{where} was measured on {found!r}, this run is on {info.name!r}; "
            "resume only on the same device, or start over (--no-resume) or write elsewhere"
        )


def run_profile(
    plan: pd.DataFrame,
    device_kind: str,
    out_dir: str | Path,
    *,
    budget_s: float,
    resume: bool = True,
    progress: Callable[[ProfileProgress], None] | None = None,
    policy: RepeatPolicy | None = None,
    cpu_op_cap_s: float = DEFAULT_CPU_OP_CAP_S,
    flush_l2: bool = False,
    seed: int = 0,
    card_extra: Mapping[str, Any] | None = None,
) -> ProfileResult:
    """Measure ``plan`` rows in order until ``budget_s`` is spent; write the dataset to ``out_dir``.

    Args:
        plan: op-table rows with a ``key`` column (e.g. from
            :func:`perfcast.features.sweeps.profile_plan`); a plan without keys gets
            row-number keys, which do not survive a change of plan.
        device_kind: ``cpu`` or ``cuda``.
        out_dir: dataset directory: ``ops.parquet``, ``card.json`` and, while a sweep is
            unfinished, ``.partial/``. It must be new, empty or an earlier profile.
        budget_s: wall-clock budget, s (calibration included). A row whose estimated cost
            exceeds what is left is not started; later, cheaper rows still are.
        resume: skip rows already in ``.partial`` or in an earlier dataset in ``out_dir``
            and merge with them; False starts over and replaces ``out_dir``.
        progress: called with a :class:`ProfileProgress` before each row and at the end.
        policy: repeat policy (default :class:`RepeatPolicy`).
        cpu_op_cap_s: on CPU, skip rows whose estimated call time exceeds this, s.
        flush_l2: flush the L2 before each CUDA repeat.
        seed: seeds the random inputs.
        card_extra: more fields for ``card.json`` (e.g. the catalog id of the device).

    Returns:
        The records written and the counts.

    Raises:
        DatasetError: cuda unavailable, ``out_dir`` holds other files, or a resume on a
            different device.
        KeyboardInterrupt: re-raised after the journal is closed; ``.partial`` stays so
            the next run resumes.
    """
    start = time.monotonic()
    if budget_s <= 0:
        raise SpecError(f"budget_s={budget_s} must be positive")
    info = detect_device(device_kind)
    policy = policy or RepeatPolicy()
    out_dir = Path(out_dir)
    journal_path, done, prior = _open_partial(out_dir, info, resume)
    plan = plan.reset_index(drop=True)
    keys = plan["key"].astype(str).tolist() if "key" in plan else [f"row{i}" for i in range(len(plan))]
    status = Counter(done[k]["status"] for k in set(keys) if k in done)
    rates = _Rates(info)
    not_reached = 0

    def report(current: str) -> None:
        if progress is not None:
            n_done = status["measured"] + status["skipped"]
            elapsed = time.monotonic() - start
            progress(
                ProfileProgress(n_done, len(plan), status["measured"], status["skipped"], elapsed, budget_s, current)
            )

    with contextlib.ExitStack() as stack:
        journal = stack.enter_context(journal_path.open("a", encoding="utf-8"))
        runner = _RowRunner(info, rates, policy, stack, cpu_op_cap_s=cpu_op_cap_s, flush_l2=flush_l2, seed=seed)
        for key, row in zip(keys, plan.to_dict("records"), strict=True):
            if key in done:
                continue
            remaining = budget_s - (time.monotonic() - start)
            entry = runner.plan_entry(key, row, remaining) if remaining > 0 else None
            if entry is None:
                not_reached += 1
                continue
            if "status" not in entry:
                report(_describe(entry["row"]))
                runner.run(entry)
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            os.fsync(journal.fileno())
            done[key] = entry
            status[entry["status"]] += 1
        report("")

    elapsed = time.monotonic() - start
    records = _records([e for e in done.values() if not e.get("prior")], info, prior)
    skipped = [e for e in done.values() if e["status"] == "skipped"]
    by_reason = dict(Counter(e["reason"] for e in skipped))
    counts = {"rows": len(plan), "measured": status["measured"], "skipped": status["skipped"]}
    counts |= {"not_reached": not_reached, "skipped_by_reason": by_reason}
    card = _card(info, plan, records, policy, rates, counts, skipped, budget_s, elapsed, flush_l2, cpu_op_cap_s, seed)
    card = _write_profile(out_dir, records, {**card, **dict(card_extra or {})})
    return ProfileResult(
        out_dir=out_dir,
        records=records,
        card=card,
        n_measured=status["measured"],
        n_skipped=status["skipped"],
        skipped_by_reason=by_reason,
        n_not_reached=not_reached,
        elapsed_s=elapsed,
    )


def _open_partial(
    out_dir: Path, info: DeviceInfo, resume: bool
) -> tuple[Path, dict[str, dict[str, Any]], pd.DataFrame | None]:
    """Prepare ``out_dir/.partial``; return the journal path, the entries done so far and earlier records.

    Done entries come from the journal and, on resume, from an earlier dataset in
    ``out_dir`` (its records, flagged ``prior``, and the skipped rows its card lists).
    """
    _check_out_dir(out_dir)
    partial = out_dir / PARTIAL_DIR
    if not resume and partial.exists():
        shutil.rmtree(partial)
    prior, prior_card = _load_prior(out_dir, info) if resume else (None, {})
    partial.mkdir(parents=True, exist_ok=True)
    meta_path = partial / META_FILE
    if meta_path.exists():
        _check_same_device(json.loads(meta_path.read_text()).get("device_name"), info, partial)
    else:
        meta = {"device_kind": info.kind, "device_name": info.name, "started_utc": _now_utc()}
        _fsync_write(meta_path, json.dumps(meta, indent=2).encode())
    done: dict[str, dict[str, Any]] = {}
    for entry in prior_card.get("extra", {}).get("skipped", []):
        if entry.get("reason") not in _REDECIDED:
            done[str(entry["key"])] = {**entry, "status": "skipped"}
    if prior is not None:
        for key in prior["key"].astype(str):
            done[key] = {"key": key, "status": "measured", "prior": True}
    journal_path = partial / JOURNAL_FILE
    for entry in _read_journal(journal_path):
        if entry.get("reason") not in _REDECIDED:
            done[str(entry["key"])] = entry
    return journal_path, done, prior


class _RowRunner:
    """Decides, for each plan row, whether it runs (caps, budget), and runs it."""

    def __init__(
        self,
        info: DeviceInfo,
        rates: _Rates,
        policy: RepeatPolicy,
        stack: contextlib.ExitStack,
        *,
        cpu_op_cap_s: float,
        flush_l2: bool,
        seed: int,
    ) -> None:
        self.info, self.rates, self.policy, self.stack = info, rates, policy, stack
        self.cpu_op_cap_s, self.flush_l2, self.seed = cpu_op_cap_s, flush_l2, seed
        self.collectives: _CollectiveGroup | None = None

    def plan_entry(self, key: str, row: Mapping[str, Any], remaining_s: float) -> dict[str, Any] | None:
        """The row's journal entry: already ``skipped`` (bad row, CPU cap), to run (no
        status), or None when its estimated cost does not fit ``remaining_s``."""
        clean = _clean_row(row)
        entry: dict[str, Any] = {"key": key, "row": clean, "device_name": self.info.name}
        try:
            op, dtype = OpType(clean["op"]), DType.parse(clean["dtype"])
            r = self.rates
            est = estimate_op_s(clean, r.gemm_rate(dtype), r.copy_bytes_per_s, r.vector_elems_per_s)
        except (ValueError, SpecError) as exc:
            return {**entry, "status": "skipped", "reason": "bad-row", "detail": str(exc)}
        try:
            _check_supported(clean, op, dtype, self.info)
        except OpSkipped as exc:
            return {**entry, "status": "skipped", "reason": exc.reason, "detail": exc.detail}
        if self.info.kind == "cpu" and est > self.cpu_op_cap_s:
            detail = f"estimated {est:.2f} s per call > cap {self.cpu_op_cap_s:g} s"
            return {**entry, "status": "skipped", "reason": "cpu-time-cap", "detail": detail}
        p = self.policy
        calls = p.warmup + p.min_repeats if est * (p.warmup + p.min_repeats) <= p.max_time_s else 1 + MIN_FLOOR_REPEATS
        setup = _footprint_bytes(clean, op, dtype) / self.rates.copy_bytes_per_s * _SETUP_FACTOR
        if setup + max(est * calls, min(p.min_time_s, est * p.max_repeats)) > remaining_s:
            return None
        return entry

    def run(self, entry: dict[str, Any]) -> None:
        """Time the entry's row; fill in its measurement, or its skip reason."""
        row, info = entry["row"], self.info
        op = OpType(row["op"])
        try:
            if op in COLLECTIVE_OP_NAMES:  # _check_supported passed: CUDA with enough devices
                if self.collectives is None:
                    self.collectives = self.stack.enter_context(_CollectiveGroup(info.count))
                m = self.collectives.time(row, self.policy)
            else:
                m = time_op(row, info, policy=self.policy, flush_l2=self.flush_l2, seed=self.seed)
            entry.update(status="measured", t_utc=_now_utc(), **asdict(m))
        except OpSkipped as exc:
            entry.update(status="skipped", reason=exc.reason, detail=exc.detail)
        except (RuntimeError, ValueError) as exc:  # a torch failure on one row: record it and go on
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            entry.update(status="skipped", reason="torch-error", detail=detail[:300])


def _card(
    info: DeviceInfo,
    plan: pd.DataFrame,
    records: pd.DataFrame,
    policy: RepeatPolicy,
    rates: _Rates,
    counts: dict[str, Any],
    skipped: list[dict[str, Any]],
    budget_s: float,
    elapsed_s: float,
    flush_l2: bool,
    cpu_op_cap_s: float,
    seed: int,
) -> dict[str, Any]:
    """The profiler's fields of the dataset card (its ``extra``)."""

    def values(col: str) -> list[str]:
        return sorted(set(plan[col].astype(str))) if col in plan and len(plan) else []

    return {
        "device": {
            "kind": info.kind,
            "name": info.name,
            "count": info.count,
            "torch_version": info.torch_version,
            "cuda_version": info.cuda_version,
            "driver_version": info.driver_version,
            "properties": dict(info.properties),
        },
        "gpu": info.record_gpu,
        "dtypes": values("dtype"),
        "ops": values("op"),
        "families": values("family"),
        "method": {
            "timer": "CUDA events around each call" if info.kind == "cuda" else "time.perf_counter_ns around each call",
            "statistic": "median of the timed calls (measured_ms); min, max, std (ddof=1) beside it",
            "warmup_calls": policy.warmup,
            "repeats": policy.describe(),
            "repeat_policy": asdict(policy),
            "l2_flush": bool(flush_l2 and info.kind == "cuda"),
            "inputs": f"torch.randn, seed {seed}",
            "cpu_op_cap_s": cpu_op_cap_s if info.kind == "cpu" else None,
            "calibration": {
                "copy_gbps": rates.copy_bytes_per_s / 1e9,
                "gelu_gelems_per_s": rates.vector_elems_per_s / 1e9,
                "gemm_tflops": {d.value: r / 1e12 for d, r in rates.gemm_flops_per_s.items()},
            },
        },
        "plan": counts,
        "budget_s": budget_s,
        "elapsed_s": round(elapsed_s, 3),
        "skipped": [
            {
                "key": e["key"],
                "op": e.get("row", {}).get("op"),
                "dtype": e.get("row", {}).get("dtype"),
                "reason": e["reason"],
                "detail": e.get("detail", ""),
            }
            for e in skipped
        ],  # fmt: skip
    }


def _load_prior(out_dir: Path, info: DeviceInfo) -> tuple[pd.DataFrame | None, dict[str, Any]]:
    """Records and card of an earlier profile in ``out_dir`` ((None, {}) when there is none)."""
    ops, card = out_dir / OPS_FILE, out_dir / CARD_FILE
    if not ops.exists():
        return None, {}
    try:
        meta = json.loads(card.read_text()) if card.exists() else {}
        prior = pd.read_parquet(ops)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read the earlier profile in {out_dir}: {exc}") from exc
    _check_same_device(meta.get("extra", {}).get("device", {}).get("name"), info, out_dir)
    if "key" not in prior:
        raise DatasetError(f"{ops} has no key column: it was not written by the perfcast profiler")
    return prior, meta


def _records(entries: list[dict[str, Any]], info: DeviceInfo, prior: pd.DataFrame | None) -> pd.DataFrame:
    """Canonical op records of the measured entries, merged with ``prior`` (new rows win)."""
    rows = []
    for e in entries:
        if e["status"] != "measured":
            continue
        rec: dict[str, Any] = dict(e["row"])
        op = OpType(rec["op"])
        used = set(shape_columns(op)) | {"op", "dtype", "backward"}
        used |= {"kv_heads", "causal"} if op is OpType.ATTENTION else set()
        used |= {"ranks_per_node"} if op in COLLECTIVE_OP_NAMES else set()
        used |= {"scalar"} if op not in GEMM_OP_NAMES | COLLECTIVE_OP_NAMES | {OpType.ATTENTION} else set()
        for col in _ROW_COLUMNS:
            if col not in used:
                rec[col] = False if col in ("scalar", "causal") else None  # the validator wants flags set
        rec.update(
            gpu=info.record_gpu,
            measured_ms=e["median_ms"],
            measured_min_ms=e["min_ms"],
            measured_max_ms=e["max_ms"],
            measured_std_ms=e["std_ms"],
            n_repeats=e["n_repeats"],
            source=SOURCE,
            device_name=info.name,
            device_kind=info.kind,
            torch_version=info.torch_version,
            key=e["key"],
            measured_utc=e.get("t_utc"),
        )
        rows.append(rec)
    columns = [*OP_COLUMNS, "backward", "measured_ms", "measured_min_ms", "measured_max_ms", "measured_std_ms"]
    columns += ["n_repeats", "source", "device_name", "device_kind", "torch_version", "key", "measured_utc"]
    new = pd.DataFrame(rows, columns=columns)
    if prior is not None and len(prior):
        new = pd.concat([prior.reindex(columns=columns), new], ignore_index=True)
        new = new.drop_duplicates("key", keep="last").reset_index(drop=True)
    for col in ("batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim"):
        new[col] = pd.to_numeric(new[col]).astype("Int64")
    for col in ("bytes", "n_ranks", "ranks_per_node", "n_repeats"):
        new[col] = pd.to_numeric(new[col]).astype("Int64")
    for col in ("scalar", "causal", "backward"):
        new[col] = new[col].fillna(False).astype(bool)
    for col in ("measured_ms", "measured_min_ms", "measured_max_ms", "measured_std_ms"):
        new[col] = pd.to_numeric(new[col]).astype(float)
    return new


def _fsync_write(path: Path, data: bytes) -> None:
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _write_profile(out_dir: Path, records: pd.DataFrame, card: dict[str, Any]) -> dict[str, Any]:
    """Write the profile as a dataset folder (atomically, replacing ``out_dir`` and its ``.partial``).

    The profiler's own fields (device, method, plan counts, skipped rows) go to the card's
    ``extra``; returns the card as written.
    """
    method = card["method"]
    how = f"{method['timer']}; {method['statistic']}; {method['repeats']}; warm-up {method['warmup_calls']} calls"
    extra = json.loads(json.dumps(card, default=_json_default))
    write_dataset(out_dir, name=out_dir.name, source=SOURCE, how_measured=how, ops=records, extra=extra)
    return read_card(out_dir)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
