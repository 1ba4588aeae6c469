"""Readers of NeuSight's measured kernel, per-operator and end-to-end latencies.

Source: repo ``sitar-lab/NeuSight`` at commit ``6945927d`` (the data of the ASPLOS'25
NeuSight paper), extracted into ``../shared/data`` (README section 1):

* ``neusight_kernels_gemm.csv.gz``: single fp32 ``torch.bmm`` / ``nn.Linear`` calls
  (:func:`read_neusight_gemm`);
* ``neusight_kernels_vector.csv.gz``: single fp32 element-wise, softmax and LayerNorm
  calls on a ``[rows_B, cols_H]`` tensor (:func:`read_neusight_vector`);
* ``neusight_model_op_latency.csv.gz``: every torch.fx node of 1-layer HuggingFace
  transformers, timed on its own forward and backward (:func:`read_neusight_model_ops`);
* ``neusight_e2e_latency.csv``: whole-model forward (inference) or forward + backward
  (training) latency (:func:`read_neusight_e2e`).

**Time statistic.** Kernels and fx nodes: one op run 25 times, timed with CUDA events,
``measured_ms`` is the **mean of the 5 fastest runs**, in ms, unchanged (no unit
conversion). It is host-launched single-op timing, so small ops include the launch
overhead (about 0.01-0.03 ms). ``n_repeats`` = 25 records the number of runs. Whole
models on one GPU: the same statistic over 25 runs; 4-GPU runs: mean of the 10 fastest
of 50 steps on rank 0, ms.

Assumptions and mappings:

* ``dtype``: the source's ``float32`` is ``fp32``. NeuSight ran with TF32 off (cuDNN TF32
  disabled; the GEMM kernel names show plain fp32 ``sgemm``/``ffma``/rocBLAS ``SB``).
* ``gpu``: the kernel files print the torch device name, kept as is. The model-op and
  e2e files name the GPU by NeuSight's label directory, which is the torch device name
  with spaces replaced by ``_`` (``NVIDIA_A100_80GB_PCIe``); we restore the spaces
  (``NVIDIA A100 80GB PCIe``) and keep the directory in ``source``. NeuSight's
  ``AMD_Instinct_MI250`` becomes ``AMD Instinct MI250``, which the catalog does not know
  (it has MI250X only): those rows are rejected at GPU resolution rather than guessed.
* GEMM view: the file's ``gemm_*`` columns are already the standard view (output
  ``batch x m x n``, reduction ``k``); ``linear`` carries a bias.
* Backward records (``backward=True``) keep the forward op's shapes; the time is the
  node's whole backward (for a linear: both the data- and the weight-gradient GEMMs).
* ``split`` is NeuSight's own train/test split (``neusight_split``): its test split holds
  larger, out-of-distribution shapes and is the natural held-out set.
* End-to-end runs: see :func:`read_neusight_e2e` (BERT is an encoder, not a causal
  decoder; Switch Transformer is an encoder-decoder MoE).
"""

from __future__ import annotations

import ast
import logging
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.records import ReadResult, RejectionReasons
from perfcast.data.schema import DType, OpType
from perfcast.data.tables import RUN_COLUMNS, RUN_MEASURED_COLUMN, read_table
from perfcast.errors import DatasetError, SpecError

logger = logging.getLogger(__name__)

SOURCE_NAME = "neusight"
"""Prefix of the ``source`` provenance column."""

NEUSIGHT_REPEATS = 25
"""Runs per op in NeuSight's collection; ``measured_ms`` is the mean of the 5 fastest."""

MAX_ELEMENTS = 2**62
"""Largest shape product accepted from a parsed shape (guards against garbage cells)."""

GEMM_REQUIRED: tuple[str, ...] = (
    "op", "gpu", "neusight_split", "dtype", "framework", "gemm_batch", "gemm_m", "gemm_n", "gemm_k", "latency_ms",
)  # fmt: skip
VECTOR_REQUIRED: tuple[str, ...] = (
    "op", "gpu", "neusight_split", "dtype", "framework", "rows_B", "cols_H", "latency_ms",
)  # fmt: skip
MODEL_OPS_REQUIRED: tuple[str, ...] = (
    "gpu", "model", "mode", "seq_len", "batch", "node", "node_kind", "target", "input_shapes", "output_shape",
    "dtype", "fw_latency_ms", "bw_latency_ms", "source_path",
)  # fmt: skip
E2E_REQUIRED: tuple[str, ...] = (
    "gpu", "n_gpus", "model", "mode", "seq_len", "global_batch", "dp", "tp", "pp", "pp_num_microbatches",
    "fused_kernels", "dtype", "e2e_latency_ms", "model_arch", "cfg_n_layers", "cfg_hidden", "cfg_heads", "cfg_ffn",
    "cfg_vocab", "cfg_num_experts", "source_path",
)  # fmt: skip
"""Source columns each reader needs; a file missing any of them raises DatasetError."""

