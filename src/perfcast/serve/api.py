"""``perfcast serve``: the predictors over HTTP (FastAPI).

Endpoints (the OpenAPI document is at ``/openapi.json``, the interactive one at ``/docs``):

* ``POST /v1/predict/ops``: a batch of op-table rows -> the rows with ``pred_ms``,
  ``pred_lo_ms``, ``pred_hi_ms`` (DESIGN.md "Interfaces").
* ``POST /v1/predict/steps``: a batch of run-table rows -> the rows with ``step_ms``,
  its interval, memory, MFU and tokens/s.
* ``POST /v1/search``: the layouts of a model on a cluster, ranked by predicted step
  time (or cost per step with a price per GPU-hour).
* ``GET /v1/hardware``, ``GET /v1/models``: the hardware catalog and the model presets;
  ``GET /healthz``: liveness and the predictors in use.

What a request may do is bounded by :class:`ServiceLimits`: a body over
``max_body_bytes`` is refused with 413 before it is parsed; more than ``max_rows`` rows
or a search of more than ``max_search_layouts`` layouts is a 422. A run row's ``model`` is
a preset id, a config given inline as a JSON object, or a file inside one of the
operator's ``model_dirs``: the service opens no other path a request names, and its
errors never quote a file. A body that does not parse (a field of the wrong type, a request
field out of range, a coverage outside (0, 1), no rows) gets a 422 whose ``detail`` names
each field and row, without echoing the input. A row that parses but is not a valid op or
config (a row value out of its range included) is answered with its reason in ``error``
while the other rows are predicted. Input fields that are output names are dropped, with a
note in ``warnings``, and so is a count of the steps on their MFU ceiling (``at_mfu_ceiling``).

Stored calibrations (``perfcast calibrate``) are read when the service starts and applied
unless a request says ``"calibration": false``; each row names the one applied.

Parsing and prediction run in a small thread pool (``prediction_threads``), off the event
loop, so ``/healthz`` and small requests stay fast while large batches are predicted.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

import anyio
import pandas as pd
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from perfcast import __version__
from perfcast.data.schema import FIELD_MAX, FIELD_MIN_ZERO
from perfcast.data.tables import ERROR_COLUMN
from perfcast.errors import PerfcastError
from perfcast.features.model_source import ModelSource
from perfcast.features.run_config import DEFAULTED_COLUMN, RUN_BOOL_FIELDS, RUN_INPUT_FIELDS, RUN_INT_FIELDS
from perfcast.models.physics_bounds import AT_CEILING_COLUMN
from perfcast.models.predictor_protocol import OpPredictor, StepTimePredictor
from perfcast.serve.batch import (
    DEFAULT_COVERAGE,
    OP_OUTPUT_NAMES,
    STEP_OUTPUT_NAMES,
    ceiling_note,
    predict_ops_table,
    predict_steps_table,
)
from perfcast.serve.predictors import load_op_predictor, load_step_predictor, with_calibrations
from perfcast.serve.service_limits import ServiceLimits

NOT_JSON = "the body is not valid JSON (NaN, Infinity and numbers beyond float range are not JSON)"
MAX_ERRORS_SHOWN = 20
"""Most field errors one 422 lists."""


_Scalar = str | int | float | bool | None
"""What an extra (pass-through) field of a row may hold."""


def _size(name: str, description: str | None = None) -> Any:
    """An optional whole-number field of a table row, its range stated in the schema but not enforced there.

    A value outside its table range (:data:`FIELD_MAX`) reaches the table's parser, which gives
    that row its own error and answers the others, as the CLI does; a 422 would lose the batch.
    """
    lowest = 0 if name in FIELD_MIN_ZERO else 1
    allowed = f"allowed: {lowest}..{FIELD_MAX[name]}"
    return Field(None, description=f"{description}; {allowed}" if description else allowed)


def _ranged(name: str) -> Any:
    """An optional whole-number field of a request (not a row) within its table range: a 422 outside it."""
    return Field(None, ge=0 if name in FIELD_MIN_ZERO else 1, le=FIELD_MAX[name])


class OpRow(BaseModel):
    """One op-table row (DESIGN.md "Interfaces"); other scalar fields are passed through."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, _Scalar]

    op: str = Field(..., max_length=64, description="matmul, bmm, linear, softmax, ..., allreduce, sendrecv")
    gpu: str = Field(..., max_length=200, description="Catalog id or device name, e.g. h100-sxm5-80gb")
    dtype: str | None = Field(None, max_length=32, description="fp32, tf32, fp16, bf16 or fp8 (default bf16)")
    batch: int | None = _size("batch")
    m: int | None = _size("m")
    n: int | None = _size("n")
    k: int | None = _size("k")
    rows: int | None = _size("rows")
    cols: int | None = _size("cols")
    scalar: bool | None = None
    heads: int | None = _size("heads")
    kv_heads: int | None = _size("kv_heads")
    seq_q: int | None = _size("seq_q")
    seq_kv: int | None = _size("seq_kv")
    head_dim: int | None = _size("head_dim")
    causal: bool | None = None
    backward: bool | None = None
    bytes: int | None = _size("bytes", "Collective payload, bytes")
    n_ranks: int | None = _size("n_ranks")
    ranks_per_node: int | None = _size("ranks_per_node")
    inter_node: str | None = Field(None, max_length=200, description="Fabric between nodes (catalog id)")
    nvlink_bridged: bool | None = Field(None, description="PCIe cards joined in pairs by NVLink bridges")


