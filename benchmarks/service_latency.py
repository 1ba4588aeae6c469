"""HTTP service latency under a bounded concurrent load from a second process.

Starts ``perfcast serve`` (the shipped default predictors) on 127.0.0.1, then a client
process opens ``--clients`` concurrent connections (httpx, asyncio), each sending
``--requests`` requests in turn: a batch of ``--op-rows`` op rows to ``/v1/predict/ops``
and one run row to ``/v1/predict/steps``, alternating. Records each request's latency
and every error (non-200 or transport failure); reports p50 and p99 per endpoint.

Writes ``benchmarks/results/service_latency.json`` and ``.md``.

Usage: .venv/bin/python benchmarks/service_latency.py [--clients 50] [--requests 20]
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results"
GEMM = {"op": "matmul", "m": 4096, "n": 4096, "k": 4096, "gpu": "h100-sxm5-80gb", "dtype": "bf16"}
RUN = {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 64, "gpu": "h100-sxm5-80gb", "num_gpus": 8}


async def _client(url: str, requests: int, op_rows: int, out: list[dict]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for i in range(requests):
            if i % 2 == 0:
                path, body = "/v1/predict/ops", {"rows": [{**GEMM, "m": 256 * (1 + j % 16)} for j in range(op_rows)]}
            else:
                path, body = "/v1/predict/steps", {"rows": [{**RUN, "micro_batch": 1 + i % 4}]}
            start = time.perf_counter()
            try:
                response = await client.post(path, json=body)
                ok = response.status_code == 200
            except httpx.HTTPError:
                ok = False
            out.append({"path": path, "ms": (time.perf_counter() - start) * 1e3, "ok": ok})


def load(url: str, clients: int, requests: int, op_rows: int) -> list[dict]:
    """Run the concurrent clients against ``url``; one record per request."""
    records: list[dict] = []

    async def main() -> None:
        await asyncio.gather(*(_client(url, requests, op_rows, records) for _ in range(clients)))

    asyncio.run(main())
    return records


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("perfcast serve exited")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("perfcast serve did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--op-rows", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1, help="perfcast serve worker processes")
    parser.add_argument("--name", default="service_latency", help="Result file stem under benchmarks/results.")
    parser.add_argument("--child", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(load(args.child, args.clients, args.requests, args.op_rows)))
        return
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "perfcast.serve.cli", "serve", "--port", str(port), "--workers",
                               str(args.workers)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        _wait(url, server)
        cmd = [sys.executable, __file__, "--child", url, "--clients", str(args.clients), "--requests",
               str(args.requests), "--op-rows", str(args.op_rows)]  # fmt: skip
        start = time.perf_counter()
        records = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        wall = time.perf_counter() - start
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    rows = []
    for path in sorted({r["path"] for r in records}):
        ms = np.array([r["ms"] for r in records if r["path"] == path])
        errors = sum(not r["ok"] for r in records if r["path"] == path)
        rows.append({"endpoint": path, "requests": len(ms), "errors": errors, "p50_ms": float(np.percentile(ms, 50)),
                     "p99_ms": float(np.percentile(ms, 99))})  # fmt: skip
    result = {"workers": args.workers, "clients": args.clients, "requests_per_client": args.requests,
              "op_rows": args.op_rows, "wall_s": wall, "requests_per_s": len(records) / wall,
              "endpoints": rows}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# HTTP service latency under concurrent load",
        "",
        f"Command: `.venv/bin/python benchmarks/service_latency.py --clients {args.clients} --requests "
        f"{args.requests} --workers {args.workers} --name {args.name}`: {args.clients} concurrent clients in a "
        f"second process, {args.requests} requests each (ops batches of {args.op_rows} rows and single run rows, "
        f"alternating), {args.workers} uvicorn worker(s), 2 cores. "
        f"{len(records)} requests in {wall:.1f} s ({len(records) / wall:.1f}/s).",
        "",
        "| endpoint | requests | errors | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|",
        *(f"| {r['endpoint']} | {r['requests']} | {r['errors']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} |"
          for r in rows),
    ]  # fmt: skip
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
