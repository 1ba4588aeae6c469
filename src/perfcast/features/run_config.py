"""One row of the run table as checked specs: model, parallel layout and cluster.

A row names its model by fields (``num_layers``, ``hidden_size`` ...) or by ``model``,
a preset id or a Hugging Face ``config.json`` path; fields given beside ``model``
override the preset's (e.g. ``model=llama2-7b, seq_len=8192``). Parallel fields default
to no parallelism; ``global_batch`` defaults to ``dp * micro_batch``; ``num_gpus``
defaults to ``tp*pp*dp*cp``. The ``framework`` (default ``megatron-deepspeed``) fills
``zero_stage`` and the software switches a row leaves unstated
(:func:`~perfcast.features.frameworks.framework_fields`). Empty cells count as absent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pydantic import ValidationError

from perfcast.data.schema import (
    FIELD_MAX,
    FIELD_MIN_ZERO,
    RUN_BOOL_COLUMNS,
    RUN_INT_COLUMNS,
    DType,
    Fp8Recipe,
    check_whole_number,
    parse_flag,
)
from perfcast.data.tables import (
    PIPELINE_SPLIT_COLUMNS,
    RUN_COLUMNS,
    SOFTWARE_COLUMNS,
    cell_holds_value,
    misspelt_columns,
    unread_values_error,
)
from perfcast.errors import PerfcastError, SpecError, UnknownEntryError
from perfcast.features.cluster import ClusterSpec
from perfcast.features.frameworks import Framework, framework_fields
from perfcast.features.model import TransformerSpec
from perfcast.features.model_source import ModelSource, model_key
from perfcast.features.parallel import Finetune, ParallelConfig, check_layout, pipeline_split

MODEL_FIELDS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "ffn_hidden_size",
    "vocab_size",
    "seq_len",
    "num_experts",
    "top_k",
    "gated_mlp",
    "head_dim",
    "tied_embeddings",
    "bias",
    "activation",
    "norm",
    "position_embedding",
    "moe_ffn_hidden_size",
    "moe_layer_freq",
)
PARALLEL_FIELDS = (
    *RUN_COLUMNS[RUN_COLUMNS.index("tp") : RUN_COLUMNS.index("dtype") + 1],
    "flash_attention",
    "fp8_recipe",
    "etp",
    "dp_replicate",
    "document_tokens",
    *PIPELINE_SPLIT_COLUMNS,
    *SOFTWARE_COLUMNS,
)
RUN_INT_FIELDS = frozenset({*RUN_INT_COLUMNS, "head_dim", "moe_ffn_hidden_size", "moe_layer_freq"})
"""Run-row inputs that are whole numbers (ranges: :data:`perfcast.data.schema.FIELD_MAX`)."""
RUN_BOOL_FIELDS = frozenset({*RUN_BOOL_COLUMNS, "bias"})
"""Run-row inputs that are booleans."""


SHAPE_FIELDS = ("num_layers", "hidden_size", "num_heads", "vocab_size")
"""The model fields a row must give when it names no preset or config (the rest have defaults)."""
MODEL_STYLE_FIELDS = ("gated_mlp", "activation", "norm", "position_embedding", "tied_embeddings", "bias")
"""Architecture choices of a model given by fields that change its time or memory; their defaults
(:class:`~perfcast.features.model.TransformerSpec`: GPT-style) are named in ``defaulted_fields``."""
MOE_SHAPE_FIELDS = ("top_k", "moe_ffn_hidden_size", "moe_layer_freq")
"""Expert fields of an MoE model given by fields whose defaults are named in ``defaulted_fields``."""
DEFAULT_LORA_RANK = 16
"""Adapter rank of a ``finetune=lora`` row that states none (or 0)."""


def filled_lora_rank(finetune: Any, lora_rank: Any) -> int | None:
    """:data:`DEFAULT_LORA_RANK` for a LoRA run (``finetune`` a :class:`Finetune` or its text)
    that states no ``lora_rank`` (or 0); None where the run's own rank stands."""
    lora = str(getattr(finetune, "value", finetune) or "").strip().lower() == Finetune.LORA.value
    return DEFAULT_LORA_RANK if lora and not lora_rank else None


