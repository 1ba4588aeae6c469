"""Per-op feature table for the learned op-time models.

:func:`featurize_ops` turns op-table rows (DESIGN.md, "Interfaces") into the analytic
quantities the learned models correct and the features they learn from. The analytic
part comes first (FLOPs, bytes, roofline time at the dtype's peak, waves of output tiles
over the GPU's SMs); the learned part models ``log(t / (launch + roofline))`` on top.

Features are relative to the GPU wherever possible (waves, intensity over the ridge
point, bytes over L2), so a tree fitted on some GPUs transfers to a GPU it has not seen.
The GEMM set carries no absolute time or absolute GPU figure; the vector set carries a few
GPU descriptors.

Columns (``FEATURE_SPEC.columns[op_class]`` is each class's ordered list):

* every class: ``l_flops``/``l_bytes`` are natural logs of FLOPs and bytes (floored at
  1), ``l_ai_over_ridge = log((flops/bytes) / (peak/bandwidth))`` with the row's peak,
  ``l_bytes_over_l2 = log(bytes / L2 bytes)``, ``elem_bytes`` the dtype's element size,
  ``is_amd`` 1 for AMD parts;
* ``gemm``: ``l_b, l_m, l_n, l_k`` (logs of the dims), ``l_mn = log(b*m*n)``,
  ``is_linear``, ``align_mn``/``align_k`` (0, 1 or 2: the dims are multiples of 4, and of
  8), and for square output tiles of T in 64/128/256: ``l_wavesT = log(tiles/SMs)``,
  ``wave_effT = waves/ceil(waves)`` and ``tile_effT`` (useful fraction of the padded tiles);
* ``vector``: ``op_code`` (:data:`VECTOR_OP_CODES`), ``is_reduce``, ``is_scalar``,
  ``is_binary``, ``is_backward``, ``l_rows, l_cols, l_elems``, ``align4`` (cols % 4 == 0),
  ``l_rows_per_sm``, ``row_wave_eff`` (rows over SMs, fraction of the last wave used),
  ``l_blocks_per_sm`` (1024-element blocks per SM) and the descriptors ``peak_per_w``
  (TFLOP/s per W), ``bw_per_w`` (GB/s per W), ``l2_cache_mib``, ``sm_count``, ``ridge``
  (FLOP/byte). ``embedding`` and ``optimizer`` rows are vector-like (rows x cols);
* ``attention``: ``l_b, l_heads, l_gqa`` (log heads/kv_heads), ``l_seq_q, l_seq_kv,
  l_head_dim``, ``is_causal``, ``is_backward``, and waves / wave and tile efficiency of
  the ``batch*heads*ceil(seq_q/T)`` query blocks for T in 64/128;
* ``collective``: ``coll_code``, ``l_msg_bytes``, ``l_n_ranks``, ``l_ranks_per_node``,
  ``multi_node``: descriptive only (their base time comes from
  :mod:`perfcast.features.collectives`; ``roofline_ms`` is NaN there).

Timing feature (outside ``FEATURE_SPEC`` version 3): a timing-aware op model appends
:data:`TIMING_FEATURE` to each class's columns, from :func:`timing_feature` of the rows'
timing methods (:class:`perfcast.data.schema.OpTiming`), and records that it does.

A row holds values exactly in its class's columns (NaN elsewhere). Where the catalog lacks
a descriptor (no SM count or L2 size for B200), the nearest same-vendor entry's figure
stands in (:func:`perfcast.features.hardware.descriptor_figures`); NaN only where no
entry of the vendor has one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
import pandas as pd

from perfcast.data.schema import DType, OpTiming, OpType
from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features.hardware import HardwareSpec, descriptor_figures
from perfcast.features.ops import (
    BINARY_OPS,
    OpClass,
    flag_column,
    op_classes,
    op_flops,
    op_memory_bytes,
    vector_elements,
)
from perfcast.features.roofline import MS_PER_S, roofline_s

__all__ = [
    "FEATURE_SPEC",
    "FEATURE_SPEC_VERSION",
    "TIMING_FEATURE",
    "FeatureSpec",
    "featurize_ops",
    "timing_feature",
]

FEATURE_SPEC_VERSION = 3
# 2: missing descriptors imputed from a same-vendor peer, not NaN; 3: AMD fp32 GEMMs at the matrix rate

GEMM_TILES = (64, 128, 256)
ATTENTION_TILES = (64, 128)
VECTOR_BLOCK_ELEMENTS = 1024  # 256 threads x 4 elements: PyTorch's vectorised element-wise kernel

# Stable integer codes (part of FeatureSpec version 1: never renumber, only append).
VECTOR_OP_CODES: Mapping[str, int] = MappingProxyType(
    {
        OpType.ADD.value: 0,
        OpType.MUL.value: 1,
        OpType.DIV.value: 2,
        OpType.POW.value: 3,
        OpType.RELU.value: 4,
        OpType.GELU.value: 5,
        OpType.SILU.value: 6,
        OpType.TANH.value: 7,
        OpType.SOFTMAX.value: 8,
        OpType.LAYERNORM.value: 9,
        OpType.RMSNORM.value: 10,
        OpType.EMBEDDING.value: 11,
        OpType.OPTIMIZER.value: 12,
        OpType.SWIGLU.value: 13,
    }
)
COLLECTIVE_OP_CODES: Mapping[str, int] = MappingProxyType(
    {
        OpType.ALLREDUCE.value: 0,
        OpType.ALLGATHER.value: 1,
        OpType.REDUCESCATTER.value: 2,
        OpType.ALLTOALL.value: 3,
        OpType.SENDRECV.value: 4,
    }
)
_REDUCE_OPS = frozenset({OpType.SOFTMAX.value, OpType.LAYERNORM.value, OpType.RMSNORM.value})

_COMMON = ("l_ai_over_ridge", "l_bytes_over_l2")
_GEMM = (
    *_COMMON,
    "l_b",
    "l_m",
    "l_n",
    "l_k",
    "is_linear",
    "align_mn",
    "align_k",
    "l_mn",
    *(f"{p}{t}" for t in GEMM_TILES for p in ("l_waves", "wave_eff", "tile_eff")),
    "is_amd",
    "elem_bytes",
)
_VECTOR = (
    "l_flops",
    "l_bytes",
    *_COMMON,
    "op_code",
    "is_reduce",
    "is_scalar",
    "is_binary",
    "is_backward",
    "l_rows",
    "l_cols",
    "l_elems",
    "align4",
    "l_rows_per_sm",
    "row_wave_eff",
    "l_blocks_per_sm",
    "is_amd",
    "peak_per_w",
    "bw_per_w",
    "l2_cache_mib",
    "sm_count",
    "ridge",
    "elem_bytes",
)
_ATTENTION = (
    "l_flops",
    "l_bytes",
    *_COMMON,
    "l_b",
    "l_heads",
    "l_gqa",
    "l_seq_q",
    "l_seq_kv",
    "l_head_dim",
    "is_causal",
    "is_backward",
    *(f"{p}{t}" for t in ATTENTION_TILES for p in ("l_waves", "wave_eff", "tile_eff")),
    "is_amd",
    "elem_bytes",
)
_COLLECTIVE = ("coll_code", "l_msg_bytes", "l_n_ranks", "l_ranks_per_node", "multi_node", "is_amd")

TIMING_FEATURE = "timed_with_launch"
"""1 where a row's time includes the host launch of its call (``OpTiming.includes_launch``), else 0."""

