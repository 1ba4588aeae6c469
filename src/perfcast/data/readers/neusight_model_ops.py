"""Reader of NeuSight's per-operator latencies inside 1-layer HuggingFace transformers: each
torch.fx node mapped to an op record (:func:`map_fx_node`), forward and backward.

See :mod:`perfcast.data.readers.neusight` for the source, its time statistic and the
mappings (dtype, GPU names).
"""

from __future__ import annotations

import ast
import logging
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfcast.data.readers._neusight_common import (
    MAX_ELEMENTS,
    NEUSIGHT_REPEATS,
    SOURCE_NAME,
    TIMING,
    bad_time,
    label_to_device,
    map_names,
    parse_dtype,
    read_source,
)
from perfcast.data.records import ReadResult, RejectionReasons
from perfcast.data.schema import OpType

logger = logging.getLogger(__name__)

MODEL_OPS_REQUIRED: tuple[str, ...] = (
    "gpu", "model", "mode", "seq_len", "batch", "node", "node_kind", "target", "input_shapes", "output_shape",
    "dtype", "fw_latency_ms", "bw_latency_ms", "source_path",
)  # fmt: skip
"""Source columns :func:`read_neusight_model_ops` needs; a file missing any of them raises DatasetError."""

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
    raw = read_source(path, MODEL_OPS_REQUIRED, "NeuSight model-op")
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
    dtype, dtype_err = map_names(raw["dtype"].astype("string").fillna("").astype(object), parse_dtype)
    missing_dtype = is_op & (dtype_text.isna() | (dtype_text == "")).to_numpy(dtype=bool)
    reasons.add(missing_dtype, "output is not a tensor (dtype empty): Python/size arithmetic")
    bad_dtype = is_op & ~missing_dtype & (dtype_err != "").to_numpy(dtype=bool)
    reasons.add(bad_dtype, ("no op-table dtype: " + raw["dtype"].astype(str)).to_numpy(dtype=object))
    fw = pd.to_numeric(raw["fw_latency_ms"], errors="coerce").astype("float64")
    bw = pd.to_numeric(raw["bw_latency_ms"], errors="coerce").astype("float64")
    reasons.add(is_op & bad_time(fw).to_numpy(), "fw_latency_ms is missing or not a positive number")
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
            "gpu": label_to_device(good["gpu"]),
            "backward": False,
            "measured_ms": fw[ok],
            "n_repeats": NEUSIGHT_REPEATS,
            "timing": TIMING.value,
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
