"""Property-based fuzzing of the front doors: batch prediction of run and op tables, and the
HTTP service (predict steps, predict ops, search, raw bodies).

Tables and bodies mix valid rows with rows whose cells are drawn from hostile values
(huge, negative and fractional numbers, NaN and inf, text, booleans, nulls, unknown GPUs,
ops and dtypes, output column names used as inputs, nested JSON). The properties:

* nothing raises (batch) and nothing is a 5xx (HTTP: only 200, 413 or 422);
* every row is answered, in order;
* a row with an empty ``error`` has a positive finite time inside its interval, and a
  row known to be bad has a non-empty reason;
* a 422 never quotes a planted value (:data:`MARKER`);
* a valid row gets the same prediction in a hostile batch as alone.

Most examples use the analytic predictors (fast); fewer use the shipped default ones.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

with warnings.catch_warnings():  # starlette's test client warns about its httpx backend
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from perfcast.data.tables import ERROR_COLUMN
from perfcast.models import analytic
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.api import ServiceLimits, create_app
from perfcast.serve.batch import predict_ops_table, predict_steps_table

MARKER = "zq7PLANTEDq7z"
"""A distinctive value planted in inputs: a 422 must never echo it."""

SCALE = float(os.environ.get("PERFCAST_FUZZ_SCALE", "1"))
"""Multiplies every example count: ``PERFCAST_FUZZ_SCALE=20`` for a longer hunt than CI's."""


def _examples(n: int) -> settings:
    return settings(max_examples=max(1, round(n * SCALE)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow], database=None)  # fmt: skip


FAST = _examples(120)
FEW = _examples(20)

VALID_RUNS: tuple[dict[str, Any], ...] = (
    {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "gpu": "h100-sxm5-80gb", "num_gpus": 8},
    {"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "dp": 2, "micro_batch": 2, "global_batch": 8},
    {"model": "gpt3-125m", "gpu": "a100-sxm4-80gb", "dp": 2, "micro_batch": 2, "global_batch": 8},
    {"model": "llama2-7b", "tp": 2, "sequence_parallel": True, "dp": 2, "global_batch": 8, "gpu": "h100",
     "num_gpus": 4},
    {"num_layers": 4, "hidden_size": 512, "num_heads": 8, "vocab_size": 32000, "seq_len": 1024, "gpu": "h100",
     "dtype": "bf16"},
)  # fmt: skip
VALID_OPS: tuple[dict[str, Any], ...] = (
    {"op": "matmul", "m": 1024, "n": 1024, "k": 1024, "gpu": "h100-sxm5-80gb", "dtype": "bf16"},
    {"op": "layernorm", "rows": 8192, "cols": 4096, "dtype": "bf16", "gpu": "a100-sxm4-80gb"},
    {"op": "allreduce", "bytes": 1 << 28, "n_ranks": 16, "ranks_per_node": 8, "gpu": "h100"},
    {"op": "attention", "batch": 1, "heads": 8, "seq_q": 128, "seq_kv": 128, "head_dim": 64, "causal": True,
     "gpu": "h100", "dtype": "bf16"},
    {"op": "bmm", "batch": 4, "m": 256, "n": 512, "k": 128, "gpu": "a100-sxm4-80gb", "dtype": "fp16"},
)  # fmt: skip

RUN_INT_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                  "seq_len", "num_experts", "top_k", "tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch",
                  "vpp", "lora_rank", "num_gpus", "gpus_per_node", "zero_stage")  # fmt: skip
RUN_FLAG_FIELDS = ("gated_mlp", "sequence_parallel", "flash_attention", "overlap_grad_reduce")
RUN_TEXT_FIELDS = ("model", "gpu", "dtype", "recompute", "finetune", "inter_node", "framework", "activation")
STEP_OUTPUTS = ("step_ms", "step_lo_ms", "error", "out_of_domain", "pred_ms", "mfu", "fits_memory",
                "defaulted_fields", "calibration", "compute_ms")  # fmt: skip
OP_INT_FIELDS = ("batch", "m", "n", "k", "rows", "cols", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim",
                 "bytes", "n_ranks", "ranks_per_node")  # fmt: skip
