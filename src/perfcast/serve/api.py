"""``perfcast serve``: the predictors over HTTP (FastAPI).

Endpoints (the OpenAPI document is at ``/openapi.json``, the interactive one at ``/docs``):

* ``POST /v1/predict/ops``: a batch of op-table rows -> the rows with ``pred_ms``,
  ``pred_lo_ms``, ``pred_hi_ms`` (DESIGN.md "Interfaces").
* ``POST /v1/predict/steps``: a batch of run-table rows -> the rows with ``step_ms``,
  its interval, memory, MFU and tokens/s.
* ``POST /v1/search``: the layouts of a model on a cluster, ranked by predicted step
  time (or cost per step with a price per GPU-hour).
* ``GET /v1/hardware``: the hardware catalog; ``GET /healthz``: liveness and the
  predictors in use.

The predictors load once, when the app is created. A body that does not parse (a field of
the wrong type, a coverage outside (0, 1), no rows) gets a 422 whose ``detail`` names the
field. A row that parses but is not a valid op or config (tp does not divide the heads,
an unknown GPU) is answered with its reason in ``error`` while the other rows of the
batch are predicted: one bad row does not cost the batch.
"""

from __future__ import annotations

import math
from importlib.metadata import version
from typing import Any

import pandas as pd
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from perfcast.errors import PerfcastError
from perfcast.serve.batch import DEFAULT_COVERAGE, predict_ops_table, predict_steps_table
from perfcast.serve.predictors import load_op_predictor, load_step_predictor

__version__ = version("perfcast")
MAX_ROWS = 100_000
"""Rows one request may carry; larger sweeps belong to ``perfcast predict`` on a file."""


class OpRow(BaseModel):
    """One op-table row (DESIGN.md "Interfaces"); other fields are passed through."""

    model_config = ConfigDict(extra="allow")

    op: str = Field(..., description="matmul, bmm, linear, softmax, layernorm, ..., allreduce, sendrecv")
    gpu: str = Field(..., description="Catalog id or device name, e.g. h100-sxm5-80gb")
    dtype: str | None = Field(None, description="fp32, tf32, fp16, bf16 or fp8 (default bf16)")
    batch: int | None = Field(None, ge=1)
    m: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1)
    k: int | None = Field(None, ge=1)
    rows: int | None = Field(None, ge=1)
    cols: int | None = Field(None, ge=1)
    scalar: bool | None = None
    heads: int | None = Field(None, ge=1)
    kv_heads: int | None = Field(None, ge=1)
    seq_q: int | None = Field(None, ge=1)
    seq_kv: int | None = Field(None, ge=1)
    head_dim: int | None = Field(None, ge=1)
    causal: bool | None = None
    bytes: float | None = Field(None, gt=0, description="Collective payload, bytes")
    n_ranks: int | None = Field(None, ge=1)
    ranks_per_node: int | None = Field(None, ge=1)
    nvlink_bridged: bool | None = Field(None, description="PCIe cards joined in pairs by NVLink bridges")


class RunRow(BaseModel):
    """One run-table row (DESIGN.md "Interfaces"); other fields are passed through."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="Preset id (`perfcast models list`) or a server-side config.json")
    num_layers: int | None = Field(None, ge=1)
    hidden_size: int | None = Field(None, ge=1)
    num_heads: int | None = Field(None, ge=1)
    num_kv_heads: int | None = Field(None, ge=1)
    ffn_hidden_size: int | None = Field(None, ge=1)
    vocab_size: int | None = Field(None, ge=1)
    seq_len: int | None = Field(None, ge=1)
    num_experts: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=1)
    tp: int | None = Field(None, ge=1)
    pp: int | None = Field(None, ge=1)
    dp: int | None = Field(None, ge=1)
    cp: int | None = Field(None, ge=1)
    ep: int | None = Field(None, ge=1)
    micro_batch: int | None = Field(None, ge=1)
    global_batch: int | None = Field(None, ge=1)
    vpp: int | None = Field(None, ge=1)
    sequence_parallel: bool | None = None
    zero_stage: int | None = Field(None, ge=0, le=3)
    recompute: str | None = Field(None, description="none, selective or full")
    finetune: str | None = Field(None, description="full or lora")
    lora_rank: int | None = Field(None, ge=0)
    dtype: str | None = None
    flash_attention: bool | None = None
    overlap_grad_reduce: bool | None = Field(None, description="Data-parallel sync overlapped with the last backward")
    gpu: str = Field(..., description="Catalog id or device name")
    num_gpus: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)
    inter_node: str | None = None


class OpsRequest(BaseModel):
    """A batch of op rows and the interval's nominal coverage."""

    rows: list[OpRow] = Field(..., min_length=1, max_length=MAX_ROWS)
    coverage: float = Field(DEFAULT_COVERAGE, gt=0.0, lt=1.0)


class StepsRequest(BaseModel):
    """A batch of run rows; ``breakdown`` adds where the step time goes."""

    rows: list[RunRow] = Field(..., min_length=1, max_length=MAX_ROWS)
    coverage: float = Field(DEFAULT_COVERAGE, gt=0.0, lt=1.0)
    breakdown: bool = False


