"""Reader of PyTorch profiler traces (Kineto chrome-trace JSON) into op records.

Source: the file ``torch.profiler.profile(..., record_shapes=True).export_chrome_trace(path)``
writes (``.json`` or gzip-compressed ``.json.gz``, torch 2.x). The reader uses:

* ``cpu_op`` events (``ph == "X"``): the ATen calls and autograd nodes, with
  ``args["Input Dims"]``, ``args["Input type"]``, ``args["Concrete Inputs"]`` and
  ``args["External id"]``; their nesting (by time on the same ``pid``/``tid``) gives the
  call tree.
* ``kernel`` events (GPU traces): each is linked to the cpu_op that launched it by its
  ``args["External id"]``; failing that, by its ``correlation`` to a ``cuda_runtime`` launch
  (the launch's ``External id``, or the innermost cpu_op around the launch); failing that,
  by its ``ac2g`` flow event back to the launch site.
* ``deviceProperties[i]["name"]`` for the device name (kept as printed, e.g. ``"NVIDIA
  H100 80GB HBM3"``; the registry resolves it later).

Rules:

* **Which ops become records.** ATen calls are mapped to op-table rows by
  :mod:`perfcast.data.readers.aten`. In each call tree the *outermost* call that maps
  becomes the record and its mapped descendants are skipped (``aten::linear`` calls
  ``aten::addmm``: one ``linear`` record); a mapped call whose sizes cannot be read does not
  claim its descendants, which may then map themselves.
* **Time.** On a trace with GPU kernels, an op's time is the sum of the durations of all
  kernels launched inside it (its own and its descendants'), ``timing = "gpu_kernels"``.
  Only ``kernel`` events count (not memcpy/memset). On a CPU-only trace it is the cpu_op's
  own wall duration ``dur``, ``timing = "cpu_op"``. Trace times are microseconds, divided by
  1000 once, here, into ms.
* **backward** is True for ops that run inside an autograd node whose name contains
  ``Backward`` (``MmBackward0``, ``autograd::engine::evaluate_function: MmBackward0``) and for
  ATen backward kernels (``aten::gelu_backward``). Forward ops recomputed inside a
  checkpoint's backward are therefore marked backward.
* **dtype** is the first tensor input's ``Input type`` (``float`` -> fp32,
  ``c10::BFloat16`` -> bf16, ``c10::Half`` -> fp16, ``c10::Float8_*`` -> fp8).
* **Repeats.** Occurrences with the same op, shape columns, dtype, device and ``backward``
  are aggregated into one record: ``measured_ms`` = median, ``measured_min_ms``,
  ``measured_max_ms``, ``n_repeats``. Warm-up iterations are included: profile with a
  ``schedule(wait=1, warmup=1, active=n)`` to keep them out of the trace.
* **device** (``gpu`` column): the ``device`` argument when given; else the name of the
  kernel's device in ``deviceProperties``; on a CPU-only trace ``"cpu"``.

``rejected`` is a summary, one row per (``name``, ``reason``) with a ``count`` column and
``self_ms`` (the time spent in those calls' own kernels, or their own CPU time outside
their children, summed): ATen calls with ``reason = "no op-table equivalent"`` (views,
copies, reductions ... that no mapped call encloses: their time is not in any record),
mapped calls whose sizes or dtype cannot be used, mapped calls that launched no kernel on
a GPU trace, non-positive times, and GPU kernels linked to no cpu_op (``name =
"(unlinked GPU kernels)"``). A trace is full of views: these are not errors.
"""

from __future__ import annotations

import bisect
import gzip
import json
import logging
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

from perfcast.data.readers.aten import (
    NO_EQUIVALENT_REASON,
    AtenCall,
    AtenShapeError,
    OccurrenceSummary,
    aggregate_occurrences,
    dtype_from_input_type,
    is_backward_name,
    is_mapped_aten_op,
    map_aten_op,
    parse_dims,
)
from perfcast.data.records import ReadResult
from perfcast.data.schema import OpTiming
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

SOURCE_NAME = "torch_trace"
"""Prefix of the ``source`` provenance column (followed by the trace's file name)."""

TIMING_GPU = OpTiming.GPU_KERNELS.value
TIMING_CPU = OpTiming.CPU_OP.value
"""Values of the ``timing`` column: summed GPU kernel time, or the cpu_op's wall time."""

HOST_DEVICE = "cpu"
"""Device name of records from CPU-only traces (perfcast.data.validate accepts it)."""