_RUN_FIELD_DOCS = {
    "model": "Preset id (GET /v1/models), a config as a JSON object (perfcast fields or a Hugging Face "
    "config.json), or a config file in a folder the operator allowed",
    "gpu": "Catalog id or device name",
    "recompute": "none, selective, op-sac or full",
    "finetune": "full, sft or lora",
    "document_tokens": "Attention length of sequences packed from several documents with a per-document mask "
    "(empty: the whole sequence)",
    "framework": "megatron-core, megatron-deepspeed, torchtitan, pytorch-fsdp or deepspeed",
    "nvlink_domain": "GPUs of one NVLink domain (72 on NVL72 racks)",
    "defaulted_fields": "Names of inputs a reader filled by default (kept, with the parser's added)",
}


class _RunRowBase(BaseModel):
    """One run-table row (DESIGN.md "Interfaces"); other scalar fields are passed through."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, _Scalar]


def _run_row_field(name: str) -> tuple[Any, Any]:
    """The type and Field of run-row input ``name``, from the parser's own lists."""
    doc = _RUN_FIELD_DOCS.get(name)
    if name == "model":
        return Annotated[str, Field(max_length=4096)] | dict[str, Any] | None, Field(None, description=doc)
    if name == "gpu":
        return str, Field(..., max_length=200, description=doc)
    if name in RUN_INT_FIELDS:
        return int | None, _size(name, doc)
    if name in RUN_BOOL_FIELDS:
        return bool | None, Field(None, description=doc)
    return str | None, Field(None, max_length=4096 if name == DEFAULTED_COLUMN else 200, description=doc)


RunRow = create_model("RunRow", __base__=_RunRowBase, **{name: _run_row_field(name) for name in RUN_INPUT_FIELDS})  # type: ignore[call-overload]


_Price = Annotated[float, Field(gt=0, allow_inf_nan=False)]
"""A price in USD per GPU-hour."""
_Coverage = Field(DEFAULT_COVERAGE, gt=0.0, lt=1.0, allow_inf_nan=False)


class OpsRequest(BaseModel):
    """A batch of op rows and the interval's nominal coverage."""

    rows: list[OpRow] = Field(..., min_length=1)
    coverage: float = _Coverage
    calibration: bool = Field(True, description="Apply the service's stored corrections (perfcast calibrate)")


class StepsRequest(BaseModel):
    """A batch of run rows; ``breakdown`` adds where the step time goes."""

    rows: list[RunRow] = Field(..., min_length=1)
    coverage: float = _Coverage
    breakdown: bool = False
    calibration: bool = Field(True, description="Apply the service's stored corrections (perfcast calibrate steps)")