LAUNCH_COLUMNS: tuple[str, ...] = ("n_kernels_launched", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
"""Launch-configuration columns kept from the kernel files when present."""

GEMM_OPS: dict[str, OpType] = {"bmm": OpType.BMM, "linear": OpType.LINEAR}
"""NeuSight GEMM op name -> op-table op."""

VECTOR_OPS: dict[str, tuple[OpType, bool]] = {
    "add": (OpType.ADD, False),
    "mul": (OpType.MUL, False),
    "div": (OpType.DIV, False),
    "pow": (OpType.POW, False),
    "addu": (OpType.ADD, True),
    "mulu": (OpType.MUL, True),
    "divu": (OpType.DIV, True),
    "powu": (OpType.POW, True),
    "relu": (OpType.RELU, False),
    "gelu": (OpType.GELU, False),
    "tanh": (OpType.TANH, False),
    "softmax": (OpType.SOFTMAX, False),
    "ln": (OpType.LAYERNORM, False),
}
"""NeuSight vector op name -> (op-table op, tensor-scalar). The ``*u`` ops take a Python scalar."""


# --------------------------------------------------------------------------------------
# shared helpers


def _check_columns(raw: pd.DataFrame, required: Sequence[str], path: str | Path, what: str) -> None:
    """Raise DatasetError naming every required column the source lacks."""
    missing = [c for c in required if c not in raw.columns]
    if missing:
        raise DatasetError(f"{path}: missing required {what} columns: {', '.join(missing)}")


def _numbers(raw: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """The columns as float64; unparseable cells become NaN."""
    return raw[list(columns)].apply(pd.to_numeric, errors="coerce").astype("float64")


def _bad_positive_int(value: pd.Series) -> pd.Series:
    """Mask of cells that are not positive whole numbers (NaN included)."""
    return ~(np.isfinite(value) & (value > 0) & (value == np.round(value)) & (value < MAX_ELEMENTS))


def _bad_time(value: pd.Series) -> pd.Series:
    """Mask of cells that are not positive finite times."""
    return ~(np.isfinite(value) & (value > 0))


def _map_names(values: pd.Series, parse: Callable[[str], object]) -> tuple[pd.Series, pd.Series]:
    """Map a name column per distinct value; (mapped values, error text or "" per row)."""
    mapping: dict[object, object] = {}
    errors: dict[object, str] = {}
    for raw in pd.unique(values):
        try:
            mapping[raw] = parse(str(raw).strip())
            errors[raw] = ""
        except (SpecError, KeyError, ValueError) as exc:
            mapping[raw] = None
            errors[raw] = str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)
    return values.map(mapping), values.map(errors).fillna("").astype(object)


def _parse_dtype(name: str) -> str:
    return DType.parse(name).value


def _label_to_device(label: pd.Series) -> pd.Series:
    """NeuSight's label directory (torch device name with ``_`` for spaces) -> device name."""
    return label.astype("string").str.replace("_", " ", regex=False).astype(object)


def _kernel_common(raw: pd.DataFrame, reasons: RejectionReasons) -> tuple[pd.Series, pd.Series]:
    """Shared checks of the kernel files: dtype and latency. Returns (dtype, time)."""
    dtype, dtype_err = _map_names(raw["dtype"], _parse_dtype)
    reasons.add((dtype_err != "").to_numpy(), dtype_err.to_numpy(dtype=object))
    time = pd.to_numeric(raw["latency_ms"], errors="coerce").astype("float64")
    reasons.add(time.isna() | ~np.isfinite(time), "latency_ms is missing or not a finite number")
    reasons.add(np.isfinite(time) & (time <= 0), "latency_ms is not positive")
    gpu_text = raw["gpu"].astype("string").str.strip()
    reasons.add((gpu_text.isna() | (gpu_text == "")).to_numpy(dtype=bool), "gpu is missing")
    return dtype, time


def _kernel_provenance(raw: pd.DataFrame, path: str | Path) -> dict[str, object]:
    """Provenance and launch columns of a kernel-file record."""
    out: dict[str, object] = {
        "n_repeats": NEUSIGHT_REPEATS,
        "source": f"{SOURCE_NAME}:{Path(path).name}",
        "split": raw["neusight_split"].astype(object),
        "framework": raw["framework"].astype(object),
    }
    if "kernel" in raw:
        out["kernel"] = raw["kernel"].astype(object)
    for col in LAUNCH_COLUMNS:
        if col in raw:
            out[col] = pd.to_numeric(raw[col], errors="coerce").astype("Float64").round().astype("Int64")
    out["source_row"] = raw.index.to_numpy()
    return out


# --------------------------------------------------------------------------------------
# kernels


def read_neusight_gemm(path: str | Path) -> ReadResult:
    """Read NeuSight's fp32 ``bmm`` / ``linear`` kernel latencies into op records.

    The time is the mean of the 5 fastest of 25 CUDA-event-timed runs of one op, ms,
    including launch overhead and every kernel the op launched (``n_kernels_launched``).

    Args:
        path: ``neusight_kernels_gemm.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (bmm|linear), ``batch, m, n, k`` (from ``gemm_*``), ``dtype``,
        ``gpu`` (as printed), ``backward`` (False), ``measured_ms`` (= ``latency_ms``),
        ``n_repeats``, ``source``, ``split`` (= ``neusight_split``), ``framework``,
        ``kernel``, the launch columns and ``source_row`` (0-based data row of the file).
        ``rejected``: rows with an unknown op or dtype, a non-positive or non-integer
        shape, or a missing/non-positive time, with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path).reset_index(drop=True)
    _check_columns(raw, GEMM_REQUIRED, path, "NeuSight GEMM")
    reasons = RejectionReasons(len(raw))
    op_name = raw["op"].astype("string").str.strip().str.lower()
    op = op_name.map(lambda v: GEMM_OPS[v].value if v in GEMM_OPS else None).astype(object)
    reasons.add(
        op.isna().to_numpy(dtype=bool),
        ("unknown op " + raw["op"].astype(str).map(repr) + f" (allowed: {', '.join(GEMM_OPS)})").to_numpy(dtype=object),
    )
    dims = _numbers(raw, ("gemm_batch", "gemm_m", "gemm_n", "gemm_k"))
    for col in dims:
        reasons.add(_bad_positive_int(dims[col]).to_numpy(), f"{col} is not a positive integer")
    dtype, time = _kernel_common(raw, reasons)
    ok, rejected = reasons.split(raw, path)
    good = raw[ok]
    n = dims[ok].astype("int64")
    records = pd.DataFrame(
        {
            "op": op[ok],
            "batch": n["gemm_batch"],
            "m": n["gemm_m"],
            "n": n["gemm_n"],
            "k": n["gemm_k"],
            "dtype": dtype[ok],
            "gpu": good["gpu"].astype(str).str.strip(),
            "backward": False,
            "measured_ms": time[ok],
            **_kernel_provenance(good, path),
        },
        index=good.index,
    )
    return ReadResult(records=records.reset_index(drop=True), rejected=rejected)


def read_neusight_vector(path: str | Path) -> ReadResult:
    """Read NeuSight's fp32 element-wise, softmax and LayerNorm kernel latencies.

    The input is one ``[rows_B, cols_H]`` fp32 tensor (and a second one of the same shape
    for ``add, mul, div, pow``; a Python scalar for ``addu, mulu, divu, powu``). Softmax
    and LayerNorm reduce over the last dim. The time is the mean of the 5 fastest of 25
    runs, ms, including launch overhead.

    Args:
        path: ``neusight_kernels_vector.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: ``op`` (add|mul|div|pow|relu|gelu|tanh|softmax|layernorm), ``rows``
        (= ``rows_B``), ``cols`` (= ``cols_H``), ``scalar`` (True for the ``*u`` ops),
        ``dtype``, ``gpu`` (as printed), ``backward`` (False), ``measured_ms``, and the
        provenance columns of :func:`read_neusight_gemm`. ``rejected``: rows with an
        unknown op (see :data:`VECTOR_OPS`) or dtype, a bad shape or time, with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path).reset_index(drop=True)
    _check_columns(raw, VECTOR_REQUIRED, path, "NeuSight vector")
    reasons = RejectionReasons(len(raw))
    op_name = raw["op"].astype("string").str.strip().str.lower()
    op = op_name.map(lambda v: VECTOR_OPS[v][0].value if v in VECTOR_OPS else None).astype(object)
    scalar = op_name.map(lambda v: VECTOR_OPS[v][1] if v in VECTOR_OPS else False).astype(bool)
    reasons.add(
        op.isna().to_numpy(dtype=bool),
        ("unknown op " + raw["op"].astype(str).map(repr) + f" (allowed: {', '.join(VECTOR_OPS)})").to_numpy(
            dtype=object
        ),
    )
    dims = _numbers(raw, ("rows_B", "cols_H"))
    for col in dims:
        reasons.add(_bad_positive_int(dims[col]).to_numpy(), f"{col} is not a positive integer")
    dtype, time = _kernel_common(raw, reasons)
    ok, rejected = reasons.split(raw, path)
    good = raw[ok]
    n = dims[ok].astype("int64")
    records = pd.DataFrame(
        {
            "op": op[ok],
            "rows": n["rows_B"],
            "cols": n["cols_H"],
            "scalar": scalar[ok],
            "dtype": dtype[ok],
            "gpu": good["gpu"].astype(str).str.strip(),
            "backward": False,
            "measured_ms": time[ok],
            **_kernel_provenance(good, path),
        },
        index=good.index,
    )
    return ReadResult(records=records.reset_index(drop=True), rejected=rejected)