UNLINKED_KERNELS = "(unlinked GPU kernels)"
"""``name`` of the rejected row that counts kernels linked to no cpu_op."""

US_PER_MS = 1000.0
"""Trace timestamps and durations are microseconds."""

_NON_TENSOR_TYPES = frozenset({"", "Scalar", "ScalarList", "GenericList", "TensorList"})


@dataclass
class _Op:
    """One cpu_op event and what the reader learns about it."""

    name: str
    thread: tuple[object, object]
    ts: float
    end: float
    args: dict
    parent: int | None = None
    children_us: float = 0.0
    kernel_us: float = 0.0
    n_kernels: int = 0
    owner: int | None = None
    backward: bool = False
    row: dict[str, object] | None = None
    dims_text: str = ""


def read_torch_trace(path: str | Path, *, device: str | None = None) -> ReadResult:
    """Read a torch.profiler chrome trace (``.json`` or ``.json.gz``) into op records.

    Args:
        path: the file ``export_chrome_trace`` wrote.
        device: device name to put in the ``gpu`` column (as printed, e.g. ``"NVIDIA H100
            80GB HBM3"``); default: the trace's ``deviceProperties`` name on a GPU trace,
            ``"cpu"`` on a CPU-only trace.

    Returns:
        ``records``: one row per distinct (op, shapes, dtype, device, backward), columns
        :data:`~perfcast.data.readers.aten.RECORD_COLUMNS` (see the module docstring for the
        rules). ``rejected``: the summary of calls and kernels not in any record, one row per
        (name, reason) with ``count``.

    Raises:
        DatasetError: the file is missing, truncated or not JSON, is not a profiler trace
            (no ``traceEvents``/``cpu_op`` events), was recorded without
            ``record_shapes=True``, or has GPU kernels but no device name and no ``device``.
    """
    path = Path(path)
    trace = _load_json(path)
    return parse_torch_trace(trace, source=f"{SOURCE_NAME}:{path.name}", device=device, what=str(path))


def parse_torch_trace(
    trace: object, *, source: str = SOURCE_NAME, device: str | None = None, what: str = "trace"
) -> ReadResult:
    """Turn an already loaded chrome trace (``dict`` or bare event list) into op records.

    Args:
        trace: the parsed JSON.
        source: the ``source`` column's value.
        device: as in :func:`read_torch_trace`.
        what: how error messages name the trace (its path).

    Raises:
        DatasetError: as in :func:`read_torch_trace`.
    """
    events = _trace_events(trace, what)
    ops, kernels, runtimes, flows = _classify(events)
    if not ops:
        raise DatasetError(f"{what}: not a torch.profiler trace: no cpu_op events")
    if not any(isinstance(op.args.get("Input Dims"), list) for op in ops):
        raise DatasetError(f"{what}: the trace has no input shapes; profile with record_shapes=True")
    gpu_trace = bool(kernels)
    device_names = _device_names(trace)
    if gpu_trace and device is None and not device_names:
        raise DatasetError(f"{what}: GPU trace without deviceProperties names; pass device=<name as printed>")
    _nest(ops)
    summary = OccurrenceSummary()
    _assign_owners(ops, summary)
    op_devices = _attribute_kernels(ops, kernels, runtimes, flows, summary) if gpu_trace else {}
    rows = _occurrences(ops, gpu_trace, op_devices, device, device_names, summary)
    _summarise_unmapped(ops, gpu_trace, summary)
    records = aggregate_occurrences(rows, source=source)
    logger.info("%s: %d op records from %d occurrences", what, len(records), len(rows))
    return ReadResult(records=records, rejected=summary.frame())


# --------------------------------------------------------------------------- loading


def _load_json(path: Path) -> object:
    if not path.exists():
        raise DatasetError(f"no such file: {path}")
    if not path.is_file():
        raise DatasetError(f"not a file: {path}")
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        return json.loads(data)
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DatasetError(f"cannot read torch.profiler trace {path}: {type(exc).__name__}: {exc}") from exc


def _trace_events(trace: object, what: str) -> list:
    if isinstance(trace, list):
        return trace
    if isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list):
        return trace["traceEvents"]
    raise DatasetError(f"{what}: not a chrome trace: expected an object with a 'traceEvents' list")


