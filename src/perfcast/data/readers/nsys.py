"""Reader of Nsight Systems SQLite exports of PyTorch runs into op records.

Source: ``nsys export --type sqlite`` of a profile taken with
``torch.autograd.profiler.emit_nvtx(record_shapes=True)``, which wraps every ATen call and
autograd node in an NVTX push/pop range named like::

    aten::mm, seq = 12, op_id = 3, sizes = [[4096, 4096], [4096, 4096]], input_op_ids = [...]

Tables and columns read (nothing else is needed):

* ``CUPTI_ACTIVITY_KIND_KERNEL``: ``start, end`` (ns), ``correlationId`` and, when present,
  ``deviceId`` (to pick the device's name). Kernel names are not needed.
* ``CUPTI_ACTIVITY_KIND_RUNTIME``: ``start, globalTid, correlationId`` (the launch call).
* ``NVTX_EVENTS``: ``start, end, globalTid``, ``text`` or ``textId`` (-> ``StringIds``), and
  ``eventType`` when present (push/pop 59 and start/end 60 ranges are used).
* ``TARGET_INFO_GPU`` (``id, name``) or ``TARGET_INFO_CUDA_DEVICE`` (``name`` and ``cudaId``
  or ``id``) for the device name, kept as printed.

Rules (shared with :mod:`perfcast.data.readers.torch_trace`, mapping in
:mod:`perfcast.data.readers.aten`):

* Each kernel is attributed to the innermost NVTX range, on the thread that made its
  runtime launch call (same ``correlationId``), whose span contains the launch's start.
  Correlation ids are assumed unique within the export (one profiled process).
* In each thread's range tree the outermost range whose ATen call maps becomes the record
  (mapped ranges inside it are skipped); its time is the sum of the durations of the
  kernels attributed to it or to any range inside it, ns -> ms (``timing =
  "gpu_kernels"``).
* ``backward`` is True inside a range whose name contains ``Backward`` (the autograd
  nodes) and for ATen backward kernels.
* NVTX ranges carry no dtype and no scalar arguments: ``dtype`` is the required keyword
  argument (it is the run's compute dtype; there is deliberately no default, since
  guessing bf16 for an fp32 run would mislabel every record), ``causal`` is False, softmax
  is over the last dimension, and norms normalise the last dimension.
* Repeats are aggregated as in the trace reader (median, min, max, ``n_repeats``), and
  ``rejected`` is the same per (name, reason) summary with ``count``.
"""

from __future__ import annotations

import bisect
import json
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from perfcast.data.readers.aten import (
    NO_EQUIVALENT_REASON,
    AtenCall,
    AtenShapeError,
    OccurrenceSummary,
    aggregate_occurrences,
    is_backward_name,
    is_mapped_aten_op,
    map_aten_op,
    parse_dims,
)
from perfcast.data.records import ReadResult
from perfcast.data.schema import DType, OpTiming
from perfcast.errors import DatasetError

logger = logging.getLogger(__name__)

SOURCE_NAME = "nsys"
"""Prefix of the ``source`` provenance column (followed by the export's file name)."""

TIMING = OpTiming.GPU_KERNELS.value
NS_PER_MS = 1e6
"""Nsight Systems timestamps are nanoseconds."""

UNLINKED_KERNELS = "(unlinked GPU kernels)"
NVTX_RANGE_TYPES = (59, 60)
"""``NVTX_EVENTS.eventType`` of push/pop and start/end ranges."""

REQUIRED_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


@dataclass
class _Range:
    name: str
    text: str
    tid: int
    start: int
    end: int
    parent: int | None = None
    owner: int | None = None
    backward: bool = False
    row: dict | None = None
    kernel_ns: int = 0
    n_kernels: int = 0
    device: object = None
    dims_text: str = ""