class SearchRequest(BaseModel):
    """A layout search: a model on ``num_gpus`` GPUs of each type in ``gpus``; an unknown field is refused."""

    model_config = ConfigDict(extra="forbid")

    model: Annotated[str, Field(max_length=4096)] | dict[str, Any] = Field(
        ..., description="Preset id, an inline config, or an allowed config file"
    )
    gpus: list[str] = Field(..., min_length=1, max_length=16, description="GPU types to compare")
    num_gpus: int = Field(..., ge=1, le=FIELD_MAX["num_gpus"])
    global_batch: int = Field(..., ge=1, le=FIELD_MAX["global_batch"], description="Sequences per step")
    seq_len: int | None = _ranged("seq_len")
    gpus_per_node: int | None = _ranged("gpus_per_node")
    inter_node: str | None = Field(None, max_length=200)
    dtype: str = Field("bf16", max_length=32)
    finetune: str = Field("full", max_length=32, description="full (pre-training), sft or lora")
    lora_rank: int = Field(0, ge=0, le=FIELD_MAX["lora_rank"], description="LoRA adapter rank (0: the default, 16)")
    document_tokens: int | None = Field(
        None, ge=1, le=FIELD_MAX["document_tokens"], description="Attention length of packed documents"
    )
    framework: str | None = Field(
        None, max_length=64, description="Training framework (megatron-core, torchtitan, pytorch-fsdp ...): its "
        "overlaps and ZeRO stages; none: nothing overlapped"
    )
    price_per_gpu_hour: _Price | Annotated[list[_Price], Field(min_length=1, max_length=16)] | None = Field(
        None, description="USD per GPU-hour, one for all GPUs or one per entry of gpus; ranks by cost per step"
    )
    coverage: float = _Coverage
    calibration: bool = Field(True, description="Apply the service's stored corrections (perfcast calibrate steps)")
    top: int = Field(20, ge=1, le=10_000, description="Layouts returned, best first")


class SearchResponse(BaseModel):
    """The best layouts, and how many were enumerated and dropped for memory."""

    predictor: str
    n_layouts: int
    n_out_of_memory: int
    n_ranked: int
    skipped_gpus: list[str] = Field(default_factory=list, description="GPU types left out: they lack the dtype")
    layouts: list[dict[str, Any]]


class PredictionResponse(BaseModel):
    """The rows, in request order, with predictions and an ``error`` per row ("" when valid)."""

    predictor: str
    coverage: float
    n_errors: int
    warnings: list[str] = []
    rows: list[dict[str, Any]]


class RequestRefused(Exception):
    """A request the service will not process: its HTTP status and a JSON-ready ``detail``."""

    def __init__(self, status: int, detail: Any) -> None:
        super().__init__(status, detail)
        self.status = status
        self.detail = detail


def _json_value(value: Any) -> Any:
    if value is None or value is pd.NA:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):  # numpy scalars
        return _json_value(value.item())
    return value