class SearchRequest(BaseModel):
    """A layout search: a model on ``num_gpus`` GPUs of each type in ``gpus``."""

    model: str = Field(..., description="Preset id or a server-side config.json")
    gpus: list[str] = Field(..., min_length=1, max_length=16, description="GPU types to compare")
    num_gpus: int = Field(..., ge=1)
    global_batch: int = Field(..., ge=1, description="Sequences per step")
    seq_len: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=1)
    inter_node: str | None = None
    dtype: str = "bf16"
    price_per_gpu_hour: float | None = Field(None, gt=0, description="USD; ranks by cost per step")
    coverage: float = Field(DEFAULT_COVERAGE, gt=0.0, lt=1.0)
    top: int = Field(20, ge=1, le=10_000, description="Layouts returned, best first")


class SearchResponse(BaseModel):
    """The best layouts, and how many were enumerated and dropped for memory."""

    predictor: str
    n_layouts: int
    n_out_of_memory: int
    n_ranked: int
    layouts: list[dict[str, Any]]


class PredictionResponse(BaseModel):
    """The rows, in request order, with predictions and an ``error`` per row ("" when valid)."""

    predictor: str
    coverage: float
    n_errors: int
    rows: list[dict[str, Any]]


def _json_value(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _json_value(value.item())
    return value


def _records(rows: list[BaseModel], frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each request row as sent, followed by the columns prediction added (NaN as null)."""
    given = [r.model_dump(exclude_none=True) for r in rows]
    added = [c for c in frame.columns if c not in set().union(*given)]
    out = frame[added].to_dict(orient="records")
    return [{**g, **{k: _json_value(v) for k, v in a.items()}} for g, a in zip(given, out, strict=True)]


def _frame(rows: list[BaseModel]) -> pd.DataFrame:
    return pd.DataFrame([r.model_dump(exclude_none=True) for r in rows])


def create_app(*, model: str | None = None) -> FastAPI:
    """The service, with the op and step predictors of ``model`` loaded once.

    Args:
        model: ``analytic``, a bundle folder or an MLflow URI (as ``--model``); None is
            the shipped default bundle.
    """
    op_predictor = load_op_predictor(model)
    step_predictor = load_step_predictor(model)
    app = FastAPI(
        title="perfcast",
        version=__version__,
        description="Predict op and training-step times of deep-learning workloads, with intervals.",
    )

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        """Liveness, the package version and the predictors in use."""
        return {
            "status": "ok",
            "version": __version__,
            "op_predictor": op_predictor.name,
            "step_predictor": step_predictor.name,
        }

    @app.get("/v1/hardware")
    def hardware() -> list[dict[str, Any]]:
        """Every catalog accelerator with its datasheet figures."""
        from perfcast.features.hardware import list_hardware

        return [{k: _json_value(v) for k, v in hw.model_dump().items()} for hw in list_hardware()]

    @app.post("/v1/predict/ops")
    def predict_ops(request: OpsRequest) -> PredictionResponse:
        """Predict a batch of op-table rows."""
        out = predict_ops_table(_frame(request.rows), predictor=op_predictor, coverage=request.coverage)
        return PredictionResponse(
            predictor=op_predictor.name,
            coverage=request.coverage,
            n_errors=int((out["error"] != "").sum()),
            rows=_records(request.rows, out),
        )

    @app.post("/v1/predict/steps")
    def predict_steps(request: StepsRequest) -> PredictionResponse:
        """Predict a batch of run-table rows."""
        out = predict_steps_table(
            _frame(request.rows), predictor=step_predictor, coverage=request.coverage, breakdown=request.breakdown
        )
        return PredictionResponse(
            predictor=step_predictor.name,
            coverage=request.coverage,
            n_errors=int((out["error"] != "").sum()),
            rows=_records(request.rows, out),
        )

    @app.post("/v1/search")
    def search(request: SearchRequest) -> SearchResponse:
        """Rank the layouts that fit in memory by predicted step time (or cost with a price)."""
        from perfcast.data.schema import DType
        from perfcast.serve.search import search_layouts

        try:
            result = search_layouts(
                request.model, request.gpus, request.num_gpus, request.global_batch, predictor=step_predictor,
                gpus_per_node=request.gpus_per_node, inter_node=request.inter_node, seq_len=request.seq_len,
                dtype=DType.parse(request.dtype), price_per_gpu_hour=request.price_per_gpu_hour,
                coverage=request.coverage,
            )  # fmt: skip
        except PerfcastError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from None
        top = result.ranked.head(request.top)
        return SearchResponse(
            predictor=step_predictor.name,
            n_layouts=result.n_layouts,
            n_out_of_memory=result.n_out_of_memory,
            n_ranked=len(result.ranked),
            layouts=[{k: _json_value(v) for k, v in row.items()} for row in top.to_dict("records")],
        )

    return app