# --------------------------------------------------------------------------------------
# per-operator latencies inside model graphs

_FUNCTION_REPR = re.compile(r"^<(?:built-in )?(?:function|method) (\w+)")
_ELEMENTWISE = {
    "add": OpType.ADD,
    "iadd": OpType.ADD,
    "mul": OpType.MUL,
    "imul": OpType.MUL,
    "truediv": OpType.DIV,
    "div": OpType.DIV,
    "pow": OpType.POW,
}
_UNARY = {"gelu": OpType.GELU, "relu": OpType.RELU, "tanh": OpType.TANH, "softmax": OpType.SOFTMAX}
_NORMS = {"layer_norm": OpType.LAYERNORM}
_GEMMS = {"addmm", "matmul", "bmm", "mm"}

LINEAR_MODULE_NAMES = frozenset(
    {
        "dense", "query", "key", "value", "q_proj", "k_proj", "v_proj", "out_proj", "o_proj", "fc1", "fc2", "fc_in",
        "fc_out", "c_attn", "c_proj", "c_fc", "lm_head", "classifier", "decoder", "seq_relationship", "gate_proj",
        "up_proj", "down_proj", "qkv_proj", "query_key_value", "dense_h_to_4h", "dense_4h_to_h", "wq", "wk", "wv",
        "wo", "wi", "score",
    }
)  # fmt: skip
"""Last names of ``call_module`` targets that are ``nn.Linear`` (or HF ``Conv1D``) layers."""