META_COLUMNS = ("op_class", "gpu_id", "vendor", "roofline_ms", "issue_ms", "flops", "mem_bytes")
"""Columns :func:`featurize_ops` returns before the feature columns."""

GATHER_CYCLES_PER_ELEMENT = 2.0
"""SM cycles an embedding forward spends per output element, the ``issue_ms`` of its rows.

PyTorch's embedding forward (``index_select``) computes a source and a destination offset
for every element with 64-bit index arithmetic, so it is bound by instruction issue, not
bandwidth, on every GPU with measured lookups; the per-GPU readings behind the value are in
``benchmarks/results/op_issue_rate.md`` (``benchmarks/op_issue_rate.py``)."""


@dataclass(frozen=True)
class FeatureSpec:
    """Names and order of the feature columns of each op class.

    ``columns`` maps an :class:`~perfcast.features.ops.OpClass` value to its ordered
    feature names. Models select columns by these names, never by position; a model saved
    under one ``version`` refuses to load under another.
    """

    version: int
    columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def all_columns(self) -> tuple[str, ...]:
        """Every feature column of every class, first appearance order, no duplicates."""
        return tuple(dict.fromkeys(c for cols in self.columns.values() for c in cols))


FEATURE_SPEC = FeatureSpec(
    version=FEATURE_SPEC_VERSION,
    columns=MappingProxyType(
        {
            OpClass.GEMM.value: _GEMM,
            OpClass.ATTENTION.value: _ATTENTION,
            OpClass.VECTOR.value: _VECTOR,
            OpClass.COLLECTIVE.value: _COLLECTIVE,
        }
    ),
)