def _device_names(trace: object) -> dict[object, str]:
    """``deviceProperties`` as {id: name} (ids as written, falling back to the position)."""
    props = trace.get("deviceProperties") if isinstance(trace, dict) else None
    if not isinstance(props, list):
        return {}
    names: dict[object, str] = {}
    for i, prop in enumerate(props):
        if isinstance(prop, dict) and isinstance(prop.get("name"), str) and prop["name"].strip():
            key = prop.get("id", i)
            names[key if isinstance(key, int | str) else i] = prop["name"].strip()
    return names


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _key(value: object) -> int | str | None:
    """An id usable as a dict key (ints and strings; anything else is no id)."""
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int | str) else None


@dataclass
class _Kernel:
    thread: tuple[object, object]
    ts: float
    dur: float
    ext: int | str | None
    corr: int | str | None
    device: int | str | None
    op: int | None = None


def _classify(events: list) -> tuple[list[_Op], list[_Kernel], dict, dict]:
    """Split events into cpu_ops, kernels, runtime launches {correlation: (thread, ts, ext)}
    and ac2g flows {"s": {id: (thread, ts)}, "f": {(thread, ts): id}}."""
    ops: list[_Op] = []
    kernels: list[_Kernel] = []
    runtimes: dict = {}
    flows: dict = {"s": {}, "f": {}}
    for ev in events:
        if not isinstance(ev, dict):
            continue
        cat, ph = ev.get("cat"), ev.get("ph")
        if not isinstance(cat, str):
            continue
        cat = cat.lower()
        ts = _number(ev.get("ts"))
        if ts is None:
            continue
        thread = (_key(ev.get("pid")), _key(ev.get("tid")))
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if cat == "ac2g" and ph in ("s", "f"):
            flow_id = _key(ev.get("id"))
            if flow_id is not None:
                if ph == "s":
                    flows["s"][flow_id] = (thread, ts)
                else:
                    flows["f"][(thread, ts)] = flow_id
            continue
        dur = _number(ev.get("dur"))
        if ph != "X" or dur is None or dur < 0:
            continue
        if cat == "cpu_op" and isinstance(ev.get("name"), str):
            ops.append(_Op(name=ev["name"], thread=thread, ts=ts, end=ts + dur, args=args))
        elif cat == "kernel":
            kernels.append(
                _Kernel(
                    thread,
                    ts,
                    dur,
                    _key(args.get("External id")),
                    _key(args.get("correlation")),
                    _key(args.get("device")),
                )
            )
        elif cat in ("cuda_runtime", "cuda_driver", "hip_runtime"):
            corr = _key(args.get("correlation"))
            if corr is not None:
                runtimes[corr] = (thread, ts, _key(args.get("External id")))
    return ops, kernels, runtimes, flows


# --------------------------------------------------------------------------- call tree


def _nest(ops: list[_Op]) -> None:
    """Sort ops by thread and start (parents first) and set each op's parent."""
    ops.sort(key=lambda o: (str(o.thread), o.ts, -o.end))
    stack: list[int] = []
    thread = None
    for i, op in enumerate(ops):
        if op.thread != thread:
            stack, thread = [], op.thread
        while stack and ops[stack[-1]].end <= op.ts:
            stack.pop()
        if stack:
            op.parent = stack[-1]
            ops[stack[-1]].children_us += op.end - op.ts
        stack.append(i)


def _call(op: _Op) -> AtenCall | str:
    """The op as an AtenCall, or the reason its sizes cannot be read."""
    dims = parse_dims(op.args.get("Input Dims"))
    if dims is None:
        return "cannot read the input sizes ('Input Dims')"
    concrete = op.args.get("Concrete Inputs")
    if isinstance(concrete, list) and all(isinstance(c, str) for c in concrete):
        concrete_t: tuple[str, ...] | None = tuple(concrete)
    else:
        concrete_t = None
    return AtenCall(op.name, dims, concrete_t)


def _input_dtype(op: _Op) -> str:
    """The op-table dtype of the first tensor input, or raise AtenShapeError saying why not."""
    types = op.args.get("Input type")
    if not isinstance(types, list):
        raise AtenShapeError("no 'Input type'")
    first = next((t for t in types if isinstance(t, str) and t not in _NON_TENSOR_TYPES), None)
    dtype = dtype_from_input_type(first)
    if dtype is None:
        raise AtenShapeError(f"input dtype {first!r} has no op-table dtype")
    return dtype


