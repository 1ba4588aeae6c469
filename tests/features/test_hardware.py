"""Tests of perfcast.features.hardware: catalog, name resolution, peaks, ClusterSpec."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from fixtures.shared import SHARED_HARDWARE
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from perfcast.data.schema import DType
from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features.hardware import (
    DEFAULT_GPUS_PER_NODE,
    NVLINK_INTRA_NODE_LATENCY_US,
    PCIE_INTRA_NODE_LATENCY_US,
    ClusterSpec,
    FabricSpec,
    HardwareSpec,
    check_alias_index,
    descriptor_figures,
    list_fabrics,
    list_hardware,
    normalize_device_name,
    resolve_gpu_name,
)

# CSV column -> HardwareSpec field, for every numeric column of accelerators.csv.
ACCEL_NUMERIC = {
    "sm_or_cu_count": "sm_count",
    "boost_clock_mhz": "boost_clock_mhz",
    "peak_fp64_tflops": "peak_fp64_tflops",
    "peak_fp64_matrix_tflops": "peak_fp64_matrix_tflops",
    "peak_fp32_tflops": "peak_fp32_tflops",
    "peak_tf32_tflops": "peak_tf32_tflops",
    "peak_fp16_tflops": "peak_fp16_tflops",
    "peak_bf16_tflops": "peak_bf16_tflops",
    "peak_fp8_tflops": "peak_fp8_tflops",
    "peak_fp4_tflops": "peak_fp4_tflops",
    "peak_int8_tops": "peak_int8_tops",
    "mem_gib": "mem_gib",
    "mem_bw_gbps": "mem_bw_gbps",
    "l2_cache_mib": "l2_cache_mib",
    "tdp_w": "tdp_w",
    "intra_node_bw_gbps_per_gpu": "intra_node_bw_gbps",
    "pcie_gen": "pcie_gen",
    "typical_gpus_per_node": "typical_gpus_per_node",
    "release_year": "release_year",
}
ACCEL_TEXT = {
    "vendor": "vendor",
    "name": "name",
    "form_factor": "form_factor",
    "architecture": "architecture",
    "mem_type": "mem_type",
    "intra_node_link": "intra_node_link",
    "source": "source",
    "confidence": "confidence",
}
# CSV column -> (FabricSpec field, factor from the CSV unit to the field unit).
FABRIC_NUMERIC = {
    "per_port_line_rate_gbps": ("per_port_line_rate_gbitps", 1.0),
    "per_gpu_internode_gbytes_per_s_uni": ("per_gpu_bw_gbps", 1.0),
    "per_gpu_internode_gbps_uni": ("per_gpu_bw_gbps", 1 / 8),
    "node_internode_gbps_uni": ("node_bw_gbps", 1 / 8),
    "nics_or_ports_per_node": ("nics_or_ports_per_node", 1.0),
    "gpus_per_node": ("gpus_per_node", 1.0),
    "domain_size_gpus": ("domain_size_gpus", 1.0),
}


def _read_csv(name: str) -> list[dict[str, str]]:
    path = SHARED_HARDWARE / name
    if not path.is_file():
        pytest.skip(f"{path} not present (shared hardware folder absent)")
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _num(text: str) -> float | None:
    return float(text) if text.strip() else None


# ----------------------------------------------------------------------------- catalog


def test_catalog_has_at_least_30_accelerators_sorted_and_valid():
    specs = list_hardware()
    assert len(specs) >= 30
    assert [s.id for s in specs] == sorted(s.id for s in specs)
    for spec in specs:
        # round trip through the model: every entry validates as stored
        assert HardwareSpec.model_validate(spec.model_dump()) == spec
        assert spec.schema_version == 1
        assert spec.source
        assert spec.mem_gib > 0 and spec.mem_bw_gbps > 0


def test_every_default_fabric_exists_and_every_fabric_validates():
    fabric_ids = {f.id for f in list_fabrics()}
    assert len(fabric_ids) >= 10
    for spec in list_hardware():
        assert spec.default_fabric in fabric_ids, spec.id
    for fabric in list_fabrics():
        assert FabricSpec.model_validate(fabric.model_dump()) == fabric
        assert fabric.latency_us > 0


def test_alias_index_is_unambiguous_and_every_alias_resolves_to_its_entry():
    index = check_alias_index(list_hardware())
    for spec in list_hardware():
        for text in (spec.id, spec.name, *spec.aliases):
            assert resolve_gpu_name(text) == spec.id
            assert index[normalize_device_name(text)] == spec.id


@pytest.mark.shared_data
def test_every_accelerator_row_is_in_the_catalog_with_identical_figures():
    rows = _read_csv("accelerators.csv")
    catalog = {s.id: s for s in list_hardware()}
    assert {r["id"] for r in rows} == set(catalog)
    for row in rows:
        spec = catalog[row["id"]]
        for column, field in ACCEL_NUMERIC.items():
            assert getattr(spec, field) == _num(row[column]), (row["id"], column)
        for column, field in ACCEL_TEXT.items():
            assert (getattr(spec, field) or "") == row[column].strip(), (row["id"], column)
        assert spec.notes.startswith(row["notes"].strip()), row["id"]


@pytest.mark.shared_data
def test_every_fabric_row_is_in_the_catalog_with_identical_figures():
    rows = _read_csv("fabrics.csv")
    catalog = {f.id: f for f in list_fabrics()}
    assert {r["id"] for r in rows} == set(catalog)
    for row in rows:
        spec = catalog[row["id"]]
        for column, (field, factor) in FABRIC_NUMERIC.items():
            expected = _num(row[column])
            got = getattr(spec, field)
            if expected is None:
                if column != "per_gpu_internode_gbps_uni":
                    assert got is None, (row["id"], column)
                continue
            assert got == pytest.approx(expected * factor), (row["id"], column)
        assert spec.fabric == row["fabric"] and spec.scope == row["scope"]


# ----------------------------------------------------------------------- name lookup


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("AMD Instinct MI300X 192GB HBM3", "mi300x"),
        ("NVIDIA Blackwell GPU (B200-SXM-180GB)", "b200-hgx"),
        ("a100_sxm4_80gb", "a100-sxm4-80gb"),
        ("  nvidia a100-sxm4-80gb ", "a100-sxm4-80gb"),
        ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb"),
        ("NVIDIA_A100_80GB_PCIe", "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
        ("Tesla P100-PCIE-16GB", "p100-pcie-16gb"),
        ("Tesla P4", "p4"),
        ("Tesla T4", "t4"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("AMD Instinct MI210", "mi210"),
        ("AMD_Instinct_MI100", "mi100"),
        ("NVIDIA H200", "h200-sxm-141gb"),
        ("NVIDIA H200-SXM5-141GB", "h200-sxm-141gb"),
        ("NVIDIA GH200 480GB", "gh200-96gb-hbm3"),
        ("NVIDIA B200", "b200-hgx"),
        ("Intel(R) Gaudi(R) 2 AI Accelerator", "gaudi2"),
        ("Habana Gaudi2", "gaudi2"),
        ("TPU-trillium", "tpu-v6e"),
        ("TPU-v5p", "tpu-v5p"),
        ("a100", "a100-sxm4-80gb"),
        ("A100-80GB", "a100-sxm4-80gb"),
        ("h100", "h100-sxm5-80gb"),
        ("V100", "v100-sxm2-32gb"),
        ("mi300x", "mi300x"),
        ("mi250x", "mi250x-gcd"),
        # MLPerf system descriptions: a generic outside, the part in parentheses
        ("NVIDIA Blackwell GPU (GB200)", "gb200-per-gpu"),
        ("NVIDIA Blackwell Ultra GPU (GB300)", "gb300-per-gpu"),
        ("NVIDIA Blackwell Ultra GPU (B300-SXM-270GB)", "b300-hgx"),
        ("NVIDIA B300 SXM6 AC", "b300-hgx"),
        ("H100 80GB HBM3", "h100-sxm5-80gb"),
        ("AMD Instinct MI355X", "mi355x"),
        # family + form factor + memory (+ memory type) rules
        ("H100 SXM 80GB", "h100-sxm5-80gb"),
        ("h100 pcie 80 gb", "h100-pcie-80gb"),
        ("H100 80GB HBM2e", "h100-pcie-80gb"),  # the PCIe card is the HBM2e H100
        ("NVIDIA H100 NVL 94GB", "h100-nvl-94gb"),
        ("A100 SXM 40 GB", "a100-sxm4-40gb"),
        ("Tesla V100 SXM2 32GB", "v100-sxm2-32gb"),
        ("GH200 144GB HBM3e", "gh200-144gb-hbm3e"),
        ("B200 HGX 180G", "b200-hgx"),
        # published training tables: system descriptions in parentheses
        ("A100 40GB (1600 Gbps RoCE node-node)", "a100-sxm4-40gb"),
        ("A100 80GB (1600 Gbps RoCE node-node)", "a100-sxm4-80gb"),
        ("H100 SXM 80GB (DGX-H100)", "h100-sxm5-80gb"),
        ("H100 80GB (GCP A3, h100-80gb-8)", "h100-sxm5-80gb"),
        ("H200 (WhiteFiber, 400Gb/s RDMA per GPU)", "h200-sxm-141gb"),
        # cloud instance and accelerator types
        ("p4d.24xlarge", "a100-sxm4-40gb"),
        ("p5.48xlarge", "h100-sxm5-80gb"),
        ("a3-ultragpu-8g", "h200-sxm-141gb"),
        ("Standard_ND96isr_H100_v5", "h100-sxm5-80gb"),
        ("Standard_ND96isr_MI300X_v5", "mi300x"),
        ("nvidia-h100-80gb", "h100-sxm5-80gb"),
    ],
)
def test_resolve_gpu_name(name, expected):
    assert resolve_gpu_name(name) == expected
    assert HardwareSpec.from_name(name).id == expected


# Device spellings in ../shared/data of parts the catalog does not have, each with the
# catalog part it must NOT become (None: no part of its family is in the catalog).
NOT_IN_CATALOG = {
    "AMD MI25": None,
    "AMD Radeon RX 7900 XTX": None,
    "AMD Vega Frontier Edition 16GB": None,
    "AMD_Instinct_MI250": None,  # not the MI250X: 104 vs 110 CUs per package
    "NVIDIA A30": None,
    "NVIDIA GTX 1080 Ti": None,
    "NVIDIA GTX TitanXp": None,
    "NVIDIA GeForce RTX 4090": None,
    "NVIDIA L40": None,  # not the L40S
    "NVIDIA RTX A5000": None,
    "Nvidia Tesla M40": None,
    "Nvidia TitanX": None,
    "Nvidia TitanX Pascal": None,
    # Meta's Grand Teton H100: 96 GB HBM2e at 500 W, no sourced catalog row
    "NVIDIA H100-SXM5-96GB": "h100-sxm5-80gb",
    "H100 SXM 96GB HBM2e (500W, Grand Teton)": "h100-sxm5-80gb",
    "H100 SXM 95GB HBM2e (lower TDP)": "h100-sxm5-80gb",
}
_SHARED_GPU_COLUMNS = ("gpu", "accelerator_model_name", "gpu_in_config")


@pytest.mark.shared_data
def test_gpu_names_in_shared_data_resolve_when_in_the_catalog():
    """Every device spelling in ../shared/data resolves, except parts the catalog lacks."""
    import pandas as pd

    data_dir = SHARED_HARDWARE / ".." / "data"
    if not data_dir.is_dir():
        pytest.skip("shared data folder absent")
    names: set[str] = set()
    for path in sorted(data_dir.glob("*.csv*")):
        header = pd.read_csv(path, nrows=0).columns
        columns = [c for c in _SHARED_GPU_COLUMNS if c in header]
        if columns:
            frame = pd.read_csv(path, usecols=columns, dtype=str)
            names |= {v for c in columns for v in frame[c].dropna().unique()}
    assert len(names) > 40
    unresolved = set()
    for name in sorted(names):
        try:
            resolve_gpu_name(name)
        except UnknownEntryError as exc:
            unresolved.add(name)
            if NOT_IN_CATALOG.get(name):  # a known family: the error names the closest part
                assert f"closest known part: {NOT_IN_CATALOG[name]}" in str(exc)
    assert unresolved == set(NOT_IN_CATALOG) & names


def test_unknown_name_raises_with_suggestion():
    assert resolve_gpu_name("h100-sxm5-80g") == "h100-sxm5-80gb"  # "80G" is a memory spelling
    with pytest.raises(UnknownEntryError) as info:
        resolve_gpu_name("h100-sxm5-80gx")
    message = str(info.value)
    assert "'h100-sxm5-80gx'" in message
    assert "did you mean" in message and "h100-sxm5-80gb" in message
    # an UnknownEntryError is a SpecError and a KeyError
    with pytest.raises(SpecError):
        HardwareSpec.from_name("NVIDIA A30")
    with pytest.raises(KeyError):
        HardwareSpec.from_name("NVIDIA A30")


def test_parts_not_in_the_catalog_are_not_mapped_to_neighbours():
    for name in (
        "NVIDIA L40", "NVIDIA A30", "NVIDIA H100-SXM5-96GB", "AMD Instinct MI250",
        "H100 SXM 96GB HBM2e (500W, Grand Teton)", "H100 SXM 95GB HBM2e (lower TDP)", "H100 96GB",
        "V100-SXM3-32GB", "Tesla V100 SXM2 16GB", "A100 SXM4 80GB HBM2", "H100 SXM 80GB (DGX-H100) 500W",
        "NVIDIA A100-SXM-80GB 400W", "H200 SXM 96GB", "B200 192GB", "MI300A",
        "Foo (DGX-H100)",  # a part named outside the parentheses is not replaced by the one inside
    ):  # fmt: skip
        with pytest.raises(UnknownEntryError):
            resolve_gpu_name(name)


def test_unknown_figures_of_a_known_family_name_the_closest_part():
    with pytest.raises(UnknownEntryError) as info:
        resolve_gpu_name("H100 SXM 96GB HBM2e (500W, Grand Teton)")
    message = str(info.value)
    assert "no h100 entry has SXM 96 GB HBM2E" in message
    assert "closest known part: h100-sxm5-80gb" in message and "h100-nvl-94gb (94 GiB)" in message
    with pytest.raises(UnknownEntryError, match="closest known part: v100-sxm2-32gb"):
        resolve_gpu_name("V100-SXM3-32GB")


# --------------------------------------------------------------- generated name variants

_VENDOR_PREFIXES = {
    "NVIDIA": ("", "NVIDIA ", "Tesla ", "NVIDIA Tesla ", "nvidia_"),
    "AMD": ("", "AMD ", "Instinct ", "AMD Instinct ", "amd-"),
}
_SEPARATORS = (" ", "-", "_", " - ")


def _rule_parts(spec: HardwareSpec) -> tuple[str, str | None, str | None] | None:
    """``(family, form, memory)`` of ids written ``family[-form][-<n>gb]``, else None."""
    import re

    match = re.fullmatch(r"([a-z]+\d+[a-z]*)(?:-(sxm\d?|pcie|nvl|hgx))?(?:-(\d+)gb)?", spec.id)
    return match.groups() if match else None


@st.composite
def _name_variant(draw: st.DrawFn) -> tuple[str, str]:
    spec = draw(st.sampled_from(list_hardware()))
    parts = _rule_parts(spec)
    if parts is None:  # ids outside the family/form/memory pattern: spelling variants of the id
        words = spec.id.split("-")
    else:
        family, form, memory = parts
        words = [family]
        if form:
            words.append(draw(st.sampled_from([form, form.upper(), "SXM"] if form.startswith("sxm") else [form])))
        if memory:
            words.append(draw(st.sampled_from([f"{memory}GB", f"{memory} GB", f"{memory}G", f"{memory}gb"])))
        elif draw(st.booleans()):
            words.append(f"{round(spec.mem_gib)}GB")
        if spec.mem_type and spec.mem_type.startswith("HBM3") and form and draw(st.booleans()):
            words.append(spec.mem_type.split()[0])
    sep = draw(st.sampled_from(_SEPARATORS))
    text = sep.join(words)
    text = "".join(c.upper() if draw(st.booleans()) else c.lower() for c in text)
    prefix = draw(st.sampled_from(_VENDOR_PREFIXES.get(spec.vendor.upper(), ("",))))
    suffix = draw(st.sampled_from(["", " (DGX, 8x 400Gb/s)", " (1600 Gbps RoCE node-node)", " (lower TDP, 2024)"]))
    return spec.id, f"{prefix}{text}{suffix}"


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_name_variant())
def test_generated_name_variants_resolve_to_their_entry(case):
    hw_id, name = case
    assert resolve_gpu_name(name) == hw_id, name


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.sampled_from([s.id for s in list_hardware()]), st.sampled_from(["q", "zq", "qz9"]))
def test_unknown_name_gets_did_you_mean(hw_id, junk):
    name = hw_id + junk
    with pytest.raises(UnknownEntryError) as info:
        resolve_gpu_name(name)
    message = str(info.value)
    assert "did you mean" in message and hw_id in message, message


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_resolve_rejects_empty_or_non_string(bad):
    with pytest.raises(SpecError):
        resolve_gpu_name(bad)


def test_from_file_roundtrip_and_errors(tmp_path):
    spec = HardwareSpec.from_name("a100-sxm4-80gb")
    data = spec.model_dump(mode="json")
    data.update(id="my-gpu", name="My GPU", aliases=[], peak_bf16_tflops=100.0)
    path = tmp_path / "my-gpu.json"
    path.write_text(json.dumps(data))
    mine = HardwareSpec.from_file(path)
    assert mine.id == "my-gpu" and mine.peak_tflops("bf16") == 100.0

    data["mem_bw_gbps"] = -5
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="mem_bw_gbps"):
        HardwareSpec.from_file(path)
    data["mem_bw_gbps"] = 100.0
    data["colour"] = "green"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match="colour"):
        HardwareSpec.from_file(path)
    with pytest.raises(SpecError, match="no such file"):
        HardwareSpec.from_file(tmp_path / "missing.json")


def test_spec_is_frozen_and_forbids_extra_fields():
    spec = HardwareSpec.from_name("h100")
    with pytest.raises(ValidationError):
        spec.mem_gib = 1.0
    with pytest.raises(ValidationError):
        HardwareSpec.model_validate({**spec.model_dump(), "extra_field": 1})
    with pytest.raises(ValidationError, match="must be > 0"):
        HardwareSpec.model_validate({**spec.model_dump(), "peak_fp16_tflops": 0.0})


# ---------------------------------------------------------------------------- peaks


def test_peak_tflops_direct_figures():
    h100 = HardwareSpec.from_name("h100-sxm5-80gb")
    assert h100.peak_tflops(DType.FP32) == 67.0
    assert h100.peak_tflops("tf32") == 494.5
    assert h100.peak_tflops("fp16") == 989.5
    assert h100.peak_tflops("bf16") == 989.5
    assert h100.peak_tflops("fp8") == 1979.0
    assert h100.peak_tflops("bfloat16") == 989.5  # torch spelling via DType.parse


def test_tf32_falls_back_to_fp32_without_tf32():
    v100 = HardwareSpec.from_name("v100-sxm2-32gb")
    assert v100.peak_tf32_tflops is None
    assert v100.peak_tflops("tf32") == v100.peak_fp32_tflops == 15.7


def test_fp8_falls_back_to_16_bit_peak_without_fp8():
    a100 = HardwareSpec.from_name("a100-sxm4-80gb")
    assert a100.peak_fp8_tflops is None
    assert a100.peak_tflops("fp8") == 312.0
    v100 = HardwareSpec.from_name("v100-pcie-32gb")
    assert v100.peak_tflops("fp8") == v100.peak_fp16_tflops == 112.0


@pytest.mark.parametrize("hw_id", ["v100-pcie-32gb", "t4", "p100-pcie-16gb"])
def test_bf16_on_pre_ampere_nvidia_raises(hw_id):
    with pytest.raises(SpecError, match=f"bf16 is not supported on {hw_id}"):
        HardwareSpec.from_name(hw_id).peak_tflops("bf16")


def test_missing_figures_raise_naming_id_and_field():
    nvl = HardwareSpec.from_name("h100-nvl-94gb")
    with pytest.raises(SpecError, match=r"h100-nvl-94gb.*peak_bf16_tflops"):
        nvl.peak_tflops("bf16")
    tf32_fields = r"peak_tf32_tflops and peak_fp32_matrix_tflops and peak_fp32_tflops"
    with pytest.raises(SpecError, match=rf"h100-nvl-94gb.*{tf32_fields}"):
        nvl.peak_tflops("tf32")
    with pytest.raises(SpecError, match=r"tpu-v5e.*peak_fp32_tflops"):
        HardwareSpec.from_name("tpu-v5e").peak_tflops("fp32")
    with pytest.raises(SpecError, match="dtype="):
        nvl.peak_tflops("int4")


def test_vector_tflops_is_fp32_vector_peak():
    a100 = HardwareSpec.from_name("a100")
    assert a100.vector_tflops() == 19.5
    assert a100.vector_tflops("bf16") == 19.5
    with pytest.raises(SpecError, match="gaudi2.*peak_fp32_tflops"):
        HardwareSpec.from_name("gaudi2").vector_tflops()


def test_derived_properties():
    h100 = HardwareSpec.from_name("h100")
    assert h100.intra_node_bw_uni_gbps == 450.0
    assert h100.mem_bytes == 80 * 2**30
    assert HardwareSpec.from_name("tpu-v4").intra_node_bw_uni_gbps is None


# --------------------------------------------------------------------------- fabrics


def test_fabric_from_name_and_unknown():
    ndr = FabricSpec.from_name("IB_NDR_400_DGX_H100")
    assert ndr.id == "ib-ndr-400-dgx-h100"
    assert ndr.per_gpu_bw_gbps == 50.0 and ndr.per_port_line_rate_gbitps == 400.0
    with pytest.raises(UnknownEntryError, match="did you mean: ib-ndr-400"):
        FabricSpec.from_name("ib-ndr-400")


def test_fabric_per_gpu_bandwidth_rules():
    h100 = HardwareSpec.from_name("h100")
    gb200 = HardwareSpec.from_name("gb200")
    assert FabricSpec.from_name("ib-hdr-200-dgx-a100").per_gpu_bw_for(h100, 8) == 25.0
    # node figure shared by the documented node's GPUs: 7200 Gb/s / 8 bits / 8 GPUs
    assert FabricSpec.from_name("nvlink4-switch-system-256").per_gpu_bw_for(h100, 8) == 112.5
    # NVLink domain without per-GPU figures: the GPU's own NVLink per direction
    assert FabricSpec.from_name("nvl72-gb200").per_gpu_bw_for(gb200, 4) == 900.0
    # nothing but the line rate: one port per GPU
    assert FabricSpec.from_name("ib-xdr-800").per_gpu_bw_for(gb200, 4) == 100.0


# --------------------------------------------------------------------------- cluster


def test_cluster_build_defaults_h100():
    cluster = ClusterSpec.build("NVIDIA H100 80GB HBM3", 64)
    assert cluster.gpu.id == "h100-sxm5-80gb"
    assert cluster.gpus_per_node == 8 and cluster.num_nodes == 8
    assert cluster.intra_node_bw_gbps == 450.0
    assert cluster.inter_node_bw_gbps == 50.0
    assert cluster.inter_node_fabric == "ib-ndr-400-dgx-h100"
    assert cluster.intra_node_latency_us == NVLINK_INTRA_NODE_LATENCY_US
    assert cluster.inter_node_latency_us == FabricSpec.from_name("ib-ndr-400-dgx-h100").latency_us


def test_cluster_build_caps_gpus_per_node_and_uses_fallback_default():
    small = ClusterSpec.build("a100", 4)
    assert small.gpus_per_node == 4 and small.num_nodes == 1
    assert ClusterSpec.build("a100", 4, gpus_per_node=8).gpus_per_node == 4
    t4 = ClusterSpec.build("t4", 16)  # PCIe card: no typical_gpus_per_node
    assert t4.gpus_per_node == DEFAULT_GPUS_PER_NODE and t4.num_nodes == 2
    assert t4.intra_node_bw_gbps == 16.0 and t4.intra_node_latency_us == PCIE_INTRA_NODE_LATENCY_US
    gb200 = ClusterSpec.build("gb200", 72)
    assert gb200.gpus_per_node == 4 and gb200.inter_node_fabric == "ib-ndr-400-gb200-nvl72"


def test_cluster_build_with_explicit_fabric_and_spec():
    h100 = HardwareSpec.from_name("h100")
    cluster = ClusterSpec.build(h100, 16, gpus_per_node=8, inter_node="roce-400gbe")
    assert cluster.inter_node_fabric == "roce-400gbe"
    assert cluster.inter_node_bw_gbps == 50.0
    assert cluster.inter_node_latency_us == FabricSpec.from_name("roce-400gbe").latency_us


def test_cluster_build_validation_messages():
    with pytest.raises(SpecError, match="num_gpus=12 is not a multiple of gpus_per_node=8"):
        ClusterSpec.build("h100", 12)
    with pytest.raises(SpecError, match="num_gpus=0 must be an integer >= 1"):
        ClusterSpec.build("h100", 0)
    with pytest.raises(SpecError, match="gpus_per_node=0 must be an integer >= 1"):
        ClusterSpec.build("h100", 8, gpus_per_node=0)
    with pytest.raises(UnknownEntryError, match="inter_node='ib-foo'"):
        ClusterSpec.build("h100", 8, inter_node="ib-foo")
    with pytest.raises(UnknownEntryError):
        ClusterSpec.build("no-such-gpu", 8)
    with pytest.raises(SpecError, match="tpu-v4 has no intra_node_bw_gbps"):
        ClusterSpec.build("tpu-v4", 8)


def test_cluster_direct_construction_validates():
    h100 = HardwareSpec.from_name("h100")
    base = dict(
        gpu=h100,
        num_gpus=16,
        gpus_per_node=8,
        intra_node_bw_gbps=450.0,
        inter_node_bw_gbps=50.0,
        intra_node_latency_us=3.0,
        inter_node_latency_us=5.0,
    )
    assert ClusterSpec(**base).num_nodes == 2
    with pytest.raises(ValidationError, match="num_gpus=12 is not a multiple of gpus_per_node=8"):
        ClusterSpec(**{**base, "num_gpus": 12})
    with pytest.raises(ValidationError, match="num_gpus=0 must be >= 1"):
        ClusterSpec(**{**base, "num_gpus": 0})
    with pytest.raises(ValidationError, match="gpus_per_node=0 must be >= 1"):
        ClusterSpec(**{**base, "gpus_per_node": 0})
    with pytest.raises(ValidationError, match="inter_node_bw_gbps"):
        ClusterSpec(**{**base, "inter_node_bw_gbps": 0.0})
    with pytest.raises(ValidationError):
        ClusterSpec(**{**base, "bogus": 1})


@pytest.mark.shared_data
def test_committed_catalog_matches_a_fresh_build(tmp_path):
    """The package data is what scripts/build_catalog.py makes from the shared CSVs."""
    import importlib.util

    _read_csv("accelerators.csv")  # skips when the shared folder is absent
    script = Path(__file__).resolve().parents[2] / "scripts" / "build_catalog.py"
    spec = importlib.util.spec_from_file_location("build_catalog", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build(SHARED_HARDWARE.resolve(), catalog_dir=tmp_path)
    package_dir = Path(__file__).resolve().parents[2] / "src" / "perfcast" / "features" / "catalog"
    for kind in ("accelerators", "fabrics"):
        fresh = {p.name: p.read_text() for p in (tmp_path / kind).glob("*.json")}
        committed = {p.name: p.read_text() for p in (package_dir / kind).glob("*.json")}
        assert fresh == committed, f"{kind} catalog is stale: rerun scripts/build_catalog.py"


def test_descriptor_figures_fill_what_the_catalog_lacks_from_the_nearest_same_vendor_entry():
    gb200 = HardwareSpec.from_name("gb200-per-gpu")
    assert gb200.sm_count is None and gb200.l2_cache_mib is None  # no vendor source gave them
    figures = descriptor_figures(gb200)
    # the nearest NVIDIA entry with the figures by tensor peak and bandwidth is the B200 (sourced)
    b200 = HardwareSpec.from_name("b200-hgx")
    assert b200.sm_count == 148 and b200.l2_cache_mib == 126.5
    assert figures["sm_count"] == b200.sm_count and figures["l2_cache_mib"] == b200.l2_cache_mib
    assert figures["tdp_w"] == gb200.tdp_w and figures["peak_fp32_tflops"] == gb200.peak_fp32_tflops
    assert HardwareSpec.from_name("gb200-per-gpu").sm_count is None  # the catalog entry is unchanged
    # an AMD part borrows from AMD, never from NVIDIA: the MI250X die takes the MI210's board power
    assert descriptor_figures(HardwareSpec.from_name("mi250x-gcd"))["tdp_w"] == HardwareSpec.from_name("mi210").tdp_w


def test_descriptor_figures_keep_known_figures_and_nan_where_no_peer_has_one():
    h100 = HardwareSpec.from_name("h100-sxm5-80gb")
    assert dict(descriptor_figures(h100)) == {
        "sm_count": h100.sm_count, "l2_cache_mib": h100.l2_cache_mib, "tdp_w": h100.tdp_w,
        "peak_fp32_tflops": h100.peak_fp32_tflops, "boost_clock_mhz": h100.boost_clock_mhz,
    }  # fmt: skip
    tpu = descriptor_figures(HardwareSpec.from_name("tpu-v5p"))
    assert tpu["sm_count"] == 2 and math.isnan(tpu["l2_cache_mib"])  # no Google entry states an L2


def test_one_malformed_user_hardware_file_is_skipped_with_one_warning(tmp_path, monkeypatch, caplog):
    import logging

    from perfcast.features import hardware

    good = HardwareSpec.from_name("h100-sxm5-80gb").model_dump(mode="json")
    (tmp_path / "my-gpu.json").write_text(json.dumps({**good, "id": "my-gpu", "name": "My GPU", "aliases": []}))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "shadow.json").write_text(json.dumps(good))  # reuses a shipped id
    monkeypatch.setenv(hardware.USER_HARDWARE_ENV, str(tmp_path))
    for cached in (hardware._load_hardware, hardware._alias_index, hardware._suggestion_candidates):
        cached.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="perfcast.features.hardware"):
            assert hardware.resolve_gpu_name("my-gpu") == "my-gpu"
            assert hardware.resolve_gpu_name("NVIDIA H100 80GB HBM3") == "h100-sxm5-80gb"
            hardware.resolve_gpu_name("a100-sxm4-80gb")
        skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
        assert len(skipped) == 3  # once per bad file, not once per lookup
        assert any("broken.json" in m and "invalid JSON" in m for m in skipped)
        assert any("binary.json" in m for m in skipped)
        assert any("shadow.json" in m and "shadows a catalog entry" in m for m in skipped)
    finally:
        monkeypatch.delenv(hardware.USER_HARDWARE_ENV)
        for cached in (hardware._load_hardware, hardware._alias_index, hardware._suggestion_candidates):
            cached.cache_clear()


def test_amd_fp32_gemms_run_at_the_matrix_rate_the_catalog_notes_state():
    mi210 = HardwareSpec.from_name("mi210")
    assert mi210.peak_fp32_matrix_tflops == 45.3 and mi210.peak_tflops("fp32") == 45.3
    assert mi210.vector_tflops("fp32") == mi210.peak_fp32_tflops == 22.6  # vector ops keep the vector rate
    h100 = HardwareSpec.from_name("h100-sxm5-80gb")
    assert h100.peak_fp32_matrix_tflops is None and h100.peak_tflops("fp32") == h100.peak_fp32_tflops
