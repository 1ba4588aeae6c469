"""One row of the run table as checked specs: model, parallel layout and cluster.

A row names its model by fields (``num_layers``, ``hidden_size`` ...) or by ``model``,
a preset id or a Hugging Face ``config.json`` path; fields given beside ``model``
override the preset's (e.g. ``model=llama2-7b, seq_len=8192``). Parallel fields default
to no parallelism; ``global_batch`` defaults to ``dp * micro_batch``; ``num_gpus``
defaults to ``tp*pp*dp*cp``. Empty cells count as absent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from perfcast.data.schema import RUN_BOOL_COLUMNS, RUN_INT_COLUMNS
from perfcast.data.tables import RUN_COLUMNS
from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec
from perfcast.features.model import ModelSpec
from perfcast.features.parallel import ParallelConfig, check_layout

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
PARALLEL_FIELDS = (*RUN_COLUMNS[RUN_COLUMNS.index("tp") : RUN_COLUMNS.index("dtype") + 1], "flash_attention")
_INT_FIELDS = {*RUN_INT_COLUMNS, "head_dim", "moe_ffn_hidden_size", "moe_layer_freq"}
_BOOL_FIELDS = {*RUN_BOOL_COLUMNS, "bias"}
_TRUE = {"1", "1.0", "true", "yes", "y", "t"}
_FALSE = {"0", "0.0", "false", "no", "n", "f"}


@dataclass(frozen=True)
class RunConfig:
    """A checked training config: what runs, how it is split, and on what."""

    model: ModelSpec
    parallel: ParallelConfig
    cluster: ClusterSpec

    @property
    def tokens_per_step(self) -> int:
        """Tokens of one global batch."""
        return self.parallel.global_batch * self.model.seq_len


def _present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, float) and math.isnan(value):
        return False
    return not (isinstance(value, str) and not value.strip())


def _coerce(name: str, value: Any) -> Any:
    """Turn a table cell into the type of field ``name``; SpecError names bad values."""
    if name in _INT_FIELDS:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise SpecError(f"{name}={value!r} is not a whole number") from None
        if not number.is_integer():
            raise SpecError(f"{name}={value!r} is not a whole number")
        return int(number)
    if name in _BOOL_FIELDS:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise SpecError(f"{name}={value!r} is not a boolean; use true/false")
    return str(value).strip() if isinstance(value, str) else value


def _fields(row: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {n: _coerce(n, row[n]) for n in names if n in row and _present(row[n])}


def _validate(cls: type[Any], fields: dict[str, Any], where: str) -> Any:
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


def parse_run_row(row: Mapping[str, Any]) -> RunConfig:
    """Build and check the specs of one run-table row.

    Raises:
        SpecError: naming the field, the value and what is allowed.
    """
    model_fields = _fields(row, MODEL_FIELDS)
    if "model" in row and _present(row["model"]):
        base = ModelSpec.load(str(row["model"]).strip())
        model = _validate(ModelSpec, {**base.model_dump(), **model_fields}, "model")
    else:
        missing = [f for f in ("num_layers", "hidden_size", "num_heads", "vocab_size") if f not in model_fields]
        if missing:
            raise SpecError(f"missing model fields {', '.join(missing)}: give them or a `model` preset/config path")
        model = _validate(ModelSpec, model_fields, "model")

    parallel_fields = _fields(row, PARALLEL_FIELDS)
    parallel_fields.setdefault("global_batch", parallel_fields.get("dp", 1) * parallel_fields.get("micro_batch", 1))
    parallel = _validate(ParallelConfig, parallel_fields, "parallel")

    if "gpu" not in row or not _present(row["gpu"]):
        raise SpecError("missing field gpu: give a catalog id or device name (see `perfcast hardware list`)")
    cluster_fields = _fields(row, ("num_gpus", "gpus_per_node"))
    inter_node = str(row["inter_node"]).strip() if "inter_node" in row and _present(row["inter_node"]) else None
    cluster = ClusterSpec.build(
        str(row["gpu"]).strip(),
        cluster_fields.get("num_gpus", parallel.world_size),
        cluster_fields.get("gpus_per_node"),
        inter_node,
    )
    check_layout(model, parallel, cluster)
    cluster.gpu.peak_tflops(parallel.dtype)  # the GPU must run the dtype (no bf16 on a V100)
    return RunConfig(model=model, parallel=parallel, cluster=cluster)