EMBEDDING_MODULE_NAMES = frozenset(
    {"wte", "wpe", "embed_tokens", "embed_positions", "word_embeddings", "position_embeddings", "token_type_embeddings"}
)
"""Last names of ``call_module`` targets that are ``nn.Embedding`` layers."""

ACTIVATION_MODULES: tuple[tuple[re.Pattern[str], OpType], ...] = (
    (re.compile(r"(^|\.)pooler\.activation$"), OpType.TANH),  # BertPooler.activation is nn.Tanh
    (re.compile(r"^model\.decoder\.layers\.\d+\.activation_fn$"), OpType.RELU),  # OPT-1.3B: activation "relu"
)
"""Activation modules whose kind the name does not say, with the kind their HF model uses."""

_NORM_MODULE = re.compile(r"(layernorm|layer_norm|^ln(_\w+)?$)")


def _parse_shapes(text: object, what: str) -> list[tuple[int, ...]] | str:
    """A list of shapes (``[[2, 3], [4]]``) or a single shape (``(2, 3)``); an error text when unreadable."""
    if not isinstance(text, str):
        return f"{what} is missing"
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return f"{what} is not a readable shape literal"
    items = value if what == "input_shapes" else [value]
    if not isinstance(items, (list, tuple)):
        return f"{what} is not a list of shapes"
    shapes: list[tuple[int, ...]] = []
    for shape in items:
        if not isinstance(shape, (list, tuple)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_ELEMENTS for d in shape
        ):
            return f"{what} is not a list of shapes of non-negative integers"
        if math.prod(shape) >= MAX_ELEMENTS:
            return f"{what} has a shape too large to be real"
        shapes.append(tuple(shape))
    return shapes


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def _rows_cols(shape: tuple[int, ...]) -> dict[str, int] | str:
    """Vector-op view of a tensor: rows = product of the leading dims, cols = last dim."""
    if not shape or _numel(shape) == 0:
        return "output is empty or a 0-d tensor"
    return {"rows": math.prod(shape[:-1]), "cols": shape[-1]}


def _elementwise(op: OpType, ins: list[tuple[int, ...]], out: tuple[int, ...]) -> dict[str, object] | str:
    """Binary element-wise op: tensor-tensor, or tensor-scalar when one operand has one element or is absent."""
    tensors = [s for s in ins if _numel(s) > 1]
    if not tensors:
        return "operands are scalars: Python/size arithmetic, not a tensor op"
    if len(tensors) > 2:
        return f"{len(tensors)} tensor operands for a binary op"
    view = _rows_cols(out)
    if isinstance(view, str):
        return view
    scalar = len(tensors) == 1
    broadcast = not scalar and tensors[0] != tensors[1]
    return {"op": op.value, **view, "scalar": scalar, "broadcast": broadcast}