DEFAULTED_COLUMN = "defaulted_fields"
"""Run-table column naming, comma-separated, the inputs a default filled (readers' and the parser's)."""


@dataclass(frozen=True)
class RunConfig:
    """A checked training config: what runs, how it is split, and on what.

    ``defaulted`` names the run-table inputs the row did not state that a default filled
    and that matter for this layout (see :func:`defaulted_names`), after the names the
    row's own ``defaulted_fields`` cell gave (a reader's fills).
    """

    model: TransformerSpec
    parallel: ParallelConfig
    cluster: ClusterSpec
    defaulted: tuple[str, ...] = ()

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one global batch."""
        return self.parallel.global_batch * self.model.seq_len


def _coerce(name: str, value: Any) -> Any:
    """Turn a table cell into the type of field ``name``; SpecError names bad values."""
    if name == "framework":
        return Framework.parse(value)
    if name in RUN_INT_FIELDS:
        return check_whole_number(name, value)
    if name in RUN_BOOL_FIELDS:
        return parse_flag(name, value)
    return str(value).strip() if isinstance(value, str) else value


def validate_spec(cls: type[Any], fields: dict[str, Any], where: str) -> Any:
    """``cls.model_validate(fields)``, its first error raised as a SpecError naming the field
    (``where`` when the error has no location), the value and what is allowed."""
    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, SpecError):  # a cross-field rule: its message already names fields and values
            raise SpecError(str(cause)) from None
        loc = ".".join(str(x) for x in first["loc"]) or where
        value = first.get("input")
        raise SpecError(f"{loc}={value!r}: {first['msg']}") from None


def parse_run_row(row: Mapping[str, Any], *, model_source: ModelSource | None = None) -> RunConfig:
    """Build and check the specs of one run-table row.

    Args:
        row: the row's cells by column name.
        model_source: how a ``model`` cell is resolved (default: presets, inline configs
            and any file path, for a local user).

    Raises:
        SpecError: naming the field, the value and what is allowed.
    """
    unread = _unread_values(row, misspelt_inputs(list(row.keys())))
    if unread is not None:
        raise unread
    cells = {n: _cell(n, row[n]) for n in RUN_INPUT_FIELDS if n in row and cell_holds_value(row[n])}
    return _RowParser(model_source).parse(cells)


def parse_run_table(runs: pd.DataFrame, *, model_source: ModelSource | None = None) -> list[RunConfig | PerfcastError]:
    """:func:`parse_run_row` of every row of ``runs``: its config, or the error it raises (the same one).

    Cells are converted a column at a time, and rows naming the same model, cluster or
    layout share one checked spec object, built once.
    """
    columns = {n: _column_cells(n, runs[n]) for n in RUN_INPUT_FIELDS if n in runs.columns}
    misspelt = misspelt_inputs(runs.columns)
    named = [*{*misspelt, *(f for f in misspelt.values() if f in runs.columns)}]
    spelt = runs[named].to_dict("records") if misspelt else []  # the cells those checks read
    parser = _RowParser(model_source)
    out: list[RunConfig | PerfcastError] = []
    names = list(columns)
    rows = zip(*columns.values(), strict=True) if names else [()] * len(runs)
    for i, values in enumerate(rows):
        cells = {n: v for n, v in zip(names, values, strict=True) if v is not _ABSENT}
        try:
            unread = _unread_values(spelt[i], misspelt) if misspelt else None
            if unread is not None:
                raise unread
            out.append(parser.parse(cells))
        except PerfcastError as exc:
            out.append(exc)
    return out


INPUT_ALIASES = {
    "tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp", "data_parallel_size": "dp",
    "context_parallel_size": "cp", "expert_model_parallel_size": "ep", "expert_tensor_parallel_size": "etp",
    "virtual_pipeline_model_parallel_size": "vpp",
    "micro_batch_size": "micro_batch", "global_batch_size": "global_batch", "seq_length": "seq_len",
    "num_attention_heads": "num_heads", "num_query_groups": "num_kv_heads", "num_moe_experts": "num_experts",
    "moe_router_topk": "top_k", "padded_vocab_size": "vocab_size", "recompute_granularity": "recompute",
    "world_size": "num_gpus",
}  # fmt: skip
"""Megatron-LM argument names (and the like) of run-table inputs -> the input a run table spells them as."""


def misspelt_inputs(columns: Iterable[str]) -> dict[str, str]:
    """Columns that are not run-table inputs but name one another way (another case, or an
    :data:`INPUT_ALIASES` name) -> that input (:func:`~perfcast.data.tables.misspelt_columns`)."""
    return misspelt_columns(columns, RUN_INPUT_FIELDS, INPUT_ALIASES)


def _unread_values(row: Mapping[str, Any], misspelt: Mapping[str, str]) -> SpecError | None:
    """:func:`~perfcast.data.tables.unread_values_error` of a run row: a value is the same when it
    converts (:func:`_cell`) to the same cell."""
    return unread_values_error(row, misspelt, "run", lambda field, a, b: _cell(field, a) == _cell(field, b))


_ABSENT = object()
"""An empty cell."""
RUN_INPUT_FIELDS = (
    *MODEL_FIELDS, "model", *PARALLEL_FIELDS, "gpu", "num_gpus", "gpus_per_node", "nvlink_domain", "inter_node",
    DEFAULTED_COLUMN
)  # fmt: skip
"""Every run-row input the parser reads (the other columns of a table pass through, except those
:func:`misspelt_inputs` finds); the HTTP schema is built from this list, so the two cannot disagree."""
_TEXT_FIELDS = frozenset(("model", "gpu", "inter_node", DEFAULTED_COLUMN))
"""Cells read as text (stripped), with no type of their own."""


def _cell(name: str, value: Any) -> Any:
    """A present cell as field ``name`` takes it, or the SpecError that names the bad value."""
    if name == "model" and isinstance(value, Mapping):  # an inline config
        return value
    if name in _TEXT_FIELDS:
        return str(value).strip()
    try:
        return _coerce(name, value)
    except SpecError as exc:
        return exc


def _column_cells(name: str, column: pd.Series) -> list[Any]:
    """:func:`_cell` of every cell of ``column`` (:data:`_ABSENT` where empty); whole-number
    and boolean columns convert at once."""
    kind = column.dtype.kind if not column.hasnans else "O"  # a nullable column with gaps goes cell by cell
    if kind in "iu" and name in RUN_INT_FIELDS:  # whole numbers already: convert at once when all are in range
        exact_ints = bool(column.between(0 if name in FIELD_MIN_ZERO else 1, FIELD_MAX[name]).all())
    else:
        exact_ints = False
    if exact_ints or (kind == "b" and name in RUN_BOOL_FIELDS):
        return column.tolist()
    return [_cell(name, v) if cell_holds_value(v) else _ABSENT for v in column.tolist()]


class _RowParser:
    """Checks rows of converted cells (:func:`_cell`) into configs, remembering the specs it builds.

    Specs are keyed by their cells; errors are remembered too, so a repeated bad value
    raises the same message again.
    """

    def __init__(self, model_source: ModelSource | None = None) -> None:
        self._specs: dict[tuple[Any, ...], Any] = {}
        self._models = model_source or ModelSource()

    def _memo(self, key: tuple[Any, ...], build: Callable[..., Any], *args: Any) -> Any:
        """The spec of ``key``, ``build(*args)`` the first time; raises its error again."""
        found = self._specs.get(key, _ABSENT)
        if found is _ABSENT:
            try:
                found = build(*args)
            except PerfcastError as exc:
                found = exc
            self._specs[key] = found
        if isinstance(found, PerfcastError):
            raise found
        return found

    def parse(self, cells: Mapping[str, Any]) -> RunConfig:
        """The config of one row's present cells; raises the first bad cell's or rule's SpecError."""
        model_fields = _fields(cells, MODEL_FIELDS)
        shaped = all(f in model_fields for f in SHAPE_FIELDS)
        if "model" in cells:
            ref = cells["model"]
            key = ("model", model_key(ref), *model_fields.items())
            try:
                model = self._memo(key, _referenced_model, self._models, ref, model_fields)
            except UnknownEntryError:
                if not shaped:
                    raise
                # an unknown name beside a complete shape is a label: the fields define the model
                named = {**model_fields, "name": str(ref)}
                model = self._memo(("fields", *named.items()), validate_spec, TransformerSpec, named, "model")
        else:
            missing = [f for f in SHAPE_FIELDS if f not in model_fields]
            if missing:
                raise SpecError(f"missing model fields {', '.join(missing)}: give them or a `model` preset/config path")
            model = self._memo(("fields", *model_fields.items()), validate_spec, TransformerSpec, model_fields, "model")

        parallel_fields = _fields(cells, PARALLEL_FIELDS)
        filled = filled_lora_rank(parallel_fields.get("finetune"), parallel_fields.get("lora_rank"))
        if filled is not None:
            parallel_fields["lora_rank"] = filled
        parallel_fields.setdefault("global_batch", parallel_fields.get("dp", 1) * parallel_fields.get("micro_batch", 1))
        _fold_mxfp8_recipe(parallel_fields)
        parallel_fields.update(framework_fields(parallel_fields))
        key = ("parallel", *parallel_fields.items())
        parallel = self._memo(key, validate_spec, ParallelConfig, parallel_fields, "parallel")

        if "gpu" not in cells:
            raise SpecError("missing field gpu: give a catalog id or device name (see `perfcast hardware list`)")
        cluster_fields = _fields(cells, ("num_gpus", "gpus_per_node", "nvlink_domain"))
        inter_node, gpu = cells.get("inter_node"), cells["gpu"]
        num_gpus, per_node = cluster_fields.get("num_gpus", parallel.world_size), cluster_fields.get("gpus_per_node")
        domain = cluster_fields.get("nvlink_domain")
        key = ("cluster", gpu, num_gpus, per_node, inter_node, domain)
        cluster = self._memo(key, _cluster, gpu, num_gpus, per_node, inter_node, domain)
        check_layout(model, parallel, cluster)
        # the GPU must run the dtype (no bf16 on a V100)
        self._memo(("peak", cluster.gpu.id, parallel.dtype), cluster.gpu.peak_tflops, parallel.dtype)
        given = [n.strip() for n in str(cells.get(DEFAULTED_COLUMN, "")).split(",") if n.strip()]
        names = defaulted_names(cells, parallel, cluster, model_by_fields="model" not in cells, model=model)
        defaulted = tuple(dict.fromkeys([*given, *names]))
        return RunConfig(model=model, parallel=parallel, cluster=cluster, defaulted=defaulted)


