"""Tests of perfcast.data.readers.torch_trace (and the ATen mapping in readers.aten).

A real torch.profiler trace of a tiny model is recorded on the CPU; a hand-written GPU-style
trace exercises the kernel-linking paths; fuzz tests check that nothing but DatasetError
escapes on garbage.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perfcast.data.readers.aten import (
    NO_EQUIVALENT_REASON,
    RECORD_COLUMNS,
    AtenCall,
    AtenShapeError,
    dtype_from_input_type,
    map_aten_op,
)
from perfcast.data.readers.torch_trace import (
    UNLINKED_KERNELS,
    parse_torch_trace,
    read_torch_trace,
)
from perfcast.data.validate import check_op_records
from perfcast.errors import DatasetError
from perfcast.features.hardware import resolve_gpu_name

H100 = "NVIDIA H100 80GB HBM3"

# --------------------------------------------------------------------------- a real CPU trace

BATCH, SEQ, D_IN, HIDDEN, HEADS = 2, 8, 32, 64, 4


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    from torch.nn import functional as F  # noqa: N812
    from torch.profiler import ProfilerActivity, profile

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(D_IN, HIDDEN)
            self.ln = torch.nn.LayerNorm(HIDDEN)
            self.w = torch.nn.Parameter(torch.randn(BATCH, HIDDEN, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = F.gelu(self.ln(self.lin(x)))  # [B, S, HIDDEN]
            p = torch.softmax(h, dim=-1)
            q = h.view(BATCH, SEQ, HEADS, HIDDEN // HEADS).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            b = torch.bmm(p, self.w)  # [B, S, HIDDEN] x [B, HIDDEN, 16]
            return a.sum() + b.sum()

    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(BATCH, SEQ, D_IN)
    path = tmp_path_factory.mktemp("trace") / "cpu_trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(2):
            model(x).backward()
    prof.export_chrome_trace(str(path))
    return path


def _find(records, **match):
    rows = records
    for key, value in match.items():
        rows = rows[rows[key] == value]
    return rows


def test_real_cpu_trace_maps_the_model_ops(cpu_trace: Path) -> None:
    result = read_torch_trace(cpu_trace)
    rec = result.records
    assert list(rec.columns) == list(RECORD_COLUMNS)
    assert set(rec["gpu"]) == {"cpu"} and set(rec["timing"]) == {"cpu_op"} and set(rec["dtype"]) == {"fp32"}
    assert (rec["measured_ms"] > 0).all() and (rec["measured_min_ms"] <= rec["measured_max_ms"]).all()
    fwd = rec[~rec["backward"]]
    # aten::linear calls aten::addmm: one linear record (outermost), nothing from addmm
    lin = _find(fwd, op="linear")
    assert len(lin) == 1 and lin.iloc[0][["batch", "m", "n", "k"]].tolist() == [1, BATCH * SEQ, HIDDEN, D_IN]
    assert lin.iloc[0]["aten_op"] == "aten::linear" and lin.iloc[0]["n_repeats"] == 2
    assert not rec["aten_op"].str.contains("addmm").any()
    for op in ("layernorm", "gelu", "softmax"):
        row = _find(fwd, op=op)
        assert row[["rows", "cols"]].values.tolist() == [[BATCH * SEQ, HIDDEN]], op
    att = _find(fwd, op="attention").iloc[0]
    assert [att[c] for c in ("batch", "heads", "kv_heads", "seq_q", "seq_kv", "head_dim")] == [
        BATCH, HEADS, HEADS, SEQ, SEQ, HIDDEN // HEADS
    ]  # fmt: skip
    assert att["causal"] is True or att["causal"] == True  # noqa: E712
    bmm = _find(fwd, op="bmm")
    assert bmm[["batch", "m", "n", "k"]].values.tolist() == [[BATCH, SEQ, 16, HIDDEN]]
    bwd = rec[rec["backward"]]
    assert {"bmm", "attention", "layernorm", "gelu", "softmax", "matmul"} <= set(bwd["op"])
    assert _find(bwd, op="matmul")["aten_op"].eq("aten::mm").all()  # inside AddmmBackward0
    assert (rec["n_repeats"] >= 1).all()


def test_real_cpu_trace_summary_and_validation(cpu_trace: Path) -> None:
    result = read_torch_trace(cpu_trace)
    skipped = result.rejected
    assert (skipped["reason"] == NO_EQUIVALENT_REASON).all()
    assert (skipped["count"] > 0).all() and skipped["name"].is_unique
    assert "aten::addmm" not in set(skipped["name"])  # covered by its linear, not skipped
    assert {"aten::view", "aten::transpose"} & set(skipped["name"])
    checked = check_op_records(result.records)
    assert checked.n_rejected == 0, checked.rejected
    assert checked.n_records == result.n_records


def test_gzip_trace_reads_the_same(cpu_trace: Path, tmp_path: Path) -> None:
    gz = tmp_path / "trace.json.gz"
    gz.write_bytes(gzip.compress(cpu_trace.read_bytes()))
    plain, packed = read_torch_trace(cpu_trace), read_torch_trace(gz)
    assert packed.records.drop(columns="source").equals(plain.records.drop(columns="source"))
    assert packed.records["source"].iloc[0] == "torch_trace:trace.json.gz"


def test_device_argument_overrides_cpu(cpu_trace: Path) -> None:
    assert set(read_torch_trace(cpu_trace, device="my-box").records["gpu"]) == {"my-box"}


# --------------------------------------------------------------------------- a GPU-style trace


def _op(name, ext, ts, dur, dims, types, tid=1, concrete=None):
    args = {"External id": ext, "Input Dims": dims, "Input type": types}
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _node(name, ts, dur, tid=2):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def _launch(corr, ts, ext=None, tid=1):
    args = {"correlation": corr, **({"External id": ext} if ext is not None else {})}
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 10, "tid": tid, "ts": ts, "dur": 2,
            "args": args}  # fmt: skip


def _kernel(ts, dur, ext=None, corr=None):
    args = {"device": 0, "stream": 7}
    if ext is not None:
        args["External id"] = ext
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": "sm90_gemm", "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


BF = "c10::BFloat16"


def gpu_trace(with_device: bool = True) -> dict:
    x, w, b = [16, 1024], [4096, 1024], [4096]
    ev = [
        # iteration 1: linear -> addmm -> launch (kernel linked by External id of addmm)
        _op("aten::linear", 1, 100, 50, [x, w, b], [BF, BF, BF]),
        _op("aten::addmm", 2, 105, 40, [b, x, [1024, 4096], [], []], [BF, BF, BF, "Scalar", "Scalar"]),
        _launch(500, 110, ext=2),
        _kernel(1000, 50.0, ext=2, corr=500),
        # iteration 2: same linear, 70 us, kernel linked by correlation only
        _op("aten::linear", 3, 200, 50, [x, w, b], [BF, BF, BF]),
        _op("aten::addmm", 4, 205, 40, [b, x, [1024, 4096], [], []], [BF, BF, BF, "Scalar", "Scalar"]),
        _launch(501, 210, ext=4),
        _kernel(1100, 70.0, corr=501),
        # softmax: kernel linked only by an ac2g flow to a launch without External id
        _op("aten::softmax", 5, 300, 20, [[16, 4096], [], []], [BF, "Scalar", ""], concrete=["", "-1", ""]),
        _launch(502, 305),
        {"ph": "s", "cat": "ac2g", "id": 502, "pid": 10, "tid": 1, "ts": 305, "name": "ac2g"},
        {"ph": "f", "cat": "ac2g", "id": 502, "pid": 0, "tid": 7, "ts": 1200, "name": "ac2g", "bp": "e"},
        _kernel(1200, 8.0),
        # an unmapped copy with a kernel: counted in the summary, not a record
        _op("aten::copy_", 6, 400, 10, [[16, 4096], [16, 4096], []], [BF, BF, "Scalar"]),
        _kernel(1300, 5.0, ext=6),
        # a mapped op that launched no kernel
        _op("aten::add", 7, 450, 5, [[4], [4], []], ["float", "float", "Scalar"]),
        # a kernel linked to nothing
        _kernel(1400, 3.0, ext=999),
        # backward thread: MmBackward0 -> aten::mm (two kernels: 30 + 10 us)
        _node("autograd::engine::evaluate_function: MmBackward0", 600, 100),
        _node("MmBackward0", 601, 90),
        _op("aten::mm", 8, 605, 50, [[16, 4096], [4096, 1024]], [BF, BF], tid=2),
        _kernel(1500, 30.0, ext=8),
        _kernel(1540, 10.0, ext=8),
    ]
    trace = {"schemaVersion": 1, "traceEvents": ev}
    if with_device:
        trace["deviceProperties"] = [{"id": 0, "name": H100, "totalGlobalMem": 85_000_000_000}]
    return trace


def test_gpu_trace_sums_kernels_and_links_all_ways(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(gpu_trace()))
    result = read_torch_trace(path)
    rec = result.records
    assert set(rec["timing"]) == {"gpu_kernels"} and set(rec["gpu"]) == {H100} and set(rec["dtype"]) == {"bf16"}
    lin = _find(rec, op="linear").iloc[0]
    assert [lin[c] for c in ("batch", "m", "n", "k")] == [1, 16, 4096, 1024]
    assert lin["n_repeats"] == 2 and lin["measured_ms"] == pytest.approx(0.060)
    assert (lin["measured_min_ms"], lin["measured_max_ms"]) == pytest.approx((0.050, 0.070))
    soft = _find(rec, op="softmax").iloc[0]
    assert soft["measured_ms"] == pytest.approx(0.008) and (soft["rows"], soft["cols"]) == (16, 4096)
    mm = _find(rec, op="matmul").iloc[0]
    assert bool(mm["backward"]) and mm["measured_ms"] == pytest.approx(0.040)
    assert [mm[c] for c in ("m", "n", "k")] == [16, 1024, 4096]
    assert len(rec) == 3
    rej = result.rejected.set_index("name")
    assert rej.loc["aten::copy_", "reason"] == NO_EQUIVALENT_REASON
    assert rej.loc["aten::copy_", "self_ms"] == pytest.approx(0.005)
    assert rej.loc["aten::add", "reason"] == "no GPU kernel launched by the op"
    assert rej.loc[UNLINKED_KERNELS, "count"] == 1
    checked = check_op_records(rec, resolve_gpu=resolve_gpu_name)
    assert checked.n_rejected == 0, checked.rejected
    assert set(checked.records["gpu"]) == {resolve_gpu_name(H100)}


def test_gpu_trace_device_name_and_override() -> None:
    assert set(parse_torch_trace(gpu_trace()).records["gpu"]) == {H100}  # from deviceProperties
    with pytest.raises(DatasetError, match="device="):
        parse_torch_trace(gpu_trace(with_device=False))
    rec = parse_torch_trace(gpu_trace(with_device=False), device="NVIDIA A100-SXM4-80GB").records
    assert set(rec["gpu"]) == {"NVIDIA A100-SXM4-80GB"}


def test_unreadable_shapes_and_dtypes_are_summarised() -> None:
    ev = [
        _op("aten::mm", 1, 0, 10, [[4, 8], [9, 3]], ["float", "float"]),  # inner sizes differ
        _op("aten::mm", 2, 20, 10, [[4, 8], [8, 3]], ["double", "double"]),  # no op-table dtype
        _op("aten::bmm", 3, 40, 10, "garbage", ["float", "float"]),
        _op("aten::relu", 4, 60, 10, [[4, 8]], ["c10::Half"]),
    ]
    result = parse_torch_trace({"traceEvents": ev})
    assert result.records[["op", "dtype"]].values.tolist() == [["relu", "fp16"]]
    reasons = dict(
        zip(result.rejected["name"] + "|" + result.rejected["reason"], result.rejected["count"], strict=True)
    )
    assert any("inner sizes differ" in k for k in reasons)
    assert any("'double' has no op-table dtype" in k for k in reasons)
    assert any("cannot read the input sizes" in k for k in reasons)


# --------------------------------------------------------------------------- errors


def test_truncated_and_invalid_files_raise_dataset_error(cpu_trace: Path, tmp_path: Path) -> None:
    data = cpu_trace.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match="cut.json"):
        read_torch_trace(cut)
    cut_gz = tmp_path / "cut.json.gz"
    cut_gz.write_bytes(gzip.compress(data)[:200])
    with pytest.raises(DatasetError, match="cut.json.gz"):
        read_torch_trace(cut_gz)
    with pytest.raises(DatasetError, match="no such file"):
        read_torch_trace(tmp_path / "absent.json")
    for name, content in [("list.json", "[1, 2]"), ("obj.json", '{"a": 1}'), ("str.json", '"x"')]:
        (tmp_path / name).write_text(content)
        with pytest.raises(DatasetError):
            read_torch_trace(tmp_path / name)


def test_trace_without_shapes_raises() -> None:
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5, "args": {}}]
    with pytest.raises(DatasetError, match="record_shapes=True"):
        parse_torch_trace({"traceEvents": ev})


# --------------------------------------------------------------------------- ATen mapping


@pytest.mark.parametrize(
    ("name", "dims", "concrete", "expected"),
    [
        ("aten::matmul", [[2, 3, 4, 5], [5, 6]], None, {"op": "matmul", "batch": 1, "m": 24, "n": 6, "k": 5}),
        ("aten::matmul", [[2, 3, 4, 5], [3, 5, 6]], None, {"op": "bmm", "batch": 6, "m": 4, "n": 6, "k": 5}),
        ("aten::matmul", [[5], [5, 6]], None, {"op": "matmul", "batch": 1, "m": 1, "n": 6, "k": 5}),
        ("aten::linear", [[8, 16], [32, 16], []], None, {"op": "matmul", "m": 8, "n": 32, "k": 16}),
        ("aten::baddbmm", [[4, 2, 3], [4, 2, 5], [4, 5, 3], [], []], None, {"op": "bmm", "batch": 4, "k": 5}),
        ("aten::pow", [[4, 8], []], ["", "2"], {"op": "pow", "rows": 4, "cols": 8, "scalar": True}),
        ("aten::mul", [[4, 1], [1, 8]], None, {"op": "mul", "rows": 4, "cols": 8, "scalar": False}),
        ("aten::softmax", [[2, 3, 8], [], []], ["", "1", ""], {"op": "softmax", "rows": 16, "cols": 3}),
        ("aten::layer_norm", [[2, 3, 8], [], [24], [24], []], ["", "[3, 8]", "", "", "1e-5"], {"cols": 24}),
        ("aten::embedding", [[50, 8], [2, 7], [], [], []], None, {"op": "embedding", "rows": 14, "cols": 8}),
        (
            "aten::scaled_dot_product_attention",
            [[2, 8, 16, 64], [2, 2, 32, 64], [2, 2, 32, 64], [], [], [], [], []],
            ["", "", "", "", "0.", "False", "", "True"],
            {"op": "attention", "batch": 2, "heads": 8, "kv_heads": 2, "seq_q": 16, "seq_kv": 32, "causal": False},
        ),
        ("aten::_scaled_dot_product_flash_attention", [[1, 4, 8, 32]] * 3, None, {"causal": False, "head_dim": 32}),
        ("aten::gelu_backward", [[4, 8], [4, 8]], None, {"op": "gelu", "backward": True}),
    ],
)
def test_map_aten_op(name: str, dims: list, concrete: list | None, expected: dict) -> None:
    row = map_aten_op(AtenCall(name, tuple(tuple(d) for d in dims), tuple(concrete) if concrete else None))
    assert row is not None
    assert {k: row.get(k) for k in expected} == expected


def test_map_aten_op_unmapped_and_bad() -> None:
    assert map_aten_op(AtenCall("aten::view", ((4, 8), ()))) is None
    with pytest.raises(AtenShapeError):
        map_aten_op(AtenCall("aten::mm", ((4, 8),)))
    with pytest.raises(AtenShapeError):
        map_aten_op(AtenCall("aten::relu", ((4, 0),)))
    assert dtype_from_input_type("c10::Float8_e4m3fn") == "fp8"
    assert dtype_from_input_type("long int") is None and dtype_from_input_type(None) is None


# --------------------------------------------------------------------------- fuzz

_NAMES = ["aten::mm", "aten::bmm", "aten::linear", "aten::addmm", "aten::matmul", "aten::softmax", "aten::add",
          "aten::mul", "aten::scaled_dot_product_attention", "aten::layer_norm", "aten::embedding", "aten::view",
          "MmBackward0", "aten::gelu_backward", "aten::rms_norm"]  # fmt: skip
_TYPES = ["float", "c10::BFloat16", "c10::Half", "double", "Scalar", "", "long int", "c10::Float8_e5m2"]
_numbers = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=3)
)
_dims = st.one_of(
    st.lists(st.lists(st.integers(-3, 2**64), max_size=5), max_size=6),
    st.lists(st.lists(st.integers(1, 64), min_size=0, max_size=4), max_size=8),
    st.text(max_size=5),
    st.none(),
)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_event = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "s", "f", "i", 3]),
        "cat": st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "ac2g", "Kernel", "user_annotation", None]),
        "name": st.one_of(st.sampled_from(_NAMES), st.text(max_size=6), st.integers()),
        "pid": st.one_of(st.integers(0, 2), st.text(max_size=2), st.lists(st.integers(), max_size=1)),
        "tid": st.one_of(st.integers(0, 2), st.none()),
        "ts": _numbers,
        "dur": _numbers,
        "id": st.one_of(st.integers(0, 5), st.none(), st.booleans()),
        "args": st.one_of(
            st.fixed_dictionaries(
                {
                    "External id": st.one_of(st.integers(0, 5), st.text(max_size=2), st.none(), st.booleans()),
                    "correlation": st.one_of(st.integers(0, 5), st.none(), st.lists(st.integers(), max_size=1)),
                    "device": st.one_of(st.integers(0, 2), st.none(), st.floats()),
                    "Input Dims": _dims,
                    "Input type": st.one_of(st.lists(st.sampled_from(_TYPES), max_size=6), st.integers()),
                    "Concrete Inputs": st.one_of(
                        st.lists(st.sampled_from(["", "True", "-1", "[8]", "x"]), max_size=8), st.none()
                    ),  # fmt: skip
                }
            ),
            _json,
        ),
    }
)
_plausible_event = st.builds(
    lambda cat, name, ts, dur, ext, dims, types, tid: {
        "ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
        "args": {"External id": ext, "correlation": ext, "device": 0, "Input Dims": dims, "Input type": types},
    },
    st.sampled_from(["cpu_op", "cpu_op", "cpu_op", "kernel", "cuda_runtime"]),
    st.sampled_from(_NAMES),
    st.floats(0, 100),
    st.floats(0, 50),
    st.integers(0, 5),
    st.lists(st.lists(st.integers(1, 8), max_size=4), max_size=4),
    st.lists(st.sampled_from(_TYPES), min_size=1, max_size=4),
    st.integers(0, 1),
)  # fmt: skip
_trace = st.fixed_dictionaries(
    {
        "traceEvents": st.lists(st.one_of(_plausible_event, _event, _json), max_size=25),
        "deviceProperties": st.one_of(
            st.lists(
                st.fixed_dictionaries({"id": st.integers(0, 2), "name": st.sampled_from([H100, "A100", " ", ""])}),
                max_size=2,
            ),
            _json,
        ),
    }
)
_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_dataset_errors(trace: object, device: str | None = None) -> None:
    try:
        result = parse_torch_trace(trace, device=device)
    except DatasetError:
        return
    assert list(result.records.columns) == list(RECORD_COLUMNS)
    checked = check_op_records(result.records) if len(result.records) else None
    if checked is not None:
        assert checked.n_rejected == 0, checked.rejected  # everything the reader emits is schema-valid


@_FUZZ
@given(_json)
def test_fuzz_random_json_only_raises_dataset_error(trace: object) -> None:
    _only_dataset_errors(trace)


def _x_event(cat: str, name: str, ext: int, dur: float, dims: list) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 0,
        "ts": 0.0,
        "dur": dur,
        "args": {"External id": ext, "correlation": ext, "device": 0, "Input Dims": dims, "Input type": ["float"]},
    }


_SUBNORMAL_KERNEL = {
    "traceEvents": [
        _x_event("cpu_op", "aten::mm", 0, 0.0, []),
        _x_event("cpu_op", "aten::softmax", 1, 0.0, [[]]),
        _x_event("kernel", "aten::mm", 1, 5e-324, []),
    ],
    "deviceProperties": [],
}
"""A kernel of 5e-324 us (subnormal): its time underflows to 0 ms, so the op is skipped, not emitted."""


@_FUZZ
@given(_trace, st.sampled_from([None, "dev"]))
@example(_SUBNORMAL_KERNEL, "dev")
def test_fuzz_random_events_only_raise_dataset_error(trace: dict, device: str | None) -> None:
    _only_dataset_errors(trace, device)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200), st.booleans())
def test_fuzz_random_bytes_only_raise_dataset_error(
    tmp_path_factory: pytest.TempPathFactory, data: bytes, gz: bool
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(data) if gz else data)
    try:
        read_torch_trace(path)
    except DatasetError:
        pass