def _gemm(target: str, ins: list[tuple[int, ...]], out: tuple[int, ...]) -> dict[str, object] | str:
    """addmm -> linear; mm, matmul and bmm -> matmul (unbatched) or bmm (batched)."""
    if target == "addmm":
        if len(ins) != 3 or len(ins[1]) != 2 or len(ins[2]) != 2:
            return "shapes do not fit addmm(bias, input[M,K], weight[K,N])"
        (m, k), (k2, n) = ins[1], ins[2]
        if k != k2 or out != (m, n):
            return "shapes do not fit addmm(bias, input[M,K], weight[K,N])"
        return {"op": OpType.LINEAR.value, "batch": 1, "m": m, "n": n, "k": k}
    if len(ins) != 2 or len(ins[0]) < 2 or len(ins[1]) < 2 or len(out) < 2:
        return f"shapes do not fit {target}(A[..., M, K], B[..., K, N])"
    a, b = ins
    m, k, k2, n = a[-2], a[-1], b[-2], b[-1]
    if k != k2 or out[-2:] != (m, n) or (target == "bmm" and (len(a) != 3 or len(b) != 3)):
        return f"shapes do not fit {target}(A[..., M, K], B[..., K, N])"
    if len(b) == 2:  # [..., M, K] x [K, N]: one GEMM over the flattened leading dims
        return {"op": OpType.MATMUL.value, "batch": 1, "m": math.prod(a[:-1]), "n": n, "k": k}
    batch = math.prod(out[:-2])
    op = OpType.BMM if len(out) > 2 else OpType.MATMUL
    return {"op": op.value, "batch": batch, "m": m, "n": n, "k": k}


def _module(target: str, ins: list[tuple[int, ...]], out: tuple[int, ...]) -> dict[str, object] | str:
    """Map a ``call_module`` node by its name, checking the shapes fit."""
    name = target.rsplit(".", 1)[-1].lower()
    if "drop" in name:
        return f"no op-table equivalent: {target}"
    if len(ins) != 1:
        return f"module {target} has {len(ins)} tensor inputs, expected 1"
    (x,) = ins
    if _NORM_MODULE.search(name):
        return {"op": OpType.LAYERNORM.value, **_view_or_error(out)}
    if name in EMBEDDING_MODULE_NAMES or name.endswith("embeddings") or name.endswith("embedding"):
        if not out or _numel(x) == 0:
            return "embedding shapes are empty"
        return {"op": OpType.EMBEDDING.value, "rows": _numel(x), "cols": out[-1]}
    for pattern, op in ACTIVATION_MODULES:
        if pattern.search(target):
            return {"op": op.value, **_view_or_error(out)}
    for word, op in (("gelu", OpType.GELU), ("relu", OpType.RELU), ("tanh", OpType.TANH), ("silu", OpType.SILU)):
        if word in name:
            return {"op": op.value, **_view_or_error(out)}
    if name in LINEAR_MODULE_NAMES:
        if len(x) < 1 or len(out) != len(x) or out[:-1] != x[:-1] or _numel(x) == 0:
            return f"shapes do not fit a linear layer: {target}"
        return {"op": OpType.LINEAR.value, "batch": 1, "m": math.prod(x[:-1]), "n": out[-1], "k": x[-1]}
    return f"no op-table equivalent: {target}"


def _view_or_error(out: tuple[int, ...]) -> dict[str, int]:
    view = _rows_cols(out)
    if isinstance(view, str):
        raise _ShapeError(view)
    return view


class _ShapeError(Exception):
    """Internal: a mapped node whose shapes do not give a valid op view."""


def _target_name(target: str) -> str:
    """``<function softmax at 0x...>`` -> ``softmax``; other targets unchanged."""
    match = _FUNCTION_REPR.match(target)
    return match.group(1) if match else target


def map_fx_node(node_kind: str, target: str, input_shapes: object, output_shape: object) -> dict[str, object] | str:
    """Map one torch.fx node of NeuSight's graphs to op-table fields.

    Args:
        node_kind: ``call_function``, ``call_method`` or ``call_module``.
        target: the node's target (function name or repr, method name, module path).
        input_shapes: Python-literal list of the tensor inputs' shapes (``"[[4, 1024], [1]]"``).
        output_shape: Python-literal shape of the output (``"(4, 1024)"``).

    Returns:
        The op-table fields (``op`` and its shape columns, ``scalar``/``broadcast`` for
        element-wise ops) or, when the node has no op-table equivalent or unreadable
        shapes, the reason as a string. Shapes are parsed with ``ast.literal_eval``.
    """
    kind = str(node_kind).strip()
    name = _target_name(str(target).strip())
    ins = _parse_shapes(input_shapes, "input_shapes")
    if isinstance(ins, str):
        return ins
    out_list = _parse_shapes(output_shape, "output_shape")
    if isinstance(out_list, str):
        return out_list
    (out,) = out_list
    try:
        if kind == "call_module":
            return _module(name, ins, out)
        if kind not in ("call_function", "call_method"):
            return f"no op-table equivalent: {kind} {name}"
        if name in _GEMMS:
            return _gemm(name, ins, out)
        if name in _ELEMENTWISE:
            return _elementwise(_ELEMENTWISE[name], ins, out)
        if name in _UNARY or name in _NORMS:
            op = _UNARY.get(name) or _NORMS[name]
            return {"op": op.value, **_view_or_error(out)}
        if name == "embedding" and ins and len(ins) >= 1 and out:
            return {"op": OpType.EMBEDDING.value, "rows": _numel(ins[0]), "cols": out[-1]}
    except _ShapeError as exc:
        return f"{name}: {exc}"
    return f"no op-table equivalent: {name}"


