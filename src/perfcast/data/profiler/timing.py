"""Time one op-table row with torch on this machine (:func:`time_op`).

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
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from perfcast.data.profiler.collectives import _CollectiveGroup
from perfcast.data.profiler.device import _TORCH_DTYPES, DeviceInfo, _torch, detect_device
from perfcast.data.profiler.measurement import MIN_FLOOR_REPEATS, Measurement, OpSkipped, RepeatPolicy
from perfcast.data.profiler.rows import _flag, _footprint_bytes, _int
from perfcast.data.schema import COLLECTIVE_OP_NAMES, GEMM_OP_NAMES, DType, OpType, shape_columns

_TIMED_COLLECTIVES = frozenset({OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCESCATTER})


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