def defaulted_names(
    cells: Mapping[str, Any],
    parallel: ParallelConfig,
    cluster: ClusterSpec,
    *,
    model_by_fields: bool,
    model: TransformerSpec | None = None,
) -> list[str]:
    """The run-table inputs absent from ``cells`` whose default shapes this config's prediction.

    Parallel degrees (``tp, pp, dp, cp, ep``) are not listed: an absent degree means no such
    parallelism. A preset's or config file's model fields are stated by it; a model given
    by fields lists the shape fields (:data:`MODEL_STYLE_FIELDS`; for an MoE model also
    :data:`MOE_SHAPE_FIELDS`) it left to their defaults. Given the ``model``, the
    uneven-pipeline switches that :func:`~perfcast.features.parallel.pipeline_split` chose
    (``pp * vpp`` not dividing the layers, no switch stated) are listed last, by name
    (``pipeline_layout`` for its fallback split, which no column states). An absent
    ``framework`` is always listed, and so is each software switch its defaults filled
    (:func:`~perfcast.features.frameworks.framework_fields`) where the layout has what it
    switches (``torch_compile`` never: perfcast does not model it).
    """
    p = parallel
    moe_by_fields = model_by_fields and model is not None and model.is_moe
    relevant = {
        "seq_len": model_by_fields,
        "ffn_hidden_size": model_by_fields,
        "num_kv_heads": model_by_fields,
        **dict.fromkeys(MODEL_STYLE_FIELDS, model_by_fields),
        **dict.fromkeys(MOE_SHAPE_FIELDS, moe_by_fields),
        "micro_batch": True,
        "global_batch": True,
        "dtype": True,
        "recompute": True,
        "flash_attention": True,
        "lora_rank": filled_lora_rank(p.finetune, cells.get("lora_rank")) is not None,
        "document_tokens": p.finetune is not Finetune.FULL,
        "vpp": p.pp > 1,
        "sequence_parallel": p.tp > 1,
        "etp": model is not None and model.is_moe and p.tp > 1,
        "zero_stage": p.dp * p.cp > 1,
        "overlap_grad_reduce": p.dp * p.cp > 1,
        "framework": True,
        "tp_comm_overlap": p.tp > 1 and p.sequence_parallel,
        "overlap_param_gather": p.zero_shard_ranks > 1 and p.zero_stage in (1, 2),
        "fsdp_prefetch": p.zero_shard_ranks > 1 and p.zero_stage == 3,
        "ep_comm_overlap": model is not None and model.is_moe and p.ep > 1 and p.num_microbatches > 1,
        "cuda_graphs": True,
        "num_gpus": True,
        "gpus_per_node": cluster.num_gpus > 1,
        "nvlink_domain": cluster.num_gpus > cluster.gpus_per_node,
        "inter_node": cluster.num_gpus > cluster.nvlink_domain,
    }
    names = [name for name, matters in relevant.items() if matters and (name not in cells or name == "lora_rank")]
    if model is not None and p.pp > 1:
        names += pipeline_split(model.num_layers, p).defaulted
    return names


