"""Profiling plans: the op shapes worth measuring for LLM training, in a budget-friendly order.

:func:`profile_plan` expands model presets into op-table rows the profiler
(:mod:`perfcast.data.profiler`) can time: the shapes a training step of those models runs
(see :mod:`perfcast.features.workload` for where they come from), over a grid of
token counts, tensor-parallel degrees and sequence lengths.

Families (the ``ops`` argument also takes single op names, e.g. ``rmsnorm``):

* ``gemm``: per preset, tp degree (dividing the heads) and token count ``t`` (tokens of a
  microbatch on one rank): the QKV projection ``t x h -> (nh/tp + 2 nkv/tp) hd``, the
  attention output ``t x nh/tp hd -> h``, the MLP up (fused gate and up for gated MLPs)
  and down projections, the LM head ``t x h -> V_pad/tp``, and for MoE presets the
  router and the expert GEMMs (``bmm`` over all experts, balanced routing, ep = 1).
  Forward GEMMs are ``linear`` when the preset has biases, else ``matmul``; each also
  brings its two backward GEMMs (data gradient ``m=t, n=k, k=n``; weight gradient
  ``m=k, n=n, k=t``) as plain ``matmul`` rows.
* ``attention``: fused causal attention with ``nh/tp`` query and ``max(1, nkv/tp)`` key/value
  heads, ``seq_q = seq_kv`` in ``seq_lens``, batch 1 and ``8192 // seq`` sequences.
* ``norm``: ``layernorm`` and ``rmsnorm`` over ``rows`` = token counts (and ``t/tp`` for
  sequence parallelism), ``cols`` = hidden sizes.
* ``softmax``: the loss softmax (``t x V_pad/tp``), the MoE router softmax, and the unfused
  attention-score softmax (``nh/tp * s`` rows of ``s`` columns, ``s <= 4096``).
* ``elementwise``: residual ``add`` (``t x h``), gate ``mul`` (``t x f/tp``, and a
  tensor-scalar ``mul``), activations ``gelu`` and ``silu`` (``t x f/tp`` and ``t x h``);
  ``relu``, ``tanh``, ``div`` and ``pow`` when named explicitly.
* ``collective``: ``allreduce``, ``allgather`` and ``reducescatter`` of 1 MiB to 1 GiB
  (``bytes`` is the whole tensor: the all-gather's output, the reduce-scatter's input)
  over ``collective_ranks`` ranks of one node. Only meaningful with more than one GPU:
  pass ``collective_ranks=()`` to leave them out.

``fp8`` and ``tf32`` are GEMM number formats: other families get no rows for them.

Order: families are interleaved round-robin, so a short budget measures every family;
inside a family rows are ordered coarse-to-fine by greedy farthest-point sampling in
log-shape space (first the extremes, then the largest gaps), with the op and dtype as
categorical axes; ties and the start point come from ``seed``, and rows beyond the first
:data:`SPREAD_ROWS` of a family follow in a seeded shuffle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from perfcast.data.schema import DType, OpType
from perfcast.data.tables import OP_SHAPE_COLUMNS, cell_holds_value
from perfcast.errors import SpecError
from perfcast.features.model import NormType, TransformerSpec
from perfcast.features.parallel import padded_vocab_size

__all__ = [
    "DEFAULT_PRESETS",
    "FAMILIES",
    "KEY_COLUMNS",
    "PLAN_COLUMNS",
    "op_family",
    "parse_op_families",
    "plan_key",
    "profile_plan",
]

FAMILIES: dict[str, tuple[OpType, ...]] = {
    "gemm": (OpType.MATMUL, OpType.LINEAR, OpType.BMM),
    "attention": (OpType.ATTENTION,),
    "norm": (OpType.LAYERNORM, OpType.RMSNORM),
    "softmax": (OpType.SOFTMAX,),
    "elementwise": (OpType.ADD, OpType.MUL, OpType.GELU, OpType.SILU),
    "collective": (OpType.ALLREDUCE, OpType.ALLGATHER, OpType.REDUCESCATTER),
}
"""Op families of a plan, in interleaving order, with the ops each contains by default."""

_EXTRA_OPS: dict[OpType, str] = {
    OpType.RELU: "elementwise",
    OpType.TANH: "elementwise",
    OpType.DIV: "elementwise",
    OpType.POW: "elementwise",
}
"""Ops a plan has only when named explicitly, with their family."""

DEFAULT_PRESETS: tuple[str, ...] = (
    "gpt3-1.3b",
    "gpt3-6.7b",
    "gpt3-13b",
    "llama2-7b",
    "llama3-8b",
    "llama3-70b",
    "llama3.1-405b",
    "mixtral-8x7b",
    "qwen2.5-7b",
)
"""Presets of a plan when none are given: small to large widths, MHA and GQA, dense and MoE."""

DEFAULT_TOKENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
DEFAULT_COLLECTIVE_BYTES = tuple(2**p for p in range(20, 31))  # 1 MiB .. 1 GiB
ATTENTION_TOKENS = 8192
"""The attention grid's second batch size holds this many tokens: ``batch = 8192 // seq``."""
SOFTMAX_SCORE_MAX_SEQ = 4096
MIN_ROWS = 64
SPREAD_ROWS = 1024
"""Rows per family ordered by farthest-point sampling; the rest follow in a seeded shuffle."""