def _assign_owners(ops: list[_Op], summary: OccurrenceSummary) -> None:
    """Map the outermost mappable call of each tree; mark backward; set each op's owner."""
    for i, op in enumerate(ops):
        parent = ops[op.parent] if op.parent is not None else None
        op.backward = (parent.backward if parent else False) or is_backward_name(op.name)
        if parent is not None and parent.owner is not None:
            op.owner = parent.owner
            continue
        if not is_mapped_aten_op(op.name):
            continue
        call = _call(op)
        op.dims_text = "" if isinstance(call, str) else str([list(d) for d in call.dims])[:200]
        try:
            if isinstance(call, str):
                raise AtenShapeError(call)
            row = map_aten_op(call)
            if row is None:  # pragma: no cover - is_mapped_aten_op said it maps
                continue
            row["dtype"] = _input_dtype(op)
        except AtenShapeError as exc:
            summary.add(op.name, str(exc), dims=op.dims_text)
            continue
        op.row = row
        op.owner = i


# --------------------------------------------------------------------------- kernels


def _innermost(ops: list[_Op], starts: dict, thread: tuple, ts: float) -> int | None:
    """Index of the innermost op on ``thread`` whose span contains ``ts``."""
    entry = starts.get(thread)
    if entry is None:
        return None
    offset, times = entry
    j = bisect.bisect_right(times, ts) - 1
    idx = offset + j if j >= 0 else None
    while idx is not None and not (ops[idx].ts <= ts <= ops[idx].end):
        idx = ops[idx].parent
    return idx


def _attribute_kernels(
    ops: list[_Op], kernels: list[_Kernel], runtimes: dict, flows: dict, summary: OccurrenceSummary
) -> dict:
    """Link each kernel to a cpu_op and add its time there; returns {op index: device id}."""
    by_ext: dict = {}
    starts: dict = {}
    for i, op in enumerate(ops):
        ext = _key(op.args.get("External id"))
        if ext is not None:
            by_ext.setdefault(ext, i)
        if op.thread not in starts:
            starts[op.thread] = (i, [])
        starts[op.thread][1].append(op.ts)
    devices: dict[int, object] = {}
    for k in kernels:
        idx = by_ext.get(k.ext) if k.ext is not None else None
        if idx is None and k.corr is not None and k.corr in runtimes:
            thread, ts, ext = runtimes[k.corr]
            idx = by_ext.get(ext) if ext is not None else None
            if idx is None:
                idx = _innermost(ops, starts, thread, ts)
        if idx is None:
            flow_id = flows["f"].get((k.thread, k.ts))
            if flow_id is not None and flow_id in flows["s"]:
                idx = _innermost(ops, starts, *flows["s"][flow_id])
        if idx is None:
            summary.add(UNLINKED_KERNELS, "kernel not linked to any cpu_op", k.dur / US_PER_MS)
            continue
        ops[idx].kernel_us += k.dur
        ops[idx].n_kernels += 1
        owner = ops[idx].owner
        if owner is not None:
            ops[owner].kernel_us += k.dur if owner != idx else 0.0
            ops[owner].n_kernels += 1 if owner != idx else 0
            devices.setdefault(owner, k.device)
    return devices


# --------------------------------------------------------------------------- records


def _occurrences(
    ops: list[_Op], gpu_trace: bool, op_devices: dict, device: str | None, names: dict, summary: OccurrenceSummary
) -> list[dict]:
    rows = []
    first_name = next(iter(names.values()), None)
    for i, op in enumerate(ops):
        if op.owner != i or op.row is None:
            continue
        if gpu_trace:
            if op.n_kernels == 0:
                summary.add(op.name, "no GPU kernel launched by the op", dims=op.dims_text)
                continue
            time_us, timing = op.kernel_us, TIMING_GPU
            gpu = device or names.get(op_devices.get(i), first_name)
        else:
            time_us, timing = op.end - op.ts, TIMING_CPU
            gpu = device or HOST_DEVICE
        time_ms = time_us / US_PER_MS
        if not time_ms > 0:  # checked in ms: a subnormal microsecond count underflows to 0 ms
            summary.add(op.name, "non-positive time", dims=op.dims_text)
            continue
        row = dict(op.row)
        row["backward"] = bool(row.get("backward", False) or op.backward)
        rows.append({**row, "gpu": gpu, "timing": timing, "time_ms": time_ms, "aten_op": op.name})
    return rows


def _summarise_unmapped(ops: list[_Op], gpu_trace: bool, summary: OccurrenceSummary) -> None:
    """Count ATen calls outside every record, with their own (exclusive) time."""
    for op in ops:
        if op.owner is not None or not op.name.startswith("aten::") or is_mapped_aten_op(op.name):
            continue
        self_us = op.kernel_us if gpu_trace else max(op.end - op.ts - op.children_us, 0.0)
        summary.add(op.name, NO_EQUIVALENT_REASON, self_us / US_PER_MS)
