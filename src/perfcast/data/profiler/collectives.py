"""Time collective rows over the GPUs of this machine (NCCL).

Collectives run only with CUDA and more than one device: ``torch.multiprocessing``
spawns one worker per extra GPU, all ranks join an NCCL process group (the calling
process is rank 0) with one subgroup per group size, and rank 0's CUDA events time each
call; the ranks run the same fixed number of repeats in lock-step. Elsewhere collective
rows are skipped (``needs-multi-gpu``).
"""

from __future__ import annotations

import contextlib
import socket
import traceback
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from perfcast.data.profiler.device import _TORCH_DTYPES, _torch
from perfcast.data.profiler.measurement import Measurement, OpSkipped, RepeatPolicy
from perfcast.data.profiler.rows import _int
from perfcast.data.schema import DType, OpType
from perfcast.errors import DatasetError

_COLLECTIVE_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collective_setup(rank: int, world: int, port: int) -> dict[int, Any]:
    """Join the NCCL group as ``rank`` and create one subgroup per size (every rank, same order)."""
    torch = _torch()
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=_COLLECTIVE_TIMEOUT_S),
    )
    return {n: dist.new_group(list(range(n))) for n in range(2, world + 1)}


def _run_collective(rank: int, groups: dict[int, Any], row: Mapping[str, Any], n_calls: int, warmup: int) -> list:
    """Run one collective row on this rank; returns per-call times (ms) measured with CUDA events."""
    torch = _torch()
    import torch.distributed as dist

    op, n = OpType(row["op"]), _int(row, "n_ranks")
    if rank >= n:
        return []
    dtype = getattr(torch, _TORCH_DTYPES[DType.parse(row["dtype"])])
    numel = max(n, _int(row, "bytes") // torch.tensor([], dtype=dtype).element_size() // n * n)
    group = groups[n]
    if op is OpType.ALLREDUCE:
        buf = torch.randn(numel, dtype=dtype, device="cuda")

        def call() -> None:
            dist.all_reduce(buf, group=group)
    elif op is OpType.ALLGATHER:
        out, part = torch.empty(numel, dtype=dtype, device="cuda"), torch.randn(numel // n, dtype=dtype, device="cuda")

        def call() -> None:
            dist.all_gather_into_tensor(out, part, group=group)
    elif op is OpType.REDUCESCATTER:
        full, part = torch.randn(numel, dtype=dtype, device="cuda"), torch.empty(numel // n, dtype=dtype, device="cuda")

        def call() -> None:
            dist.reduce_scatter_tensor(part, full, group=group)
    else:
        raise OpSkipped("unsupported-op", f"the profiler does not time {op.value}")
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_calls)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [float(s.elapsed_time(e)) for s, e in zip(starts, ends, strict=True)]


def _collective_worker(rank: int, world: int, port: int, commands: Any, errors: Any) -> None:
    """Body of ranks 1..world-1: run the rows rank 0 sends until it sends None."""
    import torch.distributed as dist

    try:
        groups = _collective_setup(rank, world, port)
        while (job := commands.get()) is not None:
            row, n_calls, warmup = job
            _run_collective(rank, groups, row, n_calls, warmup)
        dist.destroy_process_group()
    except Exception:  # reported to rank 0, which would otherwise wait for the NCCL timeout
        errors.put(f"rank {rank}: {traceback.format_exc()}")


class _CollectiveGroup:
    """An NCCL group over every visible GPU: this process is rank 0, spawned workers the rest."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.procs: list[Any] = []
        self.queues: list[Any] = []

    def __enter__(self) -> _CollectiveGroup:
        torch = _torch()
        ctx = torch.multiprocessing.get_context("spawn")
        port = _free_port()
        self.errors = ctx.Queue()
        for rank in range(1, self.world):
            q = ctx.Queue()
            proc = ctx.Process(target=_collective_worker, args=(rank, self.world, port, q, self.errors), daemon=True)
            proc.start()
            self.queues.append(q)
            self.procs.append(proc)
        self.groups = _collective_setup(0, self.world, port)
        return self

    def time(self, row: Mapping[str, Any], policy: RepeatPolicy) -> Measurement:
        if not self.errors.empty():
            raise DatasetError(f"a collective worker failed: {self.errors.get()}")
        n_calls = max(policy.min_repeats, 10)
        job = ({c: row.get(c) for c in ("op", "dtype", "bytes", "n_ranks")}, n_calls, max(policy.warmup, 1))
        for q in self.queues:
            q.put(job)
        return Measurement.from_samples(_run_collective(0, self.groups, job[0], n_calls, job[2]))

    def __exit__(self, *exc: object) -> None:
        import torch.distributed as dist

        for q in self.queues:
            q.put(None)
        for proc in self.procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.terminate()
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
