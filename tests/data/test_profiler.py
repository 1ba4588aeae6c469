"""Tests of perfcast's profiler on the CPU (and on CUDA where present, marker ``gpu``)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from perfcast.data.dataset import load_dataset
from perfcast.data.op_timing import record_timing
from perfcast.data.profiler import (
    SOURCE,
    Measurement,
    OpSkipped,
    RepeatPolicy,
    detect_device,
    run_profile,
    time_op,
)
from perfcast.data.profiler.device import DeviceInfo
from perfcast.data.profiler.run import _records
from perfcast.data.schema import QUERY_TIMING, OpTiming
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError
from perfcast.features.sweeps import plan_key

FAST = RepeatPolicy(warmup=1, min_repeats=3, max_repeats=10, min_time_s=0.002, max_time_s=0.05)
CAP_S = 10.0  # no CPU cap in these tests: a busy CI box must not turn tiny rows into skips
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _row(**fields) -> dict:
    row = {"op": "matmul", "dtype": "fp32", **fields}
    row["key"] = plan_key(row)
    return row


def tiny_plan() -> pd.DataFrame:
    rows = [
        _row(op="matmul", batch=1, m=32, n=48, k=64),
        _row(op="linear", batch=1, m=16, n=32, k=64),
        _row(op="bmm", batch=4, m=16, n=16, k=32),
        _row(op="attention", batch=1, heads=4, kv_heads=2, seq_q=32, seq_kv=32, head_dim=16, causal=True),
        _row(op="layernorm", rows=64, cols=128),
        _row(op="rmsnorm", rows=64, cols=128, dtype="bf16"),
        _row(op="softmax", rows=64, cols=256),
        _row(op="add", rows=64, cols=128),
        _row(op="mul", rows=64, cols=128, scalar=True),
        _row(op="gelu", rows=64, cols=128),
        _row(op="silu", rows=64, cols=128, backward=True),
    ]
    return pd.DataFrame(rows)


def _run(plan: pd.DataFrame, out: Path, **kwargs):
    kwargs.setdefault("budget_s", 60)
    return run_profile(plan, "cpu", out, policy=FAST, cpu_op_cap_s=CAP_S, **kwargs)


def test_detect_cpu():
    info = detect_device("cpu")
    assert info.kind == "cpu" and info.count == 1 and info.name
    assert info.record_gpu == "cpu" and info.torch_version == torch.__version__
    assert info.properties["torch_threads"] >= 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
def test_detect_cuda_unavailable_is_a_clear_error():
    with pytest.raises(DatasetError, match="device=cuda"):
        detect_device("cuda")


@pytest.mark.parametrize("row", tiny_plan().to_dict("records"), ids=lambda r: r["op"])
def test_time_op_each_kind(row):
    m = time_op(row, detect_device("cpu"), policy=FAST)
    assert isinstance(m, Measurement)
    assert 0 < m.min_ms <= m.median_ms <= m.max_ms and m.std_ms >= 0
    assert FAST.min_repeats <= m.n_repeats <= FAST.max_repeats or m.n_repeats >= 3


def test_time_op_fixed_repeats():
    m = time_op(_row(batch=1, m=8, n=8, k=8), "cpu", warmup=0, repeats=7)
    assert m.n_repeats == 7


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (_row(batch=1, m=16, n=16, k=16, dtype="fp8"), "unsupported-dtype"),
        (_row(batch=1, m=16, n=16, k=16, dtype="tf32"), "unsupported-dtype"),
        (_row(op="allreduce", bytes=2**20, n_ranks=2), "needs-multi-gpu"),
        (_row(op="embedding", rows=8, cols=8), "unsupported-op"),
        (_row(op="matmul", batch=1, m=0, n=4, k=4), "bad-row"),
    ],
)
def test_time_op_skips_with_reason(row, reason):
    with pytest.raises(OpSkipped) as info:
        time_op(row, "cpu", policy=FAST)
    assert info.value.reason == reason and info.value.detail


def test_run_profile_writes_a_valid_dataset(tmp_path):
    plan = tiny_plan()
    out = tmp_path / "prof"
    res = _run(plan, out)
    assert res.complete and res.n_measured == len(plan) and res.n_skipped == 0
    assert sorted(p.name for p in out.iterdir()) == ["card.json", "ops.parquet"]  # .partial removed
    assert [p.name for p in tmp_path.iterdir()] == ["prof"]  # no temporary siblings left
    records = pd.read_parquet(out / "ops.parquet")
    assert set(records["key"]) == set(plan["key"])
    checked = check_op_records(records)
    assert checked.n_rejected == 0, checked.rejected["reason"].tolist()
    assert (records["source"] == SOURCE).all() and (records["gpu"] == "cpu").all()
    assert (records["timing"] == OpTiming.CPU_OP.value).all()  # perf_counter_ns around each call
    assert (records["measured_min_ms"] <= records["measured_ms"]).all()
    assert records.loc[records["op"] == "silu", "backward"].item()
    dataset = load_dataset(out)  # the shared dataset format: card, hashes and records check out
    card = dataset.card
    assert card["tables"]["ops"]["rows"] == len(plan) and card["source"] == SOURCE
    assert {"created_utc", "perfcast_version", "how_measured"} <= set(card)
    extra = card["extra"]
    assert extra["device"]["kind"] == "cpu" and extra["method"]["timer"].startswith("time.perf_counter_ns")
    assert extra["plan"] == {"rows": 11, "measured": 11, "skipped": 0, "not_reached": 0, "skipped_by_reason": {}}
    assert {"budget_s", "elapsed_s", "dtypes", "ops"} <= set(extra)


def _measured(row: dict, median_ms: float) -> dict:
    """A journal entry of a measured row."""
    stats = {"median_ms": median_ms, "min_ms": median_ms, "max_ms": median_ms, "std_ms": 0.0, "n_repeats": 3}
    return {"status": "measured", "row": row, "key": row["key"], "t_utc": "2026-01-01T00:00:00Z", **stats}


def test_cuda_records_say_cuda_events_and_older_rows_get_it_too():
    cuda = DeviceInfo(kind="cuda", name="NVIDIA H200", count=1, torch_version=torch.__version__)
    old, new = _row(batch=1, m=8, n=8, k=8), _row(op="add", rows=8, cols=8)
    prior = _records([_measured(old, 0.02)], cuda, None).drop(columns="timing")  # a profile from before the column
    records = _records([_measured(new, 0.01)], cuda, prior)
    assert records["key"].tolist() == [old["key"], new["key"]]
    assert records["timing"].tolist() == [OpTiming.CUDA_EVENTS.value] * 2
    assert check_op_records(records).n_rejected == 0
    assert record_timing(records, QUERY_TIMING).tolist() == [OpTiming.CUDA_EVENTS.value] * 2


def test_skips_are_recorded_with_reasons(tmp_path):
    plan = pd.DataFrame(
        [
            _row(batch=1, m=16, n=16, k=16, dtype="fp8"),
            _row(op="allgather", bytes=2**20, n_ranks=2),
            _row(batch=1, m=4096, n=4096, k=4096),
            _row(op="add", rows=8, cols=8),
        ]
    )
    res = run_profile(plan, "cpu", tmp_path / "p", budget_s=30, policy=FAST, cpu_op_cap_s=0.05)
    assert res.skipped_by_reason == {"unsupported-dtype": 1, "needs-multi-gpu": 1, "cpu-time-cap": 1}
    card = json.loads((tmp_path / "p" / "card.json").read_text())
    assert {s["reason"] for s in card["extra"]["skipped"]} == {"unsupported-dtype", "needs-multi-gpu", "cpu-time-cap"}
    assert card["tables"]["ops"]["rows"] == 1 and card["extra"]["plan"]["skipped"] == 3


def test_budget_stop_then_resume_measures_only_the_rest(tmp_path):
    plan = tiny_plan()
    out = tmp_path / "prof"
    slow = RepeatPolicy(warmup=0, min_repeats=1, max_repeats=10**8, min_time_s=0.4, max_time_s=5)  # 0.4 s a row
    first = run_profile(plan, "cpu", out, budget_s=2.0, policy=slow, cpu_op_cap_s=CAP_S)
    assert 0 < first.n_measured < len(plan) and first.n_not_reached > 0
    before = pd.read_parquet(out / "ops.parquet")
    ran: list[str] = []
    second = _run(plan, out, progress=lambda e: ran.append(e.current) if e.current else None)
    assert len(ran) == len(plan) - first.n_measured
    assert second.complete and second.n_measured == len(plan)
    after = pd.read_parquet(out / "ops.parquet")
    assert set(after["key"]) == set(plan["key"]) and after["key"].is_unique
    kept = after.set_index("key").loc[before["key"], "measured_ms"]
    assert kept.tolist() == before["measured_ms"].tolist()  # earlier measurements kept, not redone


def test_interrupt_keeps_partial_and_resumes(tmp_path):
    plan = tiny_plan()
    out = tmp_path / "prof"
    calls = {"n": 0}

    def interrupt(event):
        if event.current:
            calls["n"] += 1
            if calls["n"] == 4:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(plan, out, progress=interrupt)
    journal = out / ".partial" / "measurements.jsonl"
    lines = journal.read_text().splitlines()
    assert len(lines) == 3 and not (out / "ops.parquet").exists()
    assert {json.loads(line)["key"] for line in lines} <= set(plan["key"])
    ran: list[str] = []
    res = _run(plan, out, progress=lambda e: ran.append(e.current) if e.current else None)
    assert len(ran) == len(plan) - 3 and res.complete
    assert not (out / ".partial").exists()
    assert len(pd.read_parquet(out / "ops.parquet")) == len(plan)


def test_no_resume_starts_over(tmp_path):
    plan = tiny_plan().head(3)
    out = tmp_path / "prof"
    _run(plan, out)
    ran: list[str] = []
    _run(plan, out, resume=False, progress=lambda e: ran.append(e.current) if e.current else None)
    assert len(ran) == 3


def test_resume_refuses_another_device(tmp_path):
    out = tmp_path / "prof"
    (out / ".partial").mkdir(parents=True)
    (out / ".partial" / "meta.json").write_text(json.dumps({"device_name": "NVIDIA H100 80GB HBM3"}))
    with pytest.raises(DatasetError, match="H100"):
        _run(tiny_plan(), out)


def test_refuses_a_directory_with_other_files(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="notes.txt"):
        _run(tiny_plan(), tmp_path)
    assert (tmp_path / "notes.txt").exists()


@pytest.mark.gpu
@needs_cuda
def test_cuda_time_op_and_profile(tmp_path):
    info = detect_device("cuda")
    assert info.kind == "cuda" and info.properties["multi_processor_count"] > 0
    m = time_op(_row(batch=1, m=1024, n=1024, k=1024, dtype="bf16"), info, policy=FAST)
    assert m.median_ms > 0
    plan = tiny_plan()
    res = run_profile(plan, "cuda", tmp_path / "p", budget_s=60, policy=FAST, flush_l2=True)
    assert res.n_measured == len(plan)
    assert check_op_records(res.records).n_rejected == 0
    assert (res.records["gpu"] == info.name).all()
    assert (res.records["timing"] == OpTiming.CUDA_EVENTS.value).all()


@pytest.mark.gpu
@needs_cuda
def test_cuda_fp8_gemm():
    info = detect_device("cuda")
    row = _row(batch=1, m=256, n=256, k=256, dtype="fp8")
    if info.capability < (8, 9):
        with pytest.raises(OpSkipped, match="capability"):
            time_op(row, info, policy=FAST)
    else:
        assert time_op(row, info, policy=FAST).median_ms > 0