def read_nsys_sqlite(path: str | Path, *, dtype: str, device: str | None = None) -> ReadResult:
    """Read an Nsight Systems SQLite export of an ``emit_nvtx(record_shapes=True)`` run.

    Args:
        path: the ``.sqlite`` file ``nsys export --type sqlite`` wrote.
        dtype: the compute dtype of the profiled ops (``fp32``, ``bf16``, ``fp16`` ... or a
            torch spelling); NVTX ranges do not record it.
        device: device name for the ``gpu`` column; default: the export's GPU name.

    Returns:
        ``records`` with :data:`~perfcast.data.readers.aten.RECORD_COLUMNS`; ``rejected``,
        the per (name, reason) summary of ranges and kernels not in any record.

    Raises:
        DatasetError: the file is missing or not SQLite, lacks a required table or column
            (named), has no NVTX range with sizes, or has no device name and no ``device``.
        SpecError: ``dtype`` is not a known dtype.
    """
    path = Path(path)
    dtype_value = DType.parse(dtype).value
    if not path.is_file():
        raise DatasetError(f"no such file: {path}")
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise DatasetError(f"cannot open nsys export {path}: {exc}") from exc
    try:
        ranges, kernels, runtimes, names = _load(con, path)
    except sqlite3.Error as exc:
        raise DatasetError(f"cannot read nsys export {path}: {exc}") from exc
    finally:
        con.close()
    if not any(", sizes = " in r.text for r in ranges):
        raise DatasetError(f"{path}: no NVTX range has input sizes; profile with emit_nvtx(record_shapes=True)")
    if device is None and not names:
        raise DatasetError(f"{path}: no GPU name in TARGET_INFO_GPU/TARGET_INFO_CUDA_DEVICE; pass device=")
    summary = OccurrenceSummary()
    _nest_and_map(ranges, summary)
    _attribute(ranges, kernels, runtimes, summary)
    rows = []
    first_name = next(iter(names.values()), None)
    for i, r in enumerate(ranges):
        if r.owner == i and r.row is not None:
            if r.n_kernels == 0:
                summary.add(r.name, "no GPU kernel launched by the op", dims=r.dims_text)
                continue
            row = {**r.row, "dtype": dtype_value, "backward": bool(r.row.get("backward", False) or r.backward)}
            gpu = device or names.get(r.device, first_name)
            rows.append({**row, "gpu": gpu, "timing": TIMING, "time_ms": r.kernel_ns / NS_PER_MS, "aten_op": r.name})
        elif r.owner is None and r.name.startswith("aten::") and not is_mapped_aten_op(r.name):
            summary.add(r.name, NO_EQUIVALENT_REASON, r.kernel_ns / NS_PER_MS)
    records = aggregate_occurrences(rows, source=f"{SOURCE_NAME}:{path.name}")
    logger.info("%s: %d op records from %d occurrences", path, len(records), len(rows))
    return ReadResult(records=records, rejected=summary.frame())


# --------------------------------------------------------------------------- SQLite


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}