KEY_COLUMNS: tuple[str, ...] = OP_SHAPE_COLUMNS
"""Columns that identify a row: its ``key`` hashes them."""
_INT_COLUMNS = tuple(c for c in KEY_COLUMNS if c not in ("op", "dtype", "scalar", "causal", "backward"))
_BOOL_COLUMNS = ("scalar", "causal", "backward")
PLAN_COLUMNS: tuple[str, ...] = ("key", "family", *KEY_COLUMNS, "origin")
"""Columns of a plan; shape columns an op does not use hold 0 (flags False)."""

_GEMM_DTYPES = frozenset({DType.FP8, DType.TF32})
"""Number formats that only GEMMs have."""


def parse_op_families(ops: Iterable[str]) -> dict[str, frozenset[OpType]]:
    """Map requested family names and op names to ``{family: ops}``.

    Raises:
        SpecError: an entry is neither a family nor an op a plan can hold.
    """
    chosen: dict[str, set[OpType]] = {}
    for raw in ops:
        name = str(raw).strip().lower()
        if not name:
            continue
        if name in FAMILIES:
            chosen.setdefault(name, set()).update(FAMILIES[name])
            continue
        try:
            op = OpType(name)
        except ValueError:
            op = None
        family = op_family(op) if op is not None else None
        if family is None:
            allowed = ", ".join([*FAMILIES, *sorted(o.value for f in FAMILIES.values() for o in f), *_EXTRA_OPS])
            raise SpecError(f"op {raw!r} is not an op family or profilable op; allowed: {allowed}")
        chosen.setdefault(family, set()).add(op)
    if not chosen:
        raise SpecError(f"no ops requested; allowed families: {', '.join(FAMILIES)}")
    return {f: frozenset(chosen[f]) for f in FAMILIES if f in chosen}


def op_family(op: OpType | str) -> str | None:
    """Family of an op in a plan, or None for ops a plan never holds (embedding, optimizer ...)."""
    op = OpType(op)
    for family, members in FAMILIES.items():
        if op in members:
            return family
    return _EXTRA_OPS.get(op)