def timing_feature(timing: np.ndarray) -> np.ndarray:
    """:data:`TIMING_FEATURE` of rows with timing methods ``timing`` (``OpTiming`` values), floats, shape ``(n,)``.

    Raises:
        SpecError: a value that is not a known timing.
    """
    codes, values = pd.factorize(np.asarray(timing, dtype=object))
    launch = np.array([float(OpTiming.parse(v).includes_launch) for v in values])
    return launch[codes] if len(codes) else np.empty(0)


# --------------------------------------------------------------------------- helpers


def _rows_hint(index: pd.Index, limit: int = 5) -> str:
    shown = ", ".join(map(str, list(index[:limit])))
    more = f" and {len(index) - limit} more" if len(index) > limit else ""
    return f"row{'s' if len(index) > 1 else ''} {shown}{more}"


def _num(ops: pd.DataFrame, name: str, default: float = np.nan) -> np.ndarray:
    if name not in ops:
        return np.full(len(ops), default, dtype=float)
    return pd.to_numeric(ops[name], errors="coerce").to_numpy(dtype=float)


def _flag(ops: pd.DataFrame, name: str) -> np.ndarray:
    """:func:`~perfcast.features.ops.flag_column` as floats (1.0 / 0.0)."""
    return flag_column(ops, name).astype(float)


def _log(x: np.ndarray, floor: float = 1.0) -> np.ndarray:
    """Natural log with a floor (counts below 1 and zero FLOPs map to log(floor))."""
    with np.errstate(invalid="ignore"):
        return np.log(np.maximum(x, floor))