_MODEL_OP_SHAPES = ("batch", "m", "n", "k", "rows", "cols")


def read_neusight_model_ops(path: str | Path) -> ReadResult:
    """Read NeuSight's per-fx-node latencies of 1-layer HF transformers into op records.

    Each source row is one torch.fx node timed on its own (mean of the 5 fastest of 25
    runs, ms). A node whose target has an op-table equivalent (see :func:`map_fx_node`:
    ``addmm`` and Linear modules -> linear, ``matmul``/``bmm`` -> bmm (leading dims are
    the batch) or matmul, softmax, LayerNorm, GELU, ReLU, tanh, ``add/mul/truediv/pow``
    tensor-tensor or tensor-scalar, embeddings) gives a forward record and, when
    ``bw_latency_ms`` is a positive number (training graphs only), a backward record
    with the same shapes and ``backward=True``. All other nodes (views, getitem, dropout,
    masks, ``sub`` ...), element-wise ops on integer tensors or Python scalars, and rows
    with unreadable shapes or a missing/non-positive forward time are rejected with the
    reason. A mapped node of a training graph whose backward time is zero or missing gets
    no backward record (it is counted in the log).

    Args:
        path: ``neusight_model_op_latency.csv.gz`` (or a table with its columns).

    Returns:
        ``records``: the op-table columns that apply (``op``, ``batch, m, n, k`` or
        ``rows, cols, scalar``), ``dtype`` (fp32), ``gpu`` (torch device name, see the module
        docstring), ``backward``, ``measured_ms``, ``n_repeats``, ``source``
        (``"neusight:<source_path>"``), and provenance: ``model``, ``mode``, ``graph_batch``,
        ``graph_seq_len`` (the traced model's batch and sequence length), ``node``,
        ``node_kind``, ``target``, ``broadcast`` (element-wise operands of different
        shapes) and ``source_row``. ``rejected``: unmapped source rows with ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path).reset_index(drop=True)
    _check_columns(raw, MODEL_OPS_REQUIRED, path, "NeuSight model-op")
    mapped = [
        map_fx_node(kind, target, ins, out)
        for kind, target, ins, out in zip(
            raw["node_kind"], raw["target"], raw["input_shapes"], raw["output_shape"], strict=True
        )
    ]
    reasons = RejectionReasons(len(raw))
    reasons.add(
        np.array([isinstance(m, str) for m in mapped]),
        np.array([m if isinstance(m, str) else "" for m in mapped], dtype=object),
    )
    is_op = reasons.ok.copy()
    # dtype of the node's output: the mapped ops are floating-point tensor ops
    dtype_text = raw["dtype"].astype("string").str.strip()
    dtype, dtype_err = _map_names(raw["dtype"].astype("string").fillna("").astype(object), _parse_dtype)
    missing_dtype = is_op & (dtype_text.isna() | (dtype_text == "")).to_numpy(dtype=bool)
    reasons.add(missing_dtype, "output is not a tensor (dtype empty): Python/size arithmetic")
    bad_dtype = is_op & ~missing_dtype & (dtype_err != "").to_numpy(dtype=bool)
    reasons.add(bad_dtype, ("no op-table dtype: " + raw["dtype"].astype(str)).to_numpy(dtype=object))
    fw = pd.to_numeric(raw["fw_latency_ms"], errors="coerce").astype("float64")
    bw = pd.to_numeric(raw["bw_latency_ms"], errors="coerce").astype("float64")
    reasons.add(is_op & _bad_time(fw).to_numpy(), "fw_latency_ms is missing or not a positive number")
    gpu_text = raw["gpu"].astype("string").str.strip()
    reasons.add(is_op & (gpu_text.isna() | (gpu_text == "")).to_numpy(dtype=bool), "gpu is missing")
    ok, rejected = reasons.split(raw, path)

    good = raw[ok]
    fields = pd.DataFrame(
        [m for m, keep in zip(mapped, ok, strict=True) if keep],
        index=good.index,
        columns=["op", *_MODEL_OP_SHAPES, "scalar", "broadcast"],
    )
    shapes = {c: fields[c].astype("Int64") for c in _MODEL_OP_SHAPES}
    base = pd.DataFrame(
        {
            "op": fields["op"].astype(object),
            **shapes,
            # False where not tensor-scalar (GEMMs, unary ops): an NA here would read as "not true/false"
            "scalar": fields["scalar"].astype("boolean").fillna(False).astype(bool),
            "dtype": dtype[ok],
            "gpu": _label_to_device(good["gpu"]),
            "backward": False,
            "measured_ms": fw[ok],
            "n_repeats": NEUSIGHT_REPEATS,
            "source": SOURCE_NAME + ":" + good["source_path"].astype(str),
            "model": good["model"].astype(object),
            "mode": good["mode"].astype(object),
            "graph_batch": pd.to_numeric(good["batch"], errors="coerce").astype("Float64").round().astype("Int64"),
            "graph_seq_len": pd.to_numeric(good["seq_len"], errors="coerce").astype("Float64").round().astype("Int64"),
            "node": good["node"].astype(object),
            "node_kind": good["node_kind"].astype(object),
            "target": good["target"].astype(str).map(_target_name),
            "broadcast": fields["broadcast"].astype("boolean"),
            "source_row": good.index.to_numpy(),
        },
        index=good.index,
    )
    has_bw = (np.isfinite(bw) & (bw > 0)).to_numpy()[ok]
    train_no_bw = int((~has_bw & (good["mode"].astype(str) == "train").to_numpy()).sum())
    if train_no_bw:
        logger.info(
            "%s: %d mapped training-graph nodes have no positive bw_latency_ms (no backward record)", path, train_no_bw
        )
    backward = base[has_bw].assign(backward=True, measured_ms=bw[ok][has_bw])
    records = pd.concat([base, backward]).sort_values(["source_row", "backward"], kind="stable")
    return ReadResult(records=records.reset_index(drop=True), rejected=rejected)


# --------------------------------------------------------------------------------------
# whole models

E2E_DTYPE = "fp32"
"""NeuSight ran every model in fp32 (``mixed_precision=no`` for the 4-GPU runs)."""

_TIMING_SCOPES = {"inf": "fwd", "train": "fwd_bwd"}
_E2E_INT_COLUMNS = (
    "n_gpus",
    "seq_len",
    "global_batch",
    "dp",
    "tp",
    "pp",
    "cfg_n_layers",
    "cfg_hidden",
    "cfg_heads",
    "cfg_vocab",
)
_GPT2_ARCH = "GPT2LMHeadModel"


def read_neusight_e2e(path: str | Path) -> ReadResult:
    """Read NeuSight's whole-model latencies into run records.

    One row is one HF model (full depth) on one GPU, or on one 4-GPU node with one of
    DP=4, TP=4 or PP=4 (HF ``accelerate`` with the Megatron-LM plugin). Inference rows time
    the forward under ``no_grad`` (``timing_scope="fwd"``); training rows time forward +
    backward of a cross-entropy loss with **no optimizer step** (``"fwd_bwd"``).
    ``measured_step_ms`` = ``e2e_latency_ms``: per global batch, ms (single GPU: mean of the
    5 fastest of 25 runs; 4 GPUs: mean of the 10 fastest of 50 steps, rank 0).

    Fields and assumptions:

    * model: ``num_layers, hidden_size, num_heads, vocab_size`` from ``cfg_*``;
      ``num_kv_heads = num_heads`` (all are multi-head attention); ``ffn_hidden_size`` from
      ``cfg_ffn``, or ``4 * hidden`` for GPT-2 models whose config leaves ``n_inner`` unset
      (HF's default); ``num_experts`` = ``cfg_num_experts`` with ``top_k = 1`` (Switch
      routing) when there is more than one expert; ``vocab_size`` unpadded (HF).
    * ``micro_batch = global_batch / dp / m`` with ``m = pp_num_microbatches`` when ``pp > 1``
      else 1; a row where that is not a whole number is rejected.
    * ``dtype="fp32"``, ``recompute="none"``, ``flash_attention=False`` (eager attention),
      ``tied_embeddings=True`` (HF ties the LM head to the input embedding for these
      models by default), ``cp = ep = vpp = 1``, no sequence parallelism, ZeRO stage 0,
      full fine-tune, ``gpus_per_node = num_gpus`` (one node), ``gpu`` from the label
      directory (module docstring).
    * **Not all are causal decoders.** ``bert_large`` (``BertLMHeadModel``) is an encoder
      with bidirectional attention, and ``switchxl4`` is an encoder-decoder
      (``SwitchTransformersForConditionalGeneration``). They are kept, with the HF class
      in ``architecture`` (= ``model_arch``) so a consumer that assumes a GPT-style decoder
      can filter them out.

    Args:
        path: ``neusight_e2e_latency.csv`` (or a table with its columns).

    Returns:
        ``records``: the run-table columns, ``num_experts, top_k, tied_embeddings,
        flash_attention, model``, ``timing_scope``, ``measured_step_ms``, ``source``
        (``"neusight:<source_path>"``) and provenance ``architecture``, ``model_arch``,
        ``mode``, ``fused_kernels`` (``torch.compile``), ``source_row``. ``rejected``:
        rows with an unknown mode, a missing/non-positive time or field, or a
        non-integral micro-batch, with a ``reason``.

    Raises:
        DatasetError: the file cannot be read or lacks required columns (named).
    """
    raw = read_table(path).reset_index(drop=True)
    _check_columns(raw, E2E_REQUIRED, path, "NeuSight e2e")
    reasons = RejectionReasons(len(raw))
    num = _numbers(raw, (*_E2E_INT_COLUMNS, "pp_num_microbatches", "cfg_ffn", "cfg_num_experts", "e2e_latency_ms"))
    for col in _E2E_INT_COLUMNS:
        reasons.add(_bad_positive_int(num[col]).to_numpy(), f"{col} is not a positive integer")
    time = num["e2e_latency_ms"]
    reasons.add(_bad_time(time).to_numpy(), "e2e_latency_ms is missing or not a positive number")
    mode = raw["mode"].astype("string").str.strip().str.lower()
    scope = mode.map(lambda v: _TIMING_SCOPES.get(v) if isinstance(v, str) else None).astype(object)
    reasons.add(scope.isna().to_numpy(dtype=bool), f"mode is not one of {', '.join(_TIMING_SCOPES)}")
    dtype, dtype_err = _map_names(raw["dtype"], _parse_dtype)
    reasons.add((dtype_err != "").to_numpy(dtype=bool), dtype_err.to_numpy(dtype=object))
    reasons.add((dtype.notna() & (dtype != E2E_DTYPE)).to_numpy(dtype=bool), "dtype is not float32")

    pp = num["pp"]
    microbatches = num["pp_num_microbatches"].where(pp > 1, 1.0)
    bad_microbatches = (pp > 1) & _bad_positive_int(num["pp_num_microbatches"])
    reasons.add(bad_microbatches.to_numpy(), "pp_num_microbatches is not a positive integer")
    micro = num["global_batch"] / num["dp"] / microbatches
    inputs_ok = ~(_bad_positive_int(num["global_batch"]) | _bad_positive_int(num["dp"]) | bad_microbatches)
    reasons.add(
        (inputs_ok & _bad_positive_int(micro)).to_numpy(),
        "micro_batch = global_batch / dp / pp_num_microbatches is not a positive integer",
    )
    arch = raw["model_arch"].astype("string").str.strip()
    ffn = num["cfg_ffn"].where(num["cfg_ffn"].notna() | (arch != _GPT2_ARCH).fillna(True), 4 * num["cfg_hidden"])
    reasons.add((num["cfg_ffn"].notna() & _bad_positive_int(ffn)).to_numpy(), "cfg_ffn is not a positive integer")
    experts = num["cfg_num_experts"]
    reasons.add((experts.notna() & _bad_positive_int(experts)).to_numpy(), "cfg_num_experts is not a positive integer")
    ok, rejected = reasons.split(raw, path)

    good = raw[ok]
    n = num[ok]
    ints = n[list(_E2E_INT_COLUMNS)].astype("int64")
    moe = n["cfg_num_experts"].fillna(1) > 1
    fused = good["fused_kernels"].astype("string").str.strip().str.lower().map({"true": True, "false": False})
    out = pd.DataFrame(
        {
            "num_layers": ints["cfg_n_layers"],
            "hidden_size": ints["cfg_hidden"],
            "num_heads": ints["cfg_heads"],
            "num_kv_heads": ints["cfg_heads"],
            "ffn_hidden_size": ffn[ok].round().astype("Int64"),
            "vocab_size": ints["cfg_vocab"],
            "seq_len": ints["seq_len"],
            "tp": ints["tp"],
            "pp": ints["pp"],
            "dp": ints["dp"],
            "cp": 1,
            "ep": 1,
            "micro_batch": micro[ok].round().astype("int64"),
            "global_batch": ints["global_batch"],
            "vpp": 1,
            "sequence_parallel": False,
            "zero_stage": 0,
            "recompute": "none",
            "finetune": "full",
            "lora_rank": 0,
            "dtype": dtype[ok],
            "gpu": _label_to_device(good["gpu"]),
            "num_gpus": ints["n_gpus"],
            "gpus_per_node": ints["n_gpus"],
            "num_experts": n["cfg_num_experts"].where(moe).round().astype("Int64"),
            "top_k": pd.Series(1, index=good.index, dtype="Int64").where(moe),
            "tied_embeddings": True,
            "flash_attention": False,
            "model": good["model"].astype(object),
            "timing_scope": scope[ok],
            RUN_MEASURED_COLUMN: time[ok],
            "source": SOURCE_NAME + ":" + good["source_path"].astype(str),
            "architecture": arch[ok].astype(object),
            "model_arch": good["model_arch"].astype(object),
            "mode": mode[ok].astype(object),
            "fused_kernels": fused.astype("boolean"),
            "source_row": good.index.to_numpy(),
        },
        index=good.index,
    )
    ordered = [*RUN_COLUMNS, *(c for c in out.columns if c not in RUN_COLUMNS)]
    return ReadResult(records=out[ordered].reset_index(drop=True), rejected=rejected)