def _fold_mxfp8_recipe(fields: dict[str, Any]) -> None:
    """``dtype=fp8, fp8_recipe=mxfp8`` (Megatron-LM's ``--fp8-format e4m3 --fp8-recipe mxfp8``)
    is an MXFP8 run: set ``dtype=mxfp8`` in ``fields``. Other values are checked by
    :class:`ParallelConfig`."""
    recipe, dtype = fields.get("fp8_recipe"), fields.get("dtype")
    if not isinstance(recipe, str) or recipe.strip().lower() != Fp8Recipe.MXFP8.value or dtype is None:
        return
    try:
        if DType.parse(dtype) is DType.FP8:
            fields["dtype"] = DType.MXFP8.value
    except SpecError:
        return  # ParallelConfig names the bad dtype


def _cluster(gpu: str, num_gpus: int, per_node: int | None, inter_node: str | None, domain: int | None) -> ClusterSpec:
    return ClusterSpec.build(gpu, num_gpus, per_node, inter_node, nvlink_domain=domain)


def _fields(cells: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The cells of ``names`` that are present; raises the first bad one's SpecError."""
    out = {n: cells[n] for n in names if n in cells}
    for value in out.values():
        if isinstance(value, SpecError):
            raise value
    return out


def _referenced_model(source: ModelSource, ref: str | Mapping[str, Any], overrides: dict[str, Any]) -> TransformerSpec:
    """The spec ``ref`` names (through ``source``) with the row's own model fields over it."""
    base = source.resolve(ref)
    return validate_spec(TransformerSpec, {**base.model_dump(), **overrides}, "model")