def _waves(units: np.ndarray, sms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``log(units / SMs)`` and the fraction of the last wave that is busy."""
    with np.errstate(invalid="ignore", divide="ignore"):
        waves = units / sms
        eff = waves / np.ceil(waves)
    return _log(waves, 1e-9), eff


def _align(*dims: np.ndarray) -> np.ndarray:
    """0, 1 (all multiples of 4) or 2 (all multiples of 8)."""
    four = np.all([np.mod(d, 4) == 0 for d in dims], axis=0)
    eight = np.all([np.mod(d, 8) == 0 for d in dims], axis=0)
    return four.astype(float) + eight.astype(float)


def _parse_ops(ops: pd.DataFrame) -> np.ndarray:
    """Canonical op names; SpecError naming the rows of an unknown op."""
    if "op" not in ops:
        raise SpecError("ops table has no 'op' column")
    raw = ops["op"]
    names: dict[object, str] = {}
    bad: list[object] = []
    for value in pd.unique(raw):
        try:
            names[value] = OpType(str(value).strip().lower()).value
        except ValueError:
            bad.append(value)
    if bad:
        rows = ops.index[raw.isin(bad).to_numpy()]
        allowed = ", ".join(o.value for o in OpType)
        raise SpecError(f"op={bad[0]!r} ({_rows_hint(rows)}) is not a known op; allowed: {allowed}")
    return raw.map(names).to_numpy(dtype=object).astype(str)


# ----------------------------------------------------------------------- featurizer


def featurize_ops(ops: pd.DataFrame) -> pd.DataFrame:
    """Analytic quantities and learned-model features of each op-table row.

    Args:
        ops: op-table rows: ``op``, ``gpu`` (catalog id, alias or device name), ``dtype``
            (default bf16) and the shape columns of each op.

    Returns:
        A frame with ``ops``' index: :data:`META_COLUMNS` (``op_class``, ``gpu_id``,
        ``vendor``, ``roofline_ms`` at the row dtype's peak, ``issue_ms`` the time to issue
        an embedding forward's per-element work over the GPU's SMs at its boost clock,
        :data:`GATHER_CYCLES_PER_ELEMENT` per element, 0 for other rows and where the SM
        count or clock is unknown, ``flops``, ``mem_bytes``) then
        ``FEATURE_SPEC.all_columns`` (NaN where a column does not apply to the row).

    Raises:
        SpecError: unknown op, dtype or GPU (naming the rows), or a GPU whose catalog
            entry lacks the peak the row needs.
    """
    if not isinstance(ops, pd.DataFrame):
        raise SpecError(f"ops must be a pandas DataFrame, got {type(ops).__name__}")
    if "gpu" not in ops:
        raise SpecError("ops table has no 'gpu' column")
    n = len(ops)
    kinds = _parse_ops(ops)
    classes = op_classes(kinds) if n else kinds
    dtypes = (ops["dtype"] if "dtype" in ops else pd.Series(DType.BF16.value, index=ops.index)).astype(str)
    canonical: dict[str, DType] = {}
    for value in pd.unique(dtypes):
        try:
            canonical[value] = DType.parse(value)
        except SpecError as exc:
            raise SpecError(f"{exc} ({_rows_hint(ops.index[(dtypes == value).to_numpy()])})") from None
    dtype_names = dtypes.map({k: v.value for k, v in canonical.items()}).to_numpy(dtype=object).astype(str)
    frame = ops.assign(op=kinds, dtype=dtype_names)
    for name in ("scalar", "causal", "backward"):  # nullable booleans (pd.NA) as plain bools for ops.py
        if name in frame:
            frame[name] = flag_column(frame, name)

    flops = op_flops(frame)
    mem = op_memory_bytes(frame)
    elem_bytes = dtypes.map({k: float(v.bytes_per_element) for k, v in canonical.items()}).to_numpy(dtype=float)

    # Per-GPU figures, broadcast to rows; each distinct gpu name is resolved once.
    gpu_id = np.empty(n, dtype=object)
    vendor = np.empty(n, dtype=object)
    hw_cols = {k: np.full(n, np.nan) for k in ("sm", "l2", "bw", "tdp", "fp32", "amd", "peak", "clock")}
    roof_s = np.full(n, np.nan)
    is_tensor = np.isin(classes, [OpClass.GEMM.value, OpClass.ATTENTION.value])
    gpu_values = ops["gpu"].to_numpy(dtype=object)
    for name in pd.unique(gpu_values):
        rows = np.flatnonzero(gpu_values == name)
        try:
            hw = HardwareSpec.from_name(name)
        except UnknownEntryError as exc:
            raise UnknownEntryError(f"{exc} ({_rows_hint(ops.index[rows])})") from None
        except SpecError as exc:
            raise SpecError(f"{exc} ({_rows_hint(ops.index[rows])})") from None
        gpu_id[rows] = hw.id
        vendor[rows] = hw.vendor
        figures = descriptor_figures(hw)
        hw_cols["sm"][rows] = figures["sm_count"]
        hw_cols["l2"][rows] = figures["l2_cache_mib"]
        hw_cols["bw"][rows] = hw.mem_bw_gbps
        hw_cols["tdp"][rows] = figures["tdp_w"]
        hw_cols["fp32"][rows] = figures["peak_fp32_tflops"]
        hw_cols["clock"][rows] = figures["boost_clock_mhz"]
        hw_cols["amd"][rows] = float(hw.vendor.upper() == "AMD")
        compute = rows[classes[rows] != OpClass.COLLECTIVE.value]
        if len(compute) == 0:
            continue
        try:
            for dt in pd.unique(dtype_names[compute]):
                sel = compute[dtype_names[compute] == dt]
                tensor = sel[is_tensor[sel]]
                if len(tensor):
                    hw_cols["peak"][tensor] = hw.peak_tflops(dt)
                vec = sel[~is_tensor[sel]]
                hw_cols["peak"][vec] = hw.vector_tflops(dt) if len(vec) else np.nan
            roof_s[compute] = roofline_s(flops[compute], mem[compute], hw_cols["peak"][compute] * 1e12, hw.mem_bw_gbps)
        except SpecError as exc:
            raise SpecError(f"{exc} ({_rows_hint(ops.index[compute])})") from None

    sms, l2_bytes, bw = hw_cols["sm"], hw_cols["l2"] * 2**20, hw_cols["bw"]
    with np.errstate(invalid="ignore", divide="ignore"):
        ridge = hw_cols["peak"] * 1e12 / (bw * 1e9)
        intensity = np.maximum(flops, 1e-3) / np.maximum(mem, 1.0)
        l_ai_over_ridge = np.log(intensity / ridge)
        l_bytes_over_l2 = np.log(np.maximum(mem, 1.0) / l2_bytes)

    out: dict[str, np.ndarray] = {
        "op_class": classes,
        "gpu_id": gpu_id,
        "vendor": vendor,
        "roofline_ms": roof_s * MS_PER_S,
        "issue_ms": _gather_issue_ms(frame, kinds, hw_cols),
        "flops": flops,
        "mem_bytes": mem,
    }
    feats = {c: np.full(n, np.nan) for c in FEATURE_SPEC.all_columns}
    compute_rows = classes != OpClass.COLLECTIVE.value
    for name, values in (
        ("l_flops", _log(flops)),
        ("l_bytes", _log(mem)),
        ("l_ai_over_ridge", l_ai_over_ridge),
        ("l_bytes_over_l2", l_bytes_over_l2),
        ("elem_bytes", elem_bytes),
    ):
        feats[name] = np.where(compute_rows, values, np.nan)
    feats["is_amd"] = hw_cols["amd"]

    _gemm_features(feats, frame, kinds, classes == OpClass.GEMM.value, sms)
    _vector_features(feats, frame, kinds, classes == OpClass.VECTOR.value, hw_cols, ridge)
    _attention_features(feats, frame, classes == OpClass.ATTENTION.value, sms)
    _collective_features(feats, frame, kinds, classes == OpClass.COLLECTIVE.value)

    for cls, own in FEATURE_SPEC.columns.items():  # a row carries exactly its class's columns
        rows_of_cls = classes == cls
        if rows_of_cls.any():
            for col in set(FEATURE_SPEC.all_columns) - set(own):
                feats[col] = np.where(rows_of_cls, np.nan, feats[col])
    result = pd.DataFrame(out, index=ops.index)
    return pd.concat([result, pd.DataFrame(feats, index=ops.index)], axis=1)


def _gather_issue_ms(ops: pd.DataFrame, kinds: np.ndarray, hw_cols: Mapping[str, np.ndarray]) -> np.ndarray:
    """``issue_ms`` of each row (:func:`featurize_ops`): embedding forwards only, else 0."""
    gather = (kinds == OpType.EMBEDDING.value) & (_flag(ops, "backward") == 0)
    out = np.zeros(len(kinds))
    if gather.any():
        cycles_per_ms = hw_cols["sm"] * hw_cols["clock"] * 1e6 / MS_PER_S
        with np.errstate(invalid="ignore"):
            issue = vector_elements(ops) * GATHER_CYCLES_PER_ELEMENT / cycles_per_ms
        out[gather] = np.nan_to_num(issue[gather], nan=0.0)
    return out


def _gemm_features(feats: dict[str, np.ndarray], ops: pd.DataFrame, kinds: np.ndarray, sel: np.ndarray, sms) -> None:
    if not sel.any():
        return
    b, m, n, k = (_num(ops, c, 1.0 if c == "batch" else np.nan) for c in ("batch", "m", "n", "k"))
    b = np.where(np.isnan(b), 1.0, b)
    put = {
        "l_b": _log(b),
        "l_m": _log(m),
        "l_n": _log(n),
        "l_k": _log(k),
        "l_mn": _log(b * m * n),
        "is_linear": (kinds == OpType.LINEAR.value).astype(float),
        "align_mn": _align(m, n),
        "align_k": _align(k),
    }
    for t in GEMM_TILES:
        tm, tn = np.ceil(m / t), np.ceil(n / t)
        put[f"l_waves{t}"], put[f"wave_eff{t}"] = _waves(b * tm * tn, sms)
        with np.errstate(invalid="ignore", divide="ignore"):  # non-GEMM rows (m = n = 0) are masked below
            put[f"tile_eff{t}"] = (m * n) / (tm * tn * t * t)
    for name, values in put.items():
        feats[name] = np.where(sel, values, feats[name])


def _vector_features(feats, ops, kinds, sel, hw_cols, ridge) -> None:
    if not sel.any():
        return
    rows = _num(ops, "rows", 1.0)
    rows = np.where(np.isnan(rows), 1.0, rows)
    cols = _num(ops, "cols")
    elems = rows * cols
    sms = hw_cols["sm"]
    per_sm, wave_eff = _waves(rows, sms)
    with np.errstate(invalid="ignore", divide="ignore"):
        blocks_per_sm = np.ceil(elems / VECTOR_BLOCK_ELEMENTS) / sms
        peak_per_w = hw_cols["fp32"] / hw_cols["tdp"]
        bw_per_w = hw_cols["bw"] / hw_cols["tdp"]
    put = {
        "op_code": np.array([VECTOR_OP_CODES.get(k, -1) for k in kinds], dtype=float),
        "is_reduce": np.isin(kinds, list(_REDUCE_OPS)).astype(float),
        "is_scalar": _flag(ops, "scalar"),
        "is_binary": (np.isin(kinds, [o.value for o in BINARY_OPS]) & (_flag(ops, "scalar") == 0)).astype(float),
        "is_backward": _flag(ops, "backward"),
        "l_rows": _log(rows),
        "l_cols": _log(cols),
        "l_elems": _log(elems),
        "align4": (np.mod(cols, 4) == 0).astype(float),
        "l_rows_per_sm": per_sm,
        "row_wave_eff": wave_eff,
        "l_blocks_per_sm": _log(blocks_per_sm, 1e-9),
        "peak_per_w": peak_per_w,
        "bw_per_w": bw_per_w,
        "l2_cache_mib": hw_cols["l2"],
        "sm_count": sms,
        "ridge": ridge,
    }
    for name, values in put.items():
        feats[name] = np.where(sel, values, feats[name])


def _attention_features(feats, ops, sel, sms) -> None:
    if not sel.any():
        return
    b = _num(ops, "batch", 1.0)
    b = np.where(np.isnan(b), 1.0, b)
    heads, kv = _num(ops, "heads"), _num(ops, "kv_heads")
    kv = np.where(np.isnan(kv) | (kv <= 0), heads, kv)
    sq, skv, d = _num(ops, "seq_q"), _num(ops, "seq_kv"), _num(ops, "head_dim")
    with np.errstate(invalid="ignore", divide="ignore"):  # rows of other classes (zero shapes) are discarded
        put = {
            "l_b": _log(b),
            "l_heads": _log(heads),
            "l_gqa": _log(heads / kv),
            "l_seq_q": _log(sq),
            "l_seq_kv": _log(skv),
            "l_head_dim": _log(d),
            "is_causal": _flag(ops, "causal"),
            "is_backward": _flag(ops, "backward"),
        }
        for t in ATTENTION_TILES:
            blocks = np.ceil(sq / t)
            put[f"l_waves{t}"], put[f"wave_eff{t}"] = _waves(b * heads * blocks, sms)
            put[f"tile_eff{t}"] = sq / (blocks * t)
    for name, values in put.items():
        feats[name] = np.where(sel, values, feats[name])


def _collective_features(feats, ops, kinds, sel) -> None:
    if not sel.any():
        return
    n_ranks = _num(ops, "n_ranks")
    per_node = _num(ops, "ranks_per_node")
    per_node = np.where(np.isnan(per_node), n_ranks, per_node)
    put = {
        "coll_code": np.array([COLLECTIVE_OP_CODES.get(k, -1) for k in kinds], dtype=float),
        "l_msg_bytes": _log(_num(ops, "bytes")),
        "l_n_ranks": _log(n_ranks),
        "l_ranks_per_node": _log(per_node),
        "multi_node": (n_ranks > per_node).astype(float),
    }
    for name, values in put.items():
        feats[name] = np.where(sel, values, feats[name])