def _load(con: sqlite3.Connection, path: Path) -> tuple[list[_Range], list[tuple], dict, dict]:
    tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    missing = [t for t in REQUIRED_TABLES if t not in tables]
    if missing:
        raise DatasetError(f"{path}: not an nsys SQLite export of a CUDA run: missing table(s) {', '.join(missing)}")
    _need(con, path, "CUPTI_ACTIVITY_KIND_KERNEL", ("start", "end", "correlationId"))
    _need(con, path, "CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "globalTid", "correlationId"))
    nvtx_cols = _need(con, path, "NVTX_EVENTS", ("start", "end", "globalTid"))
    has_strings = "StringIds" in tables
    if "text" in nvtx_cols and "textId" in nvtx_cols and has_strings:
        text = "COALESCE(n.text, s.value)"
        join = "LEFT JOIN StringIds s ON n.textId = s.id"
    elif "text" in nvtx_cols:
        text, join = "n.text", ""
    elif "textId" in nvtx_cols and has_strings:
        text, join = "s.value", "LEFT JOIN StringIds s ON n.textId = s.id"
    else:
        raise DatasetError(f"{path}: NVTX_EVENTS has neither text nor textId (with StringIds)")
    where = "n.end IS NOT NULL AND n.end >= n.start"
    if "eventType" in nvtx_cols:
        where += f" AND n.eventType IN {NVTX_RANGE_TYPES}"
    ranges = []
    for start, end, tid, txt in con.execute(
        f"SELECT n.start, n.end, n.globalTid, {text} FROM NVTX_EVENTS n {join} WHERE {where}"
    ):
        if isinstance(txt, str) and _is_int(start) and _is_int(end) and _is_int(tid):
            ranges.append(_Range(name=txt.split(",", 1)[0].strip(), text=txt, tid=tid, start=start, end=end))
    kcols = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    device_col = "k.deviceId" if "deviceId" in kcols else "NULL"
    kernels = [
        row
        for row in con.execute(
            f"SELECT k.start, k.end, k.correlationId, {device_col} FROM CUPTI_ACTIVITY_KIND_KERNEL k"
        )
        if _is_int(row[0]) and _is_int(row[1]) and row[1] >= row[0]
    ]
    runtimes = {
        corr: (tid, start)
        for start, tid, corr in con.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME")
        if _is_int(start) and _is_int(tid) and corr is not None
    }
    return ranges, kernels, runtimes, _device_names(con, tables)


def _need(con: sqlite3.Connection, path: Path, table: str, columns: tuple[str, ...]) -> set[str]:
    have = _columns(con, table)
    missing = [c for c in columns if c not in have]
    if missing:
        raise DatasetError(f"{path}: table {table} lacks column(s) {', '.join(missing)}")
    return have


def _device_names(con: sqlite3.Connection, tables: set[str]) -> dict[object, str]:
    """{device id: name} from TARGET_INFO_GPU or TARGET_INFO_CUDA_DEVICE (empty when absent)."""
    for table in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_DEVICE"):
        if table not in tables:
            continue
        cols = _columns(con, table)
        id_col = next((c for c in ("cudaId", "id", "deviceId", "gpuId") if c in cols), None)
        if "name" not in cols:
            continue
        query = f"SELECT {id_col or 'NULL'}, name FROM {table}"
        names = {}
        for i, (dev, name) in enumerate(con.execute(query)):
            if isinstance(name, str) and name.strip():
                names.setdefault(dev if dev is not None else i, name.strip())
        if names:
            return names
    return {}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --------------------------------------------------------------------------- ranges and kernels


def _sizes(text: str) -> tuple | None:
    """The ``sizes = [[...], ...]`` list of an emit_nvtx range name, or None."""
    at = text.find("sizes = [")
    if at < 0:
        return None
    begin = at + len("sizes = ")
    depth = 0
    for j in range(begin, len(text)):
        depth += {"[": 1, "]": -1}.get(text[j], 0)
        if depth == 0:
            try:
                return parse_dims(json.loads(text[begin : j + 1]))
            except (ValueError, RecursionError):
                return None
    return None


def _nest_and_map(ranges: list[_Range], summary: OccurrenceSummary) -> None:
    """Sort ranges per thread, set parents, mark backward and map each tree's outermost op."""
    ranges.sort(key=lambda r: (r.tid, r.start, -r.end))
    stack: list[int] = []
    tid = None
    for i, r in enumerate(ranges):
        if r.tid != tid:
            stack, tid = [], r.tid
        while stack and ranges[stack[-1]].end <= r.start:
            stack.pop()
        parent = ranges[stack[-1]] if stack else None
        r.parent = stack[-1] if stack else None
        stack.append(i)
        r.backward = (parent.backward if parent else False) or is_backward_name(r.name)
        if parent is not None and parent.owner is not None:
            r.owner = parent.owner
            continue
        if not is_mapped_aten_op(r.name):
            continue
        dims = _sizes(r.text)
        r.dims_text = "" if dims is None else str([list(d) for d in dims])[:200]
        try:
            if dims is None:
                raise AtenShapeError("no readable 'sizes = [...]' in the NVTX range")
            row = map_aten_op(AtenCall(r.name, dims))
        except AtenShapeError as exc:
            summary.add(r.name, str(exc), dims=r.dims_text)
            continue
        if row is not None:
            r.row, r.owner = row, i


def _attribute(ranges: list[_Range], kernels: list[tuple], runtimes: dict, summary: OccurrenceSummary) -> None:
    """Add each kernel's duration to the innermost range around its launch, and to that range's owner."""
    by_tid: dict[int, tuple[int, list[int]]] = {}
    for i, r in enumerate(ranges):
        by_tid.setdefault(r.tid, (i, []))[1].append(r.start)
    for start, end, corr, dev in kernels:
        launch = runtimes.get(corr)
        idx = None
        if launch is not None and launch[0] in by_tid:
            offset, starts = by_tid[launch[0]]
            j = bisect.bisect_right(starts, launch[1]) - 1
            idx = offset + j if j >= 0 else None
            while idx is not None and not (ranges[idx].start <= launch[1] <= ranges[idx].end):
                idx = ranges[idx].parent
        if idx is None:
            summary.add(UNLINKED_KERNELS, "kernel not launched inside any NVTX range", (end - start) / NS_PER_MS)
            continue
        target = ranges[idx]
        target.kernel_ns += end - start
        target.n_kernels += 1
        owner = target.owner
        if owner is not None:
            if owner != idx:
                ranges[owner].kernel_ns += end - start
                ranges[owner].n_kernels += 1
            if ranges[owner].device is None:
                ranges[owner].device = dev