OP_FLAG_FIELDS = ("scalar", "causal", "backward", "nvlink_bridged")
OP_TEXT_FIELDS = ("op", "gpu", "dtype", "inter_node")
OP_OUTPUTS = ("pred_ms", "pred_lo_ms", "pred_hi_ms", "error", "out_of_domain", "calibration", "step_ms")
EXTRA_FIELDS = ("tag", "note", "measured_ms", "measured_step_ms", "0", "")

HUGE_INTS = (0, -1, -(2**63), 2**31, 2**53 + 1, 2**62, 2**63, 2**64 + 1, 10**30, 10**400)
ODD_FLOATS = (math.nan, math.inf, -math.inf, 1e300, -1e300, 1e-300, 0.5, 2.5, -0.0, 4.0, 1e15)
TEXTS = ("abc", "", " ", MARKER, f" {MARKER} ", "12", "1e3", "nan", "inf", "-1", "true", "None", "ü🙂",
         MARKER * 20, f"{MARKER}\x00", "../../etc/passwd")  # fmt: skip
UNKNOWN = ("rtx-9090", f"gpu-{MARKER}", "conv2d", "fp64", "int8", "h100 but not", "llama-99t")

nasty_scalar = st.one_of(
    st.sampled_from(HUGE_INTS),
    st.sampled_from(ODD_FLOATS),
    st.sampled_from(TEXTS + UNKNOWN),
    st.booleans(),
    st.none(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
"""A cell a hostile or careless caller might send."""
plausible_int = st.one_of(st.sampled_from((1, 2, 3, 4, 7, 8, 16, 64, 4096)), st.integers(1, 100_000))
"""Whole numbers of the right type that may still make a config invalid (tp=3 on 32 heads ...)."""
sure_bad_int = st.sampled_from((-1, -(2**63), 2**62, 10**30, 0.5, 1e300, "abc", MARKER, math.inf))
"""Values no whole-number field accepts."""
sure_bad_text = {
    "gpu": st.sampled_from(("rtx-9090", f"gpu-{MARKER}", "abc")),
    "dtype": st.sampled_from(("fp64", "int8", MARKER)),
    "op": st.sampled_from(("conv2d", "abc", MARKER)),
    # a missing config file (an unknown name beside a complete shape is only a label)
    "model": st.sampled_from(("missing/llama-99t.json", f"nope/{MARKER}.json")),
}


def _mutations(ints: tuple[str, ...], flags: tuple[str, ...], texts: tuple[str, ...], outputs: tuple[str, ...]):
    """(field, value) pairs: a hostile, plausible or output-named cell, or a pass-through one."""
    cell = st.one_of(nasty_scalar, plausible_int)
    return st.one_of(
        st.tuples(st.sampled_from(ints), cell),
        st.tuples(st.sampled_from(flags), st.one_of(nasty_scalar, st.sampled_from(("yes", "no", 0, 1)))),
        st.tuples(st.sampled_from(texts), st.one_of(nasty_scalar, st.sampled_from(UNKNOWN))),
        st.tuples(st.sampled_from(outputs), nasty_scalar),
        st.tuples(st.sampled_from(EXTRA_FIELDS), nasty_scalar),
    )


@st.composite
def _row(draw, valid: tuple[dict, ...], mutation, sure_bad_fields: dict) -> tuple[dict, int | None, bool]:
    """A row, the index of the valid row it is verbatim (else None), and whether it is surely bad."""
    base = draw(st.integers(0, len(valid) - 1))
    kind = draw(st.sampled_from(("valid", "mutated", "bad", "dropped")))
    row = dict(valid[base])
    if kind == "valid":
        return row, base, False
    if kind == "bad":
        field, value = draw(st.sampled_from(sorted(sure_bad_fields))), None
        value = draw(sure_bad_fields[field])
        row[field] = value
        return row, None, True
    if kind == "dropped":
        for key in draw(st.lists(st.sampled_from(sorted(row)), max_size=3)):
            row.pop(key, None)
    for key, value in draw(st.lists(mutation, min_size=1, max_size=4)):
        row[key] = value
    return row, None, False


_run_bad_fields = {**{f: sure_bad_int for f in ("tp", "dp", "global_batch", "num_gpus")},
                   "gpu": sure_bad_text["gpu"], "dtype": sure_bad_text["dtype"],
                   "model": sure_bad_text["model"]}  # fmt: skip
_op_bad_fields = {"gpu": sure_bad_text["gpu"], "dtype": sure_bad_text["dtype"], "op": sure_bad_text["op"]}
run_rows = _row(VALID_RUNS, _mutations(RUN_INT_FIELDS, RUN_FLAG_FIELDS, RUN_TEXT_FIELDS, STEP_OUTPUTS),
                _run_bad_fields)  # fmt: skip
op_rows = _row(VALID_OPS, _mutations(OP_INT_FIELDS, OP_FLAG_FIELDS, OP_TEXT_FIELDS, OP_OUTPUTS), _op_bad_fields)
run_batches = st.lists(run_rows, min_size=1, max_size=8)
op_batches = st.lists(op_rows, min_size=1, max_size=8)


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN/None equal to each other."""
    return (_missing(a) and _missing(b)) or a == b


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _check_answer(row: dict, time_col: str, lo_col: str, hi_col: str, surely_bad: bool) -> None:
    """An answered row has a positive finite time within its interval; a bad row a reason and no time."""
    error = row[ERROR_COLUMN]
    assert isinstance(error, str)
    if error == "":
        assert not surely_bad, row
        t = row[time_col]
        assert t is not None and math.isfinite(t) and t > 0, row
        lo, hi = row[lo_col], row[hi_col]
        if lo is not None and not (isinstance(lo, float) and math.isnan(lo)):
            assert lo <= t <= hi, row
    else:
        assert error.strip(), row
        assert row[time_col] is None or math.isnan(row[time_col]), row


# ------------------------------------------------------------------ batch front door


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@functools.cache
def _default_step_predictor():
    from perfcast.serve.predictors import load_step_predictor

    return _quiet(load_step_predictor, None)


@functools.cache
def _default_op_predictor():
    from perfcast.serve.predictors import load_op_predictor

    return _quiet(load_op_predictor, None)


@functools.cache
def _steps_alone(which: str, index: int) -> tuple:
    predictor = StepPredictor.analytic() if which == "analytic" else _default_step_predictor()
    out = _quiet(predict_steps_table, pd.DataFrame([VALID_RUNS[index]]), predictor=predictor)
    assert out[ERROR_COLUMN].iloc[0] == "", out[ERROR_COLUMN].iloc[0]
    return tuple(out[["step_ms", "step_lo_ms", "step_hi_ms", "peak_mem_gib"]].iloc[0])


@functools.cache
def _ops_alone(which: str, index: int) -> tuple:
    predictor = analytic.AnalyticOpPredictor() if which == "analytic" else _default_op_predictor()
    out = _quiet(predict_ops_table, pd.DataFrame([VALID_OPS[index]]), predictor=predictor)
    assert out[ERROR_COLUMN].iloc[0] == "", out[ERROR_COLUMN].iloc[0]
    return tuple(out[["pred_ms", "pred_lo_ms", "pred_hi_ms"]].iloc[0])


def _frame(batch: list[tuple[dict, int | None, bool]]) -> pd.DataFrame:
    return pd.DataFrame([r for r, _, _ in batch], index=[100 + 3 * i for i in range(len(batch))])


def _check_steps_table(batch, which: str) -> None:
    frame = _frame(batch)
    predictor = StepPredictor.analytic() if which == "analytic" else _default_step_predictor()
    out = _quiet(predict_steps_table, frame, predictor=predictor)
    assert list(out.index) == list(frame.index)
    for (_, valid, bad), (_, row) in zip(batch, out.iterrows(), strict=True):
        answer = {k: (None if v is pd.NA else v) for k, v in row.items()}
        _check_answer(answer, "step_ms", "step_lo_ms", "step_hi_ms", bad)
        if valid is not None:
            got = tuple(row[["step_ms", "step_lo_ms", "step_hi_ms", "peak_mem_gib"]])
            assert all(map(_same, got, _steps_alone(which, valid))), (got, _steps_alone(which, valid))


def _check_ops_table(batch, which: str) -> None:
    frame = _frame(batch)
    predictor = analytic.AnalyticOpPredictor() if which == "analytic" else _default_op_predictor()
    out = _quiet(predict_ops_table, frame, predictor=predictor)
    assert list(out.index) == list(frame.index)
    for (_, valid, bad), (_, row) in zip(batch, out.iterrows(), strict=True):
        answer = {k: (None if v is pd.NA else v) for k, v in row.items()}
        _check_answer(answer, "pred_ms", "pred_lo_ms", "pred_hi_ms", bad)
        if valid is not None:
            got = tuple(row[["pred_ms", "pred_lo_ms", "pred_hi_ms"]])
            assert all(map(_same, got, _ops_alone(which, valid))), (got, _ops_alone(which, valid))


@FAST
@given(run_batches)
def test_steps_table_answers_every_row_analytic(batch) -> None:
    _check_steps_table(batch, "analytic")


@FAST
@given(op_batches)
def test_ops_table_answers_every_row_analytic(batch) -> None:
    _check_ops_table(batch, "analytic")


@FEW
@given(run_batches)
def test_steps_table_answers_every_row_default_predictor(batch) -> None:
    _check_steps_table(batch, "default")


@FEW
@given(op_batches)
def test_ops_table_answers_every_row_default_predictor(batch) -> None:
    _check_ops_table(batch, "default")


# ------------------------------------------------------------------ HTTP front door

LIMITS = ServiceLimits(max_body_bytes=12_000, max_rows=10)
"""Small enough that fuzzed bodies also meet the 413 and row-limit paths."""
json_leaf = st.one_of(nasty_scalar.filter(lambda v: not (isinstance(v, float) and not math.isfinite(v))),
                      plausible_int)  # fmt: skip
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)  # fmt: skip
"""JSON values (no NaN: the test client's encoder refuses it; raw bodies carry NaN instead)."""


@pytest.fixture(scope="module")
def analytic_client() -> TestClient:
    return TestClient(create_app(model="analytic", limits=LIMITS))


@pytest.fixture(scope="module")
def default_client() -> TestClient:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TestClient(create_app(limits=LIMITS))


def _http_rows(rows: st.SearchStrategy) -> st.SearchStrategy:
    """Batches of rows as JSON: NaN/inf cells become null, and some rows get a nested extra field."""

    @st.composite
    def build(draw):
        batch = draw(st.lists(rows, min_size=1, max_size=6))
        out = []
        for sent, valid, bad in batch:
            row = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in sent.items()}
            bad = bad and row == sent  # a bad cell that became null may be a default now
            if valid is None and draw(st.integers(0, 5)) == 0:
                row[draw(st.sampled_from(("tag", "nested", "model")))] = draw(json_value)
                bad = False
            out.append((row, valid, bad))
        return out

    return build()


coverages = st.one_of(st.just(0.9), st.sampled_from((0.5, 0.95, 0.0, 1.0, -1, 2, "abc", None, True, MARKER)))


def _post(client: TestClient, path: str, **kwargs) -> Any:
    response = client.post(path, **kwargs)
    assert response.status_code in (200, 413, 422), (response.status_code, response.text[:500])
    if response.status_code != 200:
        detail = response.json()["detail"] if response.status_code == 422 else None
        if not (path == "/v1/search" and isinstance(detail, str)):  # a search's reason quotes it, as a row's does
            assert MARKER not in response.text, response.text[:2000]
        assert "Traceback" not in response.text
    return response


@functools.cache
def _http_alone(client: TestClient, path: str, index: int, coverage: float) -> tuple:
    row = (VALID_RUNS if path.endswith("steps") else VALID_OPS)[index]
    response = client.post(path, json={"rows": [row], "coverage": coverage})
    assert response.status_code == 200, response.text
    answer = response.json()["rows"][0]
    assert answer["error"] == ""
    return tuple(answer.get(c) for c in _TIME_COLUMNS[path])


_TIME_COLUMNS = {"/v1/predict/steps": ("step_ms", "step_lo_ms", "step_hi_ms"),
                 "/v1/predict/ops": ("pred_ms", "pred_lo_ms", "pred_hi_ms")}  # fmt: skip


def _check_http_batch(client: TestClient, path: str, batch, coverage) -> None:
    body = {"rows": [r for r, _, _ in batch], "coverage": coverage}
    response = _post(client, path, json=body)
    if response.status_code != 200:
        return
    answer = response.json()
    assert len(answer["rows"]) == len(batch)
    assert answer["n_errors"] == sum(r["error"] != "" for r in answer["rows"])
    for (sent, valid, bad), row in zip(batch, answer["rows"], strict=True):
        _check_answer(row, *_TIME_COLUMNS[path], bad)
        for key in EXTRA_FIELDS:  # pass-through fields come back as sent
            if sent.get(key) is not None and not isinstance(sent[key], list | dict):
                assert row[key] == sent[key], (key, sent[key], row[key])
        if valid is not None:
            got = tuple(row.get(c) for c in _TIME_COLUMNS[path])
            assert got == _http_alone(client, path, valid, coverage), got


@FAST
@given(batch=_http_rows(run_rows), coverage=coverages)
def test_http_steps_never_5xx_or_echo_input(analytic_client, batch, coverage) -> None:
    _check_http_batch(analytic_client, "/v1/predict/steps", batch, coverage)


@FAST
@given(batch=_http_rows(op_rows), coverage=coverages)
def test_http_ops_never_5xx_or_echo_input(analytic_client, batch, coverage) -> None:
    _check_http_batch(analytic_client, "/v1/predict/ops", batch, coverage)


@FEW
@given(batch=_http_rows(run_rows), coverage=st.just(0.9))
def test_http_steps_default_predictor(default_client, batch, coverage) -> None:
    _check_http_batch(default_client, "/v1/predict/steps", batch, coverage)


@FEW
@given(batch=_http_rows(op_rows), coverage=st.just(0.9))
def test_http_ops_default_predictor(default_client, batch, coverage) -> None:
    _check_http_batch(default_client, "/v1/predict/ops", batch, coverage)


SEARCH = {"model": "gpt3-125m", "gpus": ["a100-sxm4-80gb"], "num_gpus": 4, "global_batch": 16, "top": 5}
search_fields = st.sampled_from(("model", "gpus", "num_gpus", "global_batch", "seq_len", "gpus_per_node",
                                 "inter_node", "dtype", "price_per_gpu_hour", "coverage", "top", "extra"))  # fmt: skip
search_values = st.one_of(
    json_value,
    st.sampled_from((1, 2, 8, 16, 0.5, 1e300, 10**30, -1, "h100", "fp8", "llama2-7b", "ib-ndr-400")),
    st.lists(st.sampled_from(("h100", "a100-sxm4-80gb", "rtx-9090", MARKER, "")), max_size=4),
    st.dictionaries(st.sampled_from(("num_layers", "hidden_size", "num_heads", "vocab_size")), json_leaf, max_size=4),
)


@_examples(60)
@given(changes=st.lists(st.tuples(search_fields, search_values), max_size=3), drop=st.sets(search_fields, max_size=2))
def test_http_search_never_5xx_or_echo_input(analytic_client, changes, drop) -> None:
    body = {k: v for k, v in SEARCH.items() if k not in drop}
    body.update(changes)
    if isinstance(body.get("num_gpus"), int) and not isinstance(body["num_gpus"], bool):
        body["num_gpus"] = min(body["num_gpus"], 64) if body["num_gpus"] > 0 else body["num_gpus"]  # keep it quick
    response = _post(analytic_client, "/v1/search", json=body)
    if response.status_code == 200:
        answer = response.json()
        assert answer["n_ranked"] <= answer["n_layouts"]
        for layout in answer["layouts"]:
            assert math.isfinite(layout["step_ms"]) and layout["step_ms"] > 0, layout


_R = '{"gpu": "h100", "model": "llama2-7b", "tag": "' + MARKER + '"'
_O = '{"op": "matmul", "m": 64, "n": 64, "k": 64, "gpu": "h100", "tag": "' + MARKER + '"'
raw_json_texts = st.sampled_from((
    "", "{", "null", "[]", '{"rows": null}', '{"rows": []}', '{"rows": {}}', '{"rows": [null]}',
    '{"rows": [' + _R + "}]}",
    '{"rows": [' + _R + ', "tp": "' + MARKER + '"}]}',
    '{"rows": [' + _R + ', "note": [1, {"a": "' + MARKER + '"}]}]}',
    '{"rows": [' + _R + '}], "coverage": "' + MARKER + '"}',
    '{"rows": [' + _O + ', "causal": "' + MARKER + '"}]}',
    '{"model": "' + MARKER + '", "gpus": ["h100"], "num_gpus": 8, "global_batch": 8}',
    '{"model": "gpt3-125m", "gpus": ["' + MARKER + '"], "num_gpus": 8, "global_batch": 8}',
    '{"model": "gpt3-125m", "gpus": ["h100"], "num_gpus": 8, "global_batch": 8, "dtype": "' + MARKER + '"}',
    '{"rows": [{"gpu": "\\ud800", "model": "llama2-7b"}]}',
    '{"rows": [' + _R + ', "x": ' + "[" * 5000 + "]" * 5000 + "}]}",
    '{"rows": [' + _R + ', "model": ' + '{"a":' * 3000 + "1" + "}" * 3000 + "}]}",
    '{"rows": [' + ",".join([_R + "}"] * 11) + "]}",
))  # fmt: skip
"""JSON texts, each planting :data:`MARKER` (NaN, Infinity and 1e999: :data:`NON_FINITE_BODIES`)."""


@_examples(100)
@given(
    path=st.sampled_from(("/v1/predict/steps", "/v1/predict/ops", "/v1/search")),
    body=st.one_of(
        st.binary(max_size=300).map(lambda b: b + MARKER.encode()),
        raw_json_texts.map(str.encode),
        st.tuples(raw_json_texts, st.integers(0, 120), st.binary(max_size=20)).map(
            lambda t: t[0][: t[1]].encode() + t[2]  # truncated, then garbage
        ),
        st.text(max_size=200).map(lambda s: json.dumps({"rows": [{"gpu": s, "model": MARKER}], "x": MARKER}).encode()),
        st.integers(12_000, 20_000).map(lambda n: b'{"rows": [' + b" " * n + b"]}"),
    ),
)
def test_http_raw_bodies_are_answered_or_refused(analytic_client, path, body) -> None:
    response = _post(analytic_client, path, content=body, headers={"content-type": "application/json"})
    if len(body) > LIMITS.max_body_bytes:
        assert response.status_code == 413


NON_FINITE_BODIES = {
    "pass-through NaN": ("/v1/predict/steps", '{"rows": [' + _R + ', "note": NaN}]}'),
    "pass-through -Infinity": ("/v1/predict/ops", '{"rows": [' + _O + ', "measured_ms": -Infinity}]}'),
    "pass-through 1e999": ("/v1/predict/ops", '{"rows": [' + _O + ', "measured_ms": 1e999}]}'),
    "inline model NaN": ("/v1/predict/steps", '{"rows": [{"gpu": "h100", "model": {"num_layers": NaN, '
                         '"hidden_size": 512, "num_heads": 8, "vocab_size": 1000}}]}'),
    "typed NaN": ("/v1/predict/steps", '{"rows": [' + _R + ', "tp": NaN}]}'),
    "typed -1e999": ("/v1/predict/steps", '{"rows": [' + _R + ', "tp": -1e999}]}'),
    "coverage NaN": ("/v1/predict/steps", '{"rows": [' + _R + '}], "coverage": NaN}'),
    "op size 1e999": ("/v1/predict/ops", '{"rows": [' + _O + ', "m": 1e999}]}'),
    "search inline model Infinity": ("/v1/search", '{"model": {"num_layers": Infinity}, "gpus": ["h100"], '
                                     '"num_gpus": 8, "global_batch": 8}'),
    "inline model extra Infinity": ("/v1/predict/steps", '{"rows": [{"gpu": "h100", "model": {"num_layers": 2, '
                                    '"hidden_size": 512, "num_heads": 8, "vocab_size": 1000, "x": Infinity}}]}'),
}  # fmt: skip
"""Bodies with NaN, Infinity or 1e999 where the request schema takes any value."""


@pytest.mark.parametrize(
    "path, body",
    [pytest.param(*v, id=k) for k, v in NON_FINITE_BODIES.items()],
)  # fmt: skip
def test_non_finite_json_numbers_are_refused_or_answered(path: str, body: str) -> None:
    client = TestClient(create_app(model="analytic"), raise_server_exceptions=False)
    response = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    assert response.status_code in (200, 422), response.status_code
    assert MARKER not in response.text
