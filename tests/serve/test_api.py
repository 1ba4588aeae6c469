"""The HTTP service: in-process through FastAPI's TestClient and over a real socket."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings

import pytest

with warnings.catch_warnings():  # starlette's test client warns about its httpx backend
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

from perfcast.serve.api import create_app
from perfcast.serve.service_limits import MAX_ROWS, ServiceLimits

GEMM = {"op": "matmul", "m": 1024, "n": 1024, "k": 1024, "gpu": "h100-sxm5-80gb", "dtype": "bf16"}
RUN = {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "gpu": "h100-sxm5-80gb", "num_gpus": 8}


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app())


def test_health_and_hardware(client: TestClient) -> None:
    health = client.get("/healthz").json()
    assert health["status"] == "ok" and health["op_predictor"].startswith("bundle:")
    ids = {hw["id"] for hw in client.get("/v1/hardware").json()}
    assert {"h100-sxm5-80gb", "a100-sxm4-80gb", "mi300x"} <= ids


def test_openapi_documents_every_endpoint(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/healthz", "/v1/hardware", "/v1/predict/ops", "/v1/predict/steps", "/v1/search"} <= set(paths)


def test_ops_batch_answers_good_rows_and_reports_bad_ones(client: TestClient) -> None:
    bad = {**GEMM, "k": None, "tag": "mine"}
    body = client.post("/v1/predict/ops", json={"rows": [GEMM, bad, GEMM]}).json()
    rows = body["rows"]
    assert body["n_errors"] == 1 and len(rows) == 3
    assert rows[0]["error"] == "" and rows[0]["pred_lo_ms"] <= rows[0]["pred_ms"] <= rows[0]["pred_hi_ms"]
    assert rows[0]["pred_ms"] == rows[2]["pred_ms"]
    assert "k=" in rows[1]["error"] and rows[1]["pred_ms"] is None
    assert rows[1]["tag"] == "mine"  # extra fields pass through
    assert rows[0]["m"] == 1024 and isinstance(rows[0]["m"], int)


def test_ops_batch_reports_a_bad_timing_on_its_row(client: TestClient) -> None:
    rows = [GEMM, {**GEMM, "timing": "wallclock"}, {**GEMM, "timing": "cuda_events"}]
    body = client.post("/v1/predict/ops", json={"rows": rows}).json()
    assert body["n_errors"] == 1
    assert [r["error"] for r in body["rows"]] == [
        "",
        "timing='wallclock' is not a known timing; allowed: gpu_kernels, cuda_events, loop_mean, cpu_op",
        "",
    ]
    assert body["rows"][1]["pred_ms"] is None and body["rows"][2]["pred_ms"] > 0


def test_wider_coverage_gives_a_wider_interval(client: TestClient) -> None:
    narrow = client.post("/v1/predict/ops", json={"rows": [GEMM], "coverage": 0.5}).json()["rows"][0]
    wide = client.post("/v1/predict/ops", json={"rows": [GEMM], "coverage": 0.95}).json()["rows"][0]
    assert wide["pred_hi_ms"] - wide["pred_lo_ms"] > narrow["pred_hi_ms"] - narrow["pred_lo_ms"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rows": [{**GEMM, "m": "abc"}]}, ["body", "rows", 0, "m"]),
        ({"rows": [{"op": "matmul"}]}, ["body", "rows", 0, "gpu"]),
        ({"rows": [GEMM], "coverage": 1.5}, ["body", "coverage"]),
        ({"rows": []}, ["body", "rows"]),
    ],
)
def test_unparsable_input_is_a_422_naming_the_field(client: TestClient, body: dict, field: list) -> None:
    response = client.post("/v1/predict/ops", json=body)
    assert response.status_code == 422
    assert field in [d["loc"] for d in response.json()["detail"]]


def test_steps_batch(client: TestClient) -> None:
    rows = [RUN, {**RUN, "tp": 3, "num_gpus": 12, "gpus_per_node": 4}, {**RUN, "zero_stage": 7}]
    response = client.post("/v1/predict/steps", json={"rows": rows[:2], "breakdown": True})
    body = response.json()
    assert response.status_code == 200 and body["n_errors"] == 1
    good, bad = body["rows"]
    assert good["step_ms"] > 0 and good["fits_memory"] is True and good["compute_ms"] > 0
    assert "tp=3" in bad["error"] and bad["step_ms"] is None


@pytest.mark.parametrize(
    ("path", "good", "bad", "message"),
    [
        ("/v1/predict/ops", GEMM, {**GEMM, "m": 0}, "m=0 is out of range; allowed: 1.."),
        ("/v1/predict/steps", RUN, {**RUN, "zero_stage": 7}, "zero_stage"),
        ("/v1/predict/steps", RUN, {**RUN, "global_batch": -1}, "global_batch=-1"),
        (
            "/v1/predict/steps",
            RUN,
            {**RUN, "model": None, "num_layers": 2, "num_heads": 4, "vocab_size": 1000, "hidden_size": 2**70},
            "hidden_size=",
        ),
    ],
)
def test_a_value_out_of_range_is_its_rows_error_and_the_other_rows_are_answered(
    client: TestClient, path: str, good: dict, bad: dict, message: str
) -> None:
    response = client.post(path, json={"rows": [good, bad, good]})
    body = response.json()
    assert response.status_code == 200 and body["n_errors"] == 1
    assert [message in r["error"] for r in body["rows"]] == [False, True, False]
    assert all(r["error"] == "" for r in body["rows"][::2])


def test_row_limit_is_enforced(client: TestClient) -> None:
    response = client.post("/v1/predict/ops", json={"rows": [GEMM] * (MAX_ROWS + 1)})
    assert response.status_code == 422


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_service_over_a_real_socket(workers: int, tmp_path) -> None:
    import httpx

    port = _free_port()
    (tmp_path / "tiny.json").write_text('{"num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000}')
    cmd = [sys.executable, "-m", "perfcast.serve.cli", "serve", "--port", str(port), "--model", "analytic",
           "--workers", str(workers), "--model-dir", str(tmp_path), "--max-body-mb", "0.01"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "service did not start in 120 s"
            time.sleep(0.5)
        assert httpx.get(f"{url}/healthz").json()["op_predictor"] == "analytic"
        body = httpx.post(f"{url}/v1/predict/ops", json={"rows": [GEMM, {**GEMM, "gpu": "nope-gpu"}]}).json()
        assert body["rows"][0]["pred_ms"] > 0 and "nope-gpu" in body["rows"][1]["error"]
        assert httpx.post(f"{url}/v1/predict/steps", json={"rows": [{"tp": "x", "gpu": "h100"}]}).status_code == 422
        allowed = httpx.post(f"{url}/v1/predict/steps", json={"rows": [{"model": "tiny.json", "gpu": "h100"}]})
        assert allowed.json()["rows"][0]["step_ms"] > 0  # the limits and folders reach every worker
        assert httpx.post(f"{url}/v1/predict/ops", content=b" " * 20_000).status_code == 413
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_search_ranks_layouts_and_names_bad_input() -> None:
    client = TestClient(create_app(model="analytic"))
    body = {"model": "gpt3-125m", "gpus": ["a100-sxm4-80gb"], "num_gpus": 4, "global_batch": 16, "top": 5}
    response = client.post("/v1/search", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["n_ranked"] == result["n_layouts"] - result["n_out_of_memory"] >= len(result["layouts"]) == 5
    steps = [row["step_ms"] for row in result["layouts"]]
    assert steps == sorted(steps) and result["layouts"][0]["rank"] == 1
    unknown = client.post("/v1/search", json={**body, "gpus": ["nope"]})
    assert unknown.status_code == 422 and "nope" in unknown.json()["detail"]
    assert client.post("/v1/search", json={**body, "num_gpus": 0}).status_code == 422
    lora = client.post("/v1/search", json={**body, "finetune": "lora", "lora_rank": 8, "document_tokens": 512})
    assert lora.status_code == 200, lora.text
    assert {(r["finetune"], r["lora_rank"], r["document_tokens"]) for r in lora.json()["layouts"]} == {("lora", 8, 512)}
    assert client.post("/v1/search", json={**body, "finetune": "qlora"}).status_code == 422
    misspelt = client.post("/v1/search", json={**body, "lora-rank": 8})  # not silently a full-training search
    assert misspelt.status_code == 422 and "lora-rank" in misspelt.text
    titan = client.post("/v1/search", json={**body, "framework": "torchtitan"})
    assert titan.status_code == 200, titan.text
    assert {r["framework"] for r in titan.json()["layouts"]} == {"torchtitan"}
    sharded = [r["zero_stage"] for r in titan.json()["layouts"] if r["dp"] > 1]
    assert sharded and set(sharded) == {3}
    jax = client.post("/v1/search", json={**body, "framework": "maxtext"})
    assert jax.status_code == 422 and "JAX/XLA stack" in jax.json()["detail"]
    two = {**body, "gpus": ["a100-sxm4-80gb", "h100-sxm5-80gb"]}
    priced = client.post("/v1/search", json={**two, "price_per_gpu_hour": [1.0, 3.0]})
    assert priced.status_code == 200, priced.text
    assert all(r["usd_per_step"] == pytest.approx(r["step_ms"] / 3.6e6 * 4 * {"a100-sxm4-80gb": 1.0}.get(r["gpu"], 3.0))
               for r in priced.json()["layouts"])  # fmt: skip
    assert client.post("/v1/search", json={**two, "price_per_gpu_hour": [1.0, 2.0, 3.0]}).status_code == 422


# ------------------------------------------------------------------ hardening


def test_a_request_cannot_make_the_service_read_a_server_file(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secrets.json").write_text('{"api_key": "S3CRET"}')
    allowed = tmp_path / "configs"
    allowed.mkdir()
    (allowed / "tiny.json").write_text('{"num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000}')
    client = TestClient(create_app(model="analytic", limits=ServiceLimits(model_dirs=(allowed,))))
    refs = ["secrets.json", "missing.json", "/etc/passwd", "../secrets.json", "tiny.json"]
    body = client.post("/v1/predict/steps", json={"rows": [{**RUN, "model": m} for m in refs]}).json()
    errors = [row["error"] for row in body["rows"]]
    assert not any("S3CRET" in e or "api_key" in e for e in errors)
    assert len({e.replace(repr(r), "") for e, r in zip(errors[:4], refs[:4], strict=True)}) == 1  # existence not told
    assert errors[4] == "" and body["rows"][4]["step_ms"] > 0  # a file the operator allowed
    inline = {**RUN, "model": {"num_layers": 2, "hidden_size": 256, "num_heads": 4, "vocab_size": 1000}}
    assert client.post("/v1/predict/steps", json={"rows": [inline]}).json()["rows"][0]["step_ms"] > 0


def test_bodies_over_the_limit_are_refused_before_parsing() -> None:
    client = TestClient(create_app(model="analytic", limits=ServiceLimits(max_body_bytes=10_000, max_rows=3)))
    big = {"rows": [GEMM] * 200}
    assert client.post("/v1/predict/ops", json=big).status_code == 413
    streamed = client.post("/v1/predict/ops", content=(b" " * 1000 for _ in range(20)))  # no Content-Length
    assert streamed.status_code == 413
    too_many = client.post("/v1/predict/ops", json={"rows": [GEMM] * 4})
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"] == ["body", "rows"]
    search = {"model": "mixtral-8x7b", "gpus": ["h100-sxm5-80gb"], "num_gpus": 4096, "global_batch": 4096}
    limited = TestClient(create_app(model="analytic", limits=ServiceLimits(max_search_layouts=100)))
    response = limited.post("/v1/search", json=search)
    assert response.status_code == 422 and "max_layouts=100" in response.json()["detail"]


def test_output_fields_in_rows_are_predicted_anew_and_a_response_row_can_be_sent_back(client: TestClient) -> None:
    stale = {**RUN, "step_ms": 1.5, "error": "stale", "mfu": 9.0}
    body = client.post("/v1/predict/steps", json={"rows": [stale, {**RUN, "tp": 3}]}).json()
    good, bad = body["rows"]
    assert good["step_ms"] != 1.5 and good["error"] == "" and good["mfu"] < 1
    assert "tp*pp*dp*cp" in bad["error"] and bad["step_ms"] is None
    assert "step_ms" in body["warnings"][0]
    again = client.post("/v1/predict/steps", json={"rows": body["rows"]})
    assert again.status_code == 200 and again.json()["rows"][0]["step_ms"] == good["step_ms"]
    ops = client.post("/v1/predict/ops", json={"rows": [{**GEMM, "pred_ms": -1, "out_of_domain": True}]}).json()
    assert ops["rows"][0]["pred_ms"] > 0


@pytest.mark.parametrize(
    ("content", "loc"),
    [
        ('{"rows": [{"gpu": "h100", "model": "llama2-7b", "seq_len": 1e30}]}', ["body", "rows", 0, "seq_len"]),
        ('{"rows": [{"gpu": "h100", "model": "llama2-7b"}], "coverage": NaN}', ["body"]),
        ('{"rows": [{"gpu": "h100", "model": "llama2-7b", "note": 1e999}]}', ["body"]),
        ('{"rows": [{"gpu": "h100", "model": "llama2-7b", "x": ' + "[" * 300 + "]" * 300 + "}]}", None),
        ('{"rows": [{"gpu": "h100", "x": ' + "[" * 50_000 + "]" * 50_000 + "}]}", ["body"]),
        ('{"rows": [{"gpu": "h100", "tp": "SECRET-INPUT"}]}', ["body", "rows", 0, "tp"]),
        ("not json", ["body"]),
    ],
)
def test_bad_bodies_are_a_422_naming_the_field_without_echoing_input(client: TestClient, content: str, loc) -> None:
    response = client.post("/v1/predict/steps", content=content.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "SECRET-INPUT" not in response.text and "input" not in detail[0]
    if loc is not None:
        assert loc in [d["loc"] for d in detail]


def test_nan_bytes_are_a_422_and_huge_op_sizes_their_rows_error(client: TestClient) -> None:
    collective = {"op": "allreduce", "bytes": 1e400, "n_ranks": 8, "gpu": "h100-sxm5-80gb"}
    content = json.dumps({"rows": [collective]}).replace("Infinity", "NaN")
    response = client.post("/v1/predict/ops", content=content.encode(), headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body"]  # NaN is not JSON
    huge = client.post("/v1/predict/ops", json={"rows": [{**GEMM, "m": 2**62}, {**GEMM, "k": 2**70}, GEMM]})
    assert huge.status_code == 200
    errors = [r["error"] for r in huge.json()["rows"]]
    assert "m=4611686018427387904 is out of range" in errors[0] and "k=" in errors[1] and errors[2] == ""


def test_rows_say_which_inputs_were_defaulted(client: TestClient) -> None:
    rows = [{**RUN, "finetune": "lora"}, {**RUN, "defaulted_fields": "vpp"}]
    lora, given = client.post("/v1/predict/steps", json={"rows": rows}).json()["rows"]
    assert "lora_rank" in lora["defaulted_fields"].split(",") and lora["error"] == ""
    assert given["defaulted_fields"].split(",")[0] == "vpp" and "dtype" in given["defaulted_fields"]


def test_steps_on_their_mfu_ceiling_are_counted_in_the_warnings(client: TestClient) -> None:
    meta_405b = {"model": "llama3.1-405b", "gpu": "h100-sxm5-80gb", "num_gpus": 8192, "tp": 8, "pp": 16, "vpp": 4,
                 "dp": 64, "micro_batch": 1, "global_batch": 2048, "framework": "megatron-core",
                 "sequence_parallel": True}  # fmt: skip
    body = client.post("/v1/predict/steps", json={"rows": [meta_405b, RUN]}).json()
    flags = [row["at_mfu_ceiling"] for row in body["rows"]]
    assert flags[0] is True and flags[1] is False
    assert any(w.startswith("1 of 2 configs are predicted faster than the MFU ceiling") for w in body["warnings"])