def plan_key(row: Any) -> str:
    """Stable 16-hex-digit key of a row (a mapping or Series): a SHA-1 of its :data:`KEY_COLUMNS`.

    Missing or NA cells count as 0 (flags as False), so a plan row and the record
    measured from it share the key.
    """
    parts = []
    for col in KEY_COLUMNS:
        value = row.get(col) if hasattr(row, "get") else row[col]
        if col in ("op", "dtype"):
            text = str(value)
        elif col in _BOOL_COLUMNS:
            text = "1" if _truthy(value) else "0"
        else:
            text = str(int(value)) if cell_holds_value(value) else "0"
        parts.append(f"{col}={text}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()[:16]


def profile_plan(
    ops: Sequence[str],
    dtypes: Sequence[str],
    *,
    presets: Sequence[str] | None = None,
    token_counts: Sequence[int] = DEFAULT_TOKENS,
    tp_degrees: Sequence[int] = (1, 2, 4, 8),
    seq_lens: Sequence[int] = DEFAULT_SEQ_LENS,
    collective_bytes: Sequence[int] = DEFAULT_COLLECTIVE_BYTES,
    collective_ranks: Sequence[int] = (2, 4, 8),
    backward: bool = False,
    seed: int = 0,
) -> pd.DataFrame:
    """Op-table rows to profile for LLM training, deduplicated and ordered (module docstring).

    Args:
        ops: family names (:data:`FAMILIES`) and/or op names.
        dtypes: number formats (``DType.parse`` spellings).
        presets: model preset ids (:func:`~perfcast.features.model.list_models`);
            default :data:`DEFAULT_PRESETS`.
        token_counts: tokens of one microbatch on one rank (GEMM ``m``, vector ``rows``).
        tp_degrees: tensor-parallel degrees; those that do not divide a preset's heads are
            left out for it.
        seq_lens: attention sequence lengths.
        collective_bytes, collective_ranks: collective message sizes (bytes) and group sizes.
        backward: also add the backward rows (``backward=True``) of attention, norm,
            softmax and element-wise ops.
        seed: seeds the order (same arguments and seed, same plan).

    Returns:
        One row per distinct shape, columns :data:`PLAN_COLUMNS`: ``key`` (see
        :func:`plan_key`), ``family``, the op-table shape columns and ``origin`` (the first
        preset and role that produced the shape).

    Raises:
        SpecError: an unknown op, dtype or preset, or an empty or non-positive grid.
    """
    families = parse_op_families(ops)
    kinds = _parse_dtypes(dtypes)
    models = [TransformerSpec.from_name(p) for p in (DEFAULT_PRESETS if presets is None else presets)]
    if not models:
        raise SpecError("presets is empty; give at least one preset id (see `perfcast models list`)")
    for name, grid in (
        ("token_counts", token_counts),
        ("tp_degrees", tp_degrees),
        ("seq_lens", seq_lens),
        ("collective_bytes", collective_bytes),
    ):
        if any(int(v) < 1 for v in grid) or (not grid and name != "collective_bytes"):
            raise SpecError(f"{name}={list(grid)!r} must be a non-empty list of positive integers")
    if any(int(r) < 2 for r in collective_ranks):
        raise SpecError(f"collective_ranks={list(collective_ranks)!r}: a collective needs at least 2 ranks")

    grid = _Grid(models, [int(t) for t in token_counts], [int(t) for t in tp_degrees], [int(s) for s in seq_lens])
    rows: list[dict[str, Any]] = []
    for family, members in families.items():
        family_dtypes = [d for d in kinds if family == "gemm" or d not in _GEMM_DTYPES]
        if family == "collective":
            family_dtypes = [d for d in kinds if d is not DType.FP8]
        shapes = _FAMILY_SHAPES[family](grid, members, collective_bytes, collective_ranks)
        if backward and family not in ("gemm", "collective"):
            shapes = shapes + [{**s, "backward": True, "origin": s["origin"] + " bwd"} for s in shapes]
        for dtype in family_dtypes:
            rows.extend({**s, "family": family, "dtype": dtype.value} for s in shapes)
    return _finish(rows, seed)


# ----------------------------------------------------------------------------- shapes


class _Grid:
    """The presets under every tp degree that divides their heads, with the grids."""

    def __init__(self, models: list[TransformerSpec], tokens: list[int], tps: list[int], seqs: list[int]) -> None:
        self.models, self.tokens, self.tps, self.seqs = models, tokens, tps, seqs

    def splits(self) -> Iterable[tuple[TransformerSpec, int]]:
        for model in self.models:
            for tp in self.tps:
                if model.num_heads % tp == 0:
                    yield model, tp


def _gemm_shapes(grid: _Grid, members: frozenset[OpType], *_: Any) -> list[dict[str, Any]]:
    out = []
    for model, tp in grid.splits():
        h, hd, nh, nkv = model.hidden_size, model.head_size, model.num_heads // tp, max(1, model.kv_heads // tp)
        f = model.ffn_size // tp
        up = f * (2 if model.gated_mlp else 1)
        vocab = padded_vocab_size(model, tp) // tp
        fwd_op = OpType.LINEAR if model.bias else OpType.MATMUL
        for t in grid.tokens:
            tag = f"{model.name} tp{tp} t{t}"
            layer = [("qkv", t, (nh + 2 * nkv) * hd, h), ("attn_out", t, h, nh * hd)]
            if not model.is_moe:
                layer += [("mlp_up", t, up, h), ("mlp_down", t, h, f)]
            for role, m, n, k in layer:
                out += _gemm_with_grads(fwd_op, 1, m, n, k, f"{tag} {role}")
            out += _gemm_with_grads(OpType.MATMUL, 1, t, vocab, h, f"{tag} lm_head")
            if model.is_moe:
                experts = model.num_experts
                per_expert = -(-t * model.top_k // experts)
                fe = model.expert_ffn_size // tp
                out += _gemm_with_grads(OpType.MATMUL, 1, t, experts, h, f"{tag} router")
                out += _gemm_with_grads(
                    OpType.BMM, experts, per_expert, fe * (2 if model.gated_mlp else 1), h, f"{tag} expert_up"
                )
                out += _gemm_with_grads(OpType.BMM, experts, per_expert, h, fe, f"{tag} expert_down")
    return [r for r in out if OpType(r["op"]) in members]


def _gemm_with_grads(op: OpType, batch: int, m: int, n: int, k: int, origin: str) -> list[dict[str, Any]]:
    grad_op = OpType.BMM if batch > 1 else OpType.MATMUL
    return [
        {"op": op.value, "batch": batch, "m": m, "n": n, "k": k, "origin": origin},
        {"op": grad_op.value, "batch": batch, "m": m, "n": k, "k": n, "origin": f"{origin} dgrad"},
        {"op": grad_op.value, "batch": batch, "m": k, "n": n, "k": m, "origin": f"{origin} wgrad"},
    ]


def _attention_shapes(grid: _Grid, members: frozenset[OpType], *_: Any) -> list[dict[str, Any]]:
    out = []
    for model, tp in grid.splits():
        nh, nkv = model.num_heads // tp, max(1, model.kv_heads // tp)
        for seq in grid.seqs:
            for batch in sorted({1, max(1, ATTENTION_TOKENS // seq)}):
                out.append(
                    {
                        "op": OpType.ATTENTION.value,
                        "batch": batch,
                        "heads": nh,
                        "kv_heads": nkv,
                        "seq_q": seq,
                        "seq_kv": seq,
                        "head_dim": model.head_size,
                        "causal": True,
                        "origin": f"{model.name} tp{tp} s{seq}",
                    }
                )
    return out


def _vector_rows(grid: _Grid) -> list[int]:
    """Row counts of vector ops: token counts, and their sequence-parallel splits."""
    rows = {t // tp for t in grid.tokens for tp in grid.tps}
    return sorted(r for r in rows if r >= MIN_ROWS)


def _norm_shapes(grid: _Grid, members: frozenset[OpType], *_: Any) -> list[dict[str, Any]]:
    out = []
    for model in grid.models:
        native = OpType.RMSNORM if model.norm is NormType.RMSNORM else OpType.LAYERNORM
        for op in sorted(members, key=lambda o: (o is not native, o.value)):
            for rows in _vector_rows(grid):
                out.append({"op": op.value, "rows": rows, "cols": model.hidden_size, "origin": f"{model.name}"})
    return out


def _softmax_shapes(grid: _Grid, members: frozenset[OpType], *_: Any) -> list[dict[str, Any]]:
    out = []
    for model, tp in grid.splits():
        vocab = padded_vocab_size(model, tp) // tp
        for t in grid.tokens:
            out.append({"op": "softmax", "rows": t, "cols": vocab, "origin": f"{model.name} tp{tp} loss"})
            if model.is_moe:
                out.append({"op": "softmax", "rows": t, "cols": model.num_experts, "origin": f"{model.name} router"})
        for seq in grid.seqs:
            if seq <= SOFTMAX_SCORE_MAX_SEQ:
                rows = model.num_heads // tp * seq
                out.append({"op": "softmax", "rows": rows, "cols": seq, "origin": f"{model.name} tp{tp} scores"})
    return out


def _elementwise_shapes(grid: _Grid, members: frozenset[OpType], *_: Any) -> list[dict[str, Any]]:
    out = []
    binary = (OpType.ADD, OpType.MUL, OpType.DIV, OpType.POW)
    for model, tp in grid.splits():
        h, f = model.hidden_size, model.ffn_size // tp
        for t in grid.tokens:
            tag = f"{model.name} tp{tp} t{t}"
            for op in sorted(members, key=lambda o: o.value):
                widths = (h, f) if op in binary else (f, h)
                for cols in widths:
                    out.append({"op": op.value, "rows": t, "cols": cols, "origin": tag})
                if op in binary and op is not OpType.ADD:
                    out.append({"op": op.value, "rows": t, "cols": h, "scalar": True, "origin": f"{tag} scalar"})
            if tp > 1 and OpType.ADD in members:  # sequence-parallel residual
                out.append({"op": "add", "rows": t // tp, "cols": h, "origin": f"{tag} sp"})
    return out


def _collective_shapes(
    grid: _Grid, members: frozenset[OpType], sizes: Sequence[int], ranks: Sequence[int]
) -> list[dict[str, Any]]:
    return [
        {"op": op.value, "bytes": int(b), "n_ranks": int(n), "ranks_per_node": int(n), "origin": f"{n} ranks"}
        for op in sorted(members, key=lambda o: o.value)
        for n in ranks
        for b in sizes
    ]


_FAMILY_SHAPES = {
    "gemm": _gemm_shapes,
    "attention": _attention_shapes,
    "norm": _norm_shapes,
    "softmax": _softmax_shapes,
    "elementwise": _elementwise_shapes,
    "collective": _collective_shapes,
}


# ----------------------------------------------------------------------------- order


def _finish(rows: list[dict[str, Any]], seed: int) -> pd.DataFrame:
    df = pd.DataFrame(rows).reindex(columns=list(PLAN_COLUMNS))
    for col in _INT_COLUMNS:
        df[col] = df[col].fillna(0).astype("int64")
    for col in _BOOL_COLUMNS:
        df[col] = df[col].astype("boolean").fillna(False).astype(bool)
    if df.empty:
        return df.astype({"key": object, "family": object, "op": object, "dtype": object, "origin": object})
    df["key"] = [plan_key(r) for r in df.to_dict("records")]
    df = df.drop_duplicates("key", keep="first").reset_index(drop=True)
    rng = np.random.default_rng(seed)
    queues = [_spread_order(df[df["family"] == f], rng) for f in FAMILIES if (df["family"] == f).any()]
    order: list[int] = []
    for i in range(max(len(q) for q in queues)):
        order.extend(int(q[i]) for q in queues if i < len(q))
    return df.loc[order].reset_index(drop=True)


def _spread_order(part: pd.DataFrame, rng: np.random.Generator) -> np.ndarray:
    """Index labels of ``part`` in coarse-to-fine order (greedy farthest-point, then shuffle)."""
    labels = part.index.to_numpy()[rng.permutation(len(part))]  # seeded tie-break
    sub = part.loc[labels]
    numeric = [c for c in _INT_COLUMNS if (sub[c] > 0).any()]
    logs = np.log2(np.maximum(sub[numeric].to_numpy(dtype=float), 1.0))
    span = logs.max(axis=0) - logs.min(axis=0)
    points = [(logs - logs.min(axis=0)) / np.where(span > 0, span, 1.0)]
    for col in ("op", "dtype", "causal", "scalar", "backward"):
        if sub[col].nunique() > 1:
            points.append(pd.get_dummies(sub[col]).to_numpy(dtype=float) / np.sqrt(2.0))
    x = np.hstack(points) if points else np.zeros((len(sub), 1))
    n_spread = min(len(sub), SPREAD_ROWS)
    chosen = np.empty(n_spread, dtype=np.int64)
    dist = np.full(len(sub), np.inf)
    current = 0
    for i in range(n_spread):
        chosen[i] = current
        dist = np.minimum(dist, ((x - x[current]) ** 2).sum(axis=1))
        dist[chosen[: i + 1]] = -1.0
        current = int(np.argmax(dist))
    rest = np.setdiff1d(np.arange(len(sub)), chosen, assume_unique=True)
    return labels[np.concatenate([chosen, rng.permutation(rest)])]


# ----------------------------------------------------------------------------- helpers


def _parse_dtypes(dtypes: Sequence[str]) -> list[DType]:
    out: list[DType] = []
    for d in dtypes:
        kind = DType.parse(d)
        if kind not in out:
            out.append(kind)
    if not out:
        raise SpecError(f"dtypes is empty; allowed: {', '.join(d.value for d in DType)}")
    return out


def _truthy(value: Any) -> bool:
    if not cell_holds_value(value):
        return False
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "t", "y", "1.0")
    return bool(value)
