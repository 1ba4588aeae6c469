"""HTTP service under concurrent load: predict latency, /healthz latency beside it, and a huge body.

For each predictor (``--model analytic`` and the shipped default) starts ``perfcast serve`` on
127.0.0.1 in its own process group, waits for ``/healthz``, then for each concurrency level:

* a load process runs ``C`` concurrent clients (httpx.AsyncClient, one connection each),
  each posting small ``/v1/predict/steps`` requests (``--rows`` run rows) back to back
  until ``--seconds`` have passed or it has sent ``--max-requests``;
* a probe process requests ``/healthz`` every 50 ms for as long as the load runs.

Then one body of ``--big-rows`` op rows (about 116 MB) is posted to ``/v1/predict/ops``,
recording the status (413 expected: it is over the service's body limit) and the time to
the response. The server is stopped with SIGTERM to its process group at the end, also on
failure. Everything stays on the loopback interface.

Writes ``benchmarks/results/service_load.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/service_load.py [--seconds 10] [--clients 50 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
RUN = {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 64, "gpu": "h100-sxm5-80gb", "num_gpus": 8}
BIG_ROW = (
    b'{"op":"matmul","batch":1,"m":4096,"n":4096,"k":4096,"gpu":"h100-sxm5-80gb","dtype":"bf16",'
    b'"tag":"load-test-row-00"}'
)
"""One op row of the oversized body (116 bytes with its comma: a million make 116 MB)."""
PROBE_PERIOD_S = 0.05


# ------------------------------------------------------------------ child processes


async def _client(url: str, deadline: float, max_requests: int, rows: int, seed: int, out: list[dict]) -> None:
    import httpx

    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        for i in range(max_requests):
            if time.monotonic() >= deadline:
                return
            body = {"rows": [{**RUN, "micro_batch": (1, 2, 4)[(seed + i + j) % 3]} for j in range(rows)]}
            start = time.perf_counter()
            try:
                response = await client.post("/v1/predict/steps", json=body)
                ok = response.status_code == 200 and response.json()["n_errors"] == 0
            except httpx.HTTPError:
                ok = False
            out.append({"ms": (time.perf_counter() - start) * 1e3, "ok": ok})


def run_load(url: str, clients: int, seconds: float, max_requests: int, rows: int) -> list[dict]:
    """``clients`` concurrent clients posting predict requests until the deadline; one record per request."""
    records: list[dict] = []

    async def main() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_client(url, deadline, max_requests, rows, c, records) for c in range(clients)))

    asyncio.run(main())
    return records


def run_probe(url: str, seconds: float) -> list[dict]:
    """``GET /healthz`` every :data:`PROBE_PERIOD_S` for ``seconds``; one record per probe."""
    import httpx

    records: list[dict] = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=30) as client:
        while time.monotonic() < deadline:
            start = time.perf_counter()
            try:
                ok = client.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            elapsed = time.perf_counter() - start
            records.append({"ms": elapsed * 1e3, "ok": ok})
            time.sleep(max(0.0, PROBE_PERIOD_S - elapsed))
    return records


# ------------------------------------------------------------------ driver


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"perfcast serve exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"perfcast serve did not answer /healthz in {timeout_s:.0f} s")


def _child(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)


def _stats(records: list[dict]) -> dict[str, Any]:
    ms = np.array([r["ms"] for r in records]) if records else np.array([np.nan])
    return {
        "requests": len(records),
        "errors": sum(not r["ok"] for r in records),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
    }


def post_big_body(url: str, rows: int) -> dict[str, Any]:
    """Post ``rows`` op rows as one body; the status (or transport error) and the time to it."""
    import httpx

    body = b'{"rows":[' + b",".join([BIG_ROW] * rows) + b"]}"
    start = time.perf_counter()
    try:
        response = httpx.post(f"{url}/v1/predict/ops", content=body, timeout=300,
                              headers={"content-type": "application/json"})  # fmt: skip
        status: int | str = response.status_code
    except httpx.HTTPError as exc:  # the server may close the connection while the body is still being sent
        status = type(exc).__name__
    return {"rows": rows, "body_mb": len(body) / 1e6, "status": status, "ms": (time.perf_counter() - start) * 1e3}


def measure(model: str | None, levels: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Start a server for ``model``, load it at each concurrency level, post the big body, stop it."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "perfcast.serve.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--model", model] if model else []
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)  # fmt: skip
    result: dict[str, Any] = {"predictor": model or "default", "levels": []}
    try:
        _wait(url, server)
        result["predictor"] = __import__("httpx").get(f"{url}/healthz").json()["step_predictor"]
        for clients in levels:
            load = _child("--load", url, "--clients", str(clients), "--seconds", str(args.seconds),
                          "--max-requests", str(args.max_requests), "--rows", str(args.rows))  # fmt: skip
            probe = _child("--probe", url, "--seconds", str(args.seconds))
            predict = json.loads(load.communicate(timeout=args.seconds + 300)[0])
            health = json.loads(probe.communicate(timeout=args.seconds + 300)[0])
            wall = max(args.seconds, 1e-9)
            result["levels"].append({"clients": clients, "predict": _stats(predict), "healthz": _stats(health),
                                     "predict_per_s": len(predict) / wall})  # fmt: skip
            print(model or "default", clients, result["levels"][-1], flush=True)
        result["big_body"] = post_big_body(url, args.big_rows)
        print(model or "default", result["big_body"], flush=True)
        result["healthz_after"] = __import__("httpx").get(f"{url}/healthz", timeout=10).status_code
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
    return result


def _markdown(results: list[dict[str, Any]], args: argparse.Namespace, command: str) -> str:
    lines = [
        "# HTTP service under concurrent load",
        "",
        f"Command: `{command}`. One uvicorn worker on 127.0.0.1, 2 cores shared by server, load and probe. "
        f"Each client posts `/v1/predict/steps` requests of {args.rows} run rows (llama2-7b on 8 H100) back to "
        f"back for {args.seconds:g} s (at most {args.max_requests} each); a separate process requests `/healthz` "
        f"every {PROBE_PERIOD_S * 1e3:.0f} ms meanwhile. Latencies are per request, from the client.",
        "",
        "| predictor | clients | predict requests | errors | predict/s | predict p50 ms | predict p99 ms "
        "| healthz probes | errors | healthz p50 ms | healthz p99 ms | healthz max ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for lv in r["levels"]:
            p, h = lv["predict"], lv["healthz"]
            lines.append(
                f"| {r['predictor']} | {lv['clients']} | {p['requests']} | {p['errors']} | {lv['predict_per_s']:.0f} "
                f"| {p['p50_ms']:.0f} | {p['p99_ms']:.0f} | {h['requests']} | {h['errors']} | {h['p50_ms']:.1f} "
                f"| {h['p99_ms']:.1f} | {h['max_ms']:.1f} |"
            )
    lines += ["", "Oversized body posted once to `/v1/predict/ops` after the load:", "",
              "| predictor | rows | body MB | status | time to response ms | /healthz after |",
              "|---|---:|---:|---|---:|---:|"]  # fmt: skip
    for r in results:
        b = r["big_body"]
        lines.append(f"| {r['predictor']} | {b['rows']} | {b['body_mb']:.0f} | {b['status']} | {b['ms']:.0f} "
                     f"| {r['healthz_after']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[50, 200], help="Concurrency levels, in order.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Load duration per level.")
    parser.add_argument("--max-requests", type=int, default=500, help="Most requests one client sends per level.")
    parser.add_argument("--rows", type=int, default=3, help="Run rows per predict request.")
    parser.add_argument("--big-rows", type=int, default=1_000_000, help="Op rows of the oversized body.")
    parser.add_argument("--models", nargs="+", default=["analytic", "default"], help="'default': the shipped one.")
    parser.add_argument("--name", default="service_load", help="Result file stem under benchmarks/results.")
    parser.add_argument("--load", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--probe", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        print(json.dumps(run_load(args.load, args.clients[0], args.seconds, args.max_requests, args.rows)))
        return
    if args.probe:
        print(json.dumps(run_probe(args.probe, args.seconds)))
        return
    results = [measure(None if m == "default" else m, args.clients, args) for m in args.models]
    command = "OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/service_load.py " + " ".join(sys.argv[1:])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps({"command": command, "results": results}, indent=1) + "\n")
    text = _markdown(results, args, command.strip())
    (OUT / f"{args.name}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