def _field_errors(exc: ValidationError, prefix: tuple[str, ...] = ("body",)) -> list[dict[str, Any]]:
    """Pydantic's errors as ``{loc, msg, type}``, without the input they quote."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    return [{"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]} for e in errors[:MAX_ERRORS_SHOWN]]


def _refuse_constant(name: str) -> float:
    """``json.loads`` hook: NaN and Infinity are not JSON (Python's reader would accept them)."""
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    """``json.loads`` hook: a number that overflows a float (``1e999``) is refused, not read as inf."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} overflows a float")
    return value


def _parse(raw: bytes, schema: type[BaseModel]) -> BaseModel:
    """The request body as ``schema``; RequestRefused(422) names each bad field and row."""
    try:
        data = json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
    except (ValueError, RecursionError):
        raise RequestRefused(422, [{"loc": ["body"], "msg": NOT_JSON, "type": "json_invalid"}]) from None
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise RequestRefused(422, _field_errors(exc)) from None
    except RecursionError:  # nesting deeper than the validator follows
        raise RequestRefused(
            422, [{"loc": ["body"], "msg": "the body is nested too deeply", "type": "too_deep"}]
        ) from None


def _table(rows: list[BaseModel], outputs: frozenset[str]) -> tuple[list[dict[str, Any]], pd.DataFrame, list[str]]:
    """The rows as sent (less output fields), as a frame, and a note naming dropped output fields."""
    given = [r.model_dump(exclude_none=True) for r in rows]
    dropped = sorted({k for g in given for k in g if k in outputs})
    if dropped:
        given = [{k: v for k, v in g.items() if k not in outputs} for g in given]
    frame = pd.DataFrame(given, index=range(len(given)))
    notes = [f"input fields {', '.join(dropped)} are prediction outputs: ignored and predicted anew"] if dropped else []
    return given, frame, notes


def _records(given: list[dict[str, Any]], frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Each request row as sent, followed by the columns prediction added (NaN as null)."""
    sent = set().union(*given) - {DEFAULTED_COLUMN}  # a row's defaulted names come back with the parser's added
    added = [c for c in frame.columns if c not in sent]
    out = frame[added].to_dict(orient="records")
    return [{**g, **{k: _json_value(v) for k, v in a.items()}} for g, a in zip(given, out, strict=True)]


def _prediction_response(
    predictor: OpPredictor | StepTimePredictor,
    coverage: float,
    given: list[dict[str, Any]],
    out: pd.DataFrame,
    notes: list[str],
) -> Response:
    """A :class:`PredictionResponse` of the predicted table ``out`` for the rows ``given``."""
    return _json_response({
        "predictor": predictor.name, "coverage": coverage, "n_errors": int((out[ERROR_COLUMN] != "").sum()),
        "warnings": notes, "rows": _records(given, out),
    })  # fmt: skip


def _json_response(content: Any) -> Response:
    return Response(json.dumps(content, allow_nan=False).encode(), media_type="application/json")


def _refused(exc: RequestRefused) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, status_code=exc.status)


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed ``limit`` bytes."""
    too_large = RequestRefused(
        413, f"the request body exceeds {limit} bytes; split the batch, or predict a file with `perfcast predict`"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def _request_body_doc(schema: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI ``requestBody`` of a route that parses ``schema`` itself."""
    ref = {"$ref": f"#/components/schemas/{schema.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def create_app(*, model: str | None = None, limits: ServiceLimits | None = None) -> FastAPI:
    """The service, with the op and step predictors of ``model`` loaded once.

    Args:
        model: ``analytic``, a bundle folder or an MLflow URI (as ``--model``); None is
            the shipped default bundle.
        limits: what one request may ask (default :class:`ServiceLimits`).
    """
    limits = limits or ServiceLimits()
    bare = {"ops": load_op_predictor(model), "steps": load_step_predictor(model)}
    calibrated = {kind: with_calibrations(predictor, kind) for kind, predictor in bare.items()}
    op_predictor, step_predictor = calibrated["ops"], calibrated["steps"]
    model_source = ModelSource.restricted_to(limits.model_dirs)
    workers = anyio.CapacityLimiter(limits.prediction_threads)
    app = FastAPI(
        title="perfcast",
        version=__version__,
        description="Predict op and training-step times of deep-learning workloads, with intervals.",
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()[:MAX_ERRORS_SHOWN]]  # fmt: skip
        return JSONResponse({"detail": errors}, status_code=422)

    async def answer(request: Request, work: Any) -> Response:
        """Read the body within the limit, then parse and predict it in the worker pool."""
        try:
            raw = await _read_body(request, limits.max_body_bytes)
            return await anyio.to_thread.run_sync(work, raw, limiter=workers)
        except RequestRefused as exc:
            return _refused(exc)

    def check_rows(n: int) -> None:
        if n > limits.max_rows:
            detail = f"{n} rows exceed this service's limit of {limits.max_rows} per request; split the batch"
            raise RequestRefused(422, [{"loc": ["body", "rows"], "msg": detail, "type": "too_long"}])

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness, the package version and the predictors in use (answered on the event loop)."""
        return {
            "status": "ok",
            "version": __version__,
            "op_predictor": op_predictor.name,
            "step_predictor": step_predictor.name,
        }

    @app.get("/v1/hardware")
    def hardware() -> list[dict[str, Any]]:
        """Every catalog accelerator with its datasheet figures."""
        from perfcast.features.hardware_spec import list_hardware

        return [{k: _json_value(v) for k, v in hw.model_dump().items()} for hw in list_hardware()]

    @app.get("/v1/models")
    def models() -> list[str]:
        """The model presets a run row's ``model`` may name."""
        from perfcast.features.model import list_models

        return list_models()

    def ops_work(raw: bytes) -> Response:
        request = _parse(raw, OpsRequest)
        check_rows(len(request.rows))
        given, frame, notes = _table(request.rows, OP_OUTPUT_NAMES)
        predictor = (calibrated if request.calibration else bare)["ops"]
        out = predict_ops_table(frame, predictor=predictor, coverage=request.coverage)
        return _prediction_response(predictor, request.coverage, given, out, notes)

    def steps_work(raw: bytes) -> Response:
        request = _parse(raw, StepsRequest)
        check_rows(len(request.rows))
        given, frame, notes = _table(request.rows, STEP_OUTPUT_NAMES)
        predictor = (calibrated if request.calibration else bare)["steps"]
        out = predict_steps_table(frame, predictor=predictor, coverage=request.coverage,
                                  breakdown=request.breakdown, model_source=model_source)  # fmt: skip
        capped = ceiling_note(out[AT_CEILING_COLUMN])
        return _prediction_response(predictor, request.coverage, given, out, [*notes, *([capped] if capped else [])])

    def search_work(raw: bytes) -> Response:
        from perfcast.data.schema import DType
        from perfcast.serve.search import search_layouts

        request = _parse(raw, SearchRequest)
        predictor = (calibrated if request.calibration else bare)["steps"]
        try:
            result = search_layouts(
                request.model, request.gpus, request.num_gpus, request.global_batch, predictor=predictor,
                gpus_per_node=request.gpus_per_node, inter_node=request.inter_node, seq_len=request.seq_len,
                dtype=DType.parse(request.dtype), finetune=request.finetune, lora_rank=request.lora_rank,
                document_tokens=request.document_tokens, framework=request.framework,
                price_per_gpu_hour=request.price_per_gpu_hour,
                coverage=request.coverage, model_source=model_source, max_layouts=limits.max_search_layouts,
            )  # fmt: skip
        except PerfcastError as exc:
            raise RequestRefused(422, str(exc)) from None
        top = result.ranked.head(request.top)
        return _json_response({
            "predictor": predictor.name, "n_layouts": result.n_layouts,
            "n_out_of_memory": result.n_out_of_memory, "n_ranked": len(result.ranked),
            "skipped_gpus": list(result.skipped_gpus),
            "layouts": [{k: _json_value(v) for k, v in row.items()} for row in top.to_dict("records")],
        })  # fmt: skip

    @app.post("/v1/predict/ops", response_model=PredictionResponse, openapi_extra=_request_body_doc(OpsRequest))
    async def predict_ops(request: Request) -> Response:
        """Predict a batch of op-table rows (:class:`OpsRequest`)."""
        return await answer(request, ops_work)

    @app.post("/v1/predict/steps", response_model=PredictionResponse, openapi_extra=_request_body_doc(StepsRequest))
    async def predict_steps(request: Request) -> Response:
        """Predict a batch of run-table rows (:class:`StepsRequest`)."""
        return await answer(request, steps_work)

    @app.post("/v1/search", response_model=SearchResponse, openapi_extra=_request_body_doc(SearchRequest))
    async def search(request: Request) -> Response:
        """Rank the layouts that fit in memory by predicted step time, or cost with a price (:class:`SearchRequest`)."""
        return await answer(request, search_work)

    def openapi() -> dict[str, Any]:
        """The generated document, with the request schemas the predict routes parse themselves."""
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for schema in (OpsRequest, StepsRequest, SearchRequest):
                found = schema.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(found.pop("$defs", {}))
                schemas[schema.__name__] = found
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
