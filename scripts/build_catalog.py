"""Build perfcast's hardware catalog (package data) from the shared datasheet CSVs.

Reads ``accelerators.csv`` and ``fabrics.csv`` (see the README beside them for units and
conventions) and writes one JSON file per row:

* ``src/perfcast/features/catalog/accelerators/<id>.json`` (a :class:`HardwareSpec`)
* ``src/perfcast/features/catalog/fabrics/<id>.json`` (a :class:`FabricSpec`)

The datasheet figures are copied unchanged (empty cell -> ``null``); only column names
change where the spec's field name differs (``sm_or_cu_count`` -> ``sm_count``,
``intra_node_bw_gbps_per_gpu`` -> ``intra_node_bw_gbps``, the fabric columns below).
Curated fields that are not datasheet figures come from the tables in this script:
``aliases`` (device names and cloud instance types), ``default_fabric`` and
``nvlink_bridge_bw_gbps`` for accelerators, ``latency_us`` and ``confidence`` for
fabrics. Every entry is validated by the spec model before it is written, and JSON files
whose id is no longer in the CSV are removed, so the catalog is exactly the CSV.

Usage (from the repository root)::

    .venv/bin/python scripts/build_catalog.py [HARDWARE_DIR]

``HARDWARE_DIR`` defaults to ``../shared/hardware`` relative to the repository root.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger("build_catalog")

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_HARDWARE_DIR = REPO_ROOT / ".." / "shared" / "hardware"
CATALOG_DIR = REPO_ROOT / "src" / "perfcast" / "features" / "catalog"
SCHEMA_VERSION = 1

# --------------------------------------------------------------------------------------
# Column typing of accelerators.csv -> HardwareSpec fields.
# --------------------------------------------------------------------------------------
_ACCEL_RENAME = {
    "sm_or_cu_count": "sm_count",
    "intra_node_bw_gbps_per_gpu": "intra_node_bw_gbps",
}
_ACCEL_INT = {"sm_or_cu_count", "pcie_gen", "typical_gpus_per_node", "release_year"}
_ACCEL_FLOAT = {
    "boost_clock_mhz",
    "peak_fp64_tflops",
    "peak_fp64_matrix_tflops",
    "peak_fp32_tflops",
    "peak_tf32_tflops",
    "peak_fp16_tflops",
    "peak_bf16_tflops",
    "peak_fp8_tflops",
    "peak_fp4_tflops",
    "peak_int8_tops",
    "mem_gib",
    "mem_bw_gbps",
    "l2_cache_mib",
    "tdp_w",
    "intra_node_bw_gbps_per_gpu",
}
_ACCEL_STR = {
    "id",
    "vendor",
    "name",
    "form_factor",
    "architecture",
    "mem_type",
    "intra_node_link",
    "source",
    "confidence",
}
# Columns folded into other fields: the capacity unit goes into ``notes``; the direction
# must be "bidirectional" (HardwareSpec.intra_node_bw_gbps is bidirectional by definition).
_ACCEL_FOLDED = {"notes", "mem_capacity_unit_as_stated", "intra_node_bw_direction"}

# --------------------------------------------------------------------------------------
# Column typing of fabrics.csv -> FabricSpec fields.
# ``per_port_line_rate_gbps`` is in Gb/s (bits), so the field is named ``..._gbitps``;
# ``per_gpu_bw_gbps`` and ``node_bw_gbps`` are GB/s (bytes), one direction.
# ``per_gpu_internode_gbps_uni`` (Gb/s) is the same figure as the GB/s column x 8 and is
# not kept twice; ``node_internode_gbps_uni`` (Gb/s) is converted to GB/s (/ 8).
# --------------------------------------------------------------------------------------
_FABRIC_RENAME = {
    "per_port_line_rate_gbps": "per_port_line_rate_gbitps",
    "per_gpu_internode_gbytes_per_s_uni": "per_gpu_bw_gbps",
}
_FABRIC_INT = {"nics_or_ports_per_node", "gpus_per_node", "domain_size_gpus"}
_FABRIC_FLOAT = {"per_port_line_rate_gbps", "per_gpu_internode_gbytes_per_s_uni"}
_FABRIC_STR = {"id", "fabric", "scope", "lane_config", "example_system", "source", "notes"}
_FABRIC_DROPPED = {"per_gpu_internode_gbps_uni"}  # duplicate of the GB/s column in bits
_BITS_PER_BYTE = 8.0

# --------------------------------------------------------------------------------------
# Curated: device-name aliases.
# Strings as torch.cuda.get_device_name / nvidia-smi / rocm-smi / hl-smi / JAX
# device_kind print them, the spellings found in ../shared/data (NeuSight, DeepBench,
# MLPerf ``accelerator_model_name``, vTrain, Vidur) and short names. The catalog ``name``
# column is indexed as well and need not be repeated here. Lookups ignore case, spacing,
# punctuation and a leading vendor word (NVIDIA, Tesla, AMD, Instinct, Intel, Habana,
# Google), so "NVIDIA_A100-PCIE-40GB" needs no alias of its own.
# Short names pick the part a training user most likely means: the SXM/OAM flagship with
# the larger memory ("a100" -> A100 SXM4 80GB, "v100" -> V100 SXM2 32GB); "mi250x" is the
# GCD, which is what ROCm/PyTorch expose as one device. Names of parts not in the catalog
# (A30, L40, H100-SXM5-96GB, MI250, consumer cards) are deliberately not mapped to a
# neighbour: their figures differ.
# --------------------------------------------------------------------------------------
ALIASES: dict[str, tuple[str, ...]] = {
    "p4": ("Tesla P4", "NVIDIA Tesla P4"),
    "p100-pcie-16gb": ("Tesla P100-PCIE-16GB", "NVIDIA Tesla P100", "p100", "p100-16gb"),
    "v100-pcie-32gb": ("Tesla V100-PCIE-32GB", "v100-pcie"),
    "v100-sxm2-32gb": ("Tesla V100-SXM2-32GB", "NVIDIA V100", "v100", "v100-32gb", "v100-sxm2"),
    "t4": ("Tesla T4", "NVIDIA T4"),
    "a10": ("NVIDIA A10",),
    "a40": ("NVIDIA A40",),
    "l4": ("NVIDIA L4",),
    "l40s": ("NVIDIA L40S",),
    "a100-pcie-40gb": ("NVIDIA A100-PCIE-40GB", "a100-pcie-40g"),
    "a100-sxm4-40gb": ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM-40GB", "a100-40gb", "a100-sxm-40gb"),
    "a100-pcie-80gb": (
        "NVIDIA A100 80GB PCIe",
        "NVIDIA A100-PCIe-80GB",
        "NVIDIA A100 - PCIe - 80 GB",
        "a100-80gb-pcie",
    ),
    "a100-sxm4-80gb": (
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-SXM-80GB",
        "NVIDIA A100-SXM-80GB CTS",
        "a100",
        "a100-80gb",
        "a100-sxm",
        "a100-sxm4",
    ),
    "h100-pcie-80gb": ("NVIDIA H100 PCIe", "NVIDIA H100-PCIe-80GB", "h100-pcie"),
    "h100-sxm5-80gb": (
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100-SXM5-80GB",
        "NVIDIA H100-SXM-80GB",
        "h100",
        "h100-80gb",
        "h100-sxm",
        "h100-sxm5",
    ),
    "h100-nvl-94gb": ("NVIDIA H100 NVL", "h100-nvl"),
    "h200-sxm-141gb": ("NVIDIA H200", "NVIDIA H200-SXM5-141GB", "NVIDIA H200 141GB HBM3e", "h200", "h200-sxm"),
    "h200-nvl-141gb": ("NVIDIA H200 NVL", "h200-nvl"),
    "gh200-96gb-hbm3": ("NVIDIA GH200 480GB", "gh200", "gh200-96gb"),
    "gh200-144gb-hbm3e": ("NVIDIA GH200 144G HBM3e", "gh200-144gb"),
    "b200-hgx": ("NVIDIA Blackwell GPU (B200-SXM-180GB)", "NVIDIA B200", "B200-SXM-180GB", "b200", "b200-sxm"),
    "gb200-per-gpu": ("NVIDIA GB200", "gb200"),
    # "270GB": the capacity NVIDIA's MLPerf system descriptions state; SXM6-AC: the SKU name
    # (both cited in the row's sources)
    "b300-hgx": ("NVIDIA B300", "b300", "b300-sxm", "B300-SXM-270GB", "NVIDIA B300 SXM6 AC"),
    "gb300-per-gpu": ("NVIDIA GB300", "gb300"),
    "mi100": ("AMD Instinct MI100",),
    "mi210": ("AMD Instinct MI210",),
    "mi250x-package": ("mi250x-oam", "AMD Instinct MI250X OAM package"),
    "mi250x-gcd": ("AMD Instinct MI250X", "mi250x"),
    "mi300x": (
        "AMD Instinct MI300X",
        "AMD Instinct MI300X OAM",
        "AMD Instinct MI300X VF",
        "AMD Instinct MI300X 192GB HBM3",
    ),
    "mi325x": ("AMD Instinct MI325X", "AMD Instinct MI325X OAM"),
    "mi350x": ("AMD Instinct MI350X",),
    "mi355x": ("AMD Instinct MI355X",),
    "gaudi2": ("Habana Gaudi2", "Intel Gaudi2", "Intel(R) Gaudi(R) 2 AI Accelerator", "HL-225"),
    "gaudi3": ("Intel Gaudi 3", "Intel Gaudi3", "Intel(R) Gaudi(R) 3 AI Accelerator", "HL-325L"),
    "tpu-v4": ("TPU v4", "tpuv4"),
    "tpu-v5e": ("TPU-v5e", "TPU v5 lite", "TPU v5e", "v5litepod"),
    "tpu-v5p": ("TPU-v5p", "TPU v5p", "TPU v5"),
    "tpu-v6e": ("TPU-trillium", "TPU v6 lite", "TPU v6e", "trillium"),
}

# --------------------------------------------------------------------------------------
# Curated: cloud instance types and accelerator types whose GPUs are one catalog part,
# added to the part's aliases: AWS EC2 instance types, Google Cloud machine and
# accelerator types, Azure VM sizes (without the "Standard_" prefix, which lookups
# drop). Only types with one GPU part; GCP's "nvidia-tesla-a100" (A100 40GB) is not
# listed, since it normalizes to the short name "a100" (the 80 GB part).
# --------------------------------------------------------------------------------------
CLOUD_INSTANCE_TYPES: dict[str, tuple[str, ...]] = {
    "a100-sxm4-40gb": (
        "p4d.24xlarge", "a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g", "a2-highgpu-8g", "a2-megagpu-16g",
        "ND96asr_v4",
    ),
    "a100-sxm4-80gb": (
        "p4de.24xlarge", "a2-ultragpu-1g", "a2-ultragpu-2g", "a2-ultragpu-4g", "a2-ultragpu-8g",
        "ND96amsr_A100_v4", "nvidia-a100-80gb",
    ),
    "h100-sxm5-80gb": (
        "p5.48xlarge", "a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g", "a3-highgpu-8g", "a3-megagpu-8g",
        "a3-edgegpu-8g", "ND96isr_H100_v5", "ND_H100_v5", "nvidia-h100-mega-80gb",
    ),
    "h200-sxm-141gb": ("p5e.48xlarge", "p5en.48xlarge", "a3-ultragpu-8g", "ND96isr_H200_v5", "ND_H200_v5",
                       "nvidia-h200-141gb"),
    "b200-hgx": ("p6-b200.48xlarge", "a4-highgpu-8g"),
    "gb200-per-gpu": ("a4x-highgpu-4g",),
    "mi300x": ("ND96isr_MI300X_v5", "ND_MI300X_v5"),
}  # fmt: skip

# --------------------------------------------------------------------------------------
# Curated: default inter-node fabric per accelerator.
# Rule: the scale-out NIC layout of the part's reference system.
#   * A100 SXM4 (DGX A100)                         -> ib-hdr-200-dgx-a100
#   * H100/H200 SXM and GH200 (DGX H100/H200)      -> ib-ndr-400-dgx-h100
#   * B200/B300 HGX (DGX B200; B300 is often XDR 800, but that per-GPU layout is not
#     verified in fabrics.csv, so NDR 400 is the conservative default) -> ib-ndr-400-dgx-b200
#   * GB200/GB300 per-GPU rows (NVL72 compute trays) -> ib-ndr-400-gb200-nvl72
#   * Gaudi2 / Gaudi3                               -> their integrated RoCE rows
#   * TPU v5e / v5p                                 -> their DCN rows; v6e uses the v5e
#     DCN row (same 8-chip host) and v4 the v5p row (same 4-chip host) as proxies, since
#     fabrics.csv has no v4/v6e DCN figures
#   * AMD MI300X and later (8-GPU OAM UBB)          -> roce-400gbe
#   * AMD MI100/MI210/MI250X                        -> roce-200gbe
#   * NVIDIA PCIe cards, NVL bridged parts and pre-Ampere SXM -> ib-edr-100
# --------------------------------------------------------------------------------------
DEFAULT_FABRIC: dict[str, str] = {
    "p4": "ib-edr-100",
    "p100-pcie-16gb": "ib-edr-100",
    "v100-pcie-32gb": "ib-edr-100",
    "v100-sxm2-32gb": "ib-edr-100",
    "t4": "ib-edr-100",
    "a10": "ib-edr-100",
    "a40": "ib-edr-100",
    "l4": "ib-edr-100",
    "l40s": "ib-edr-100",
    "a100-pcie-40gb": "ib-edr-100",
    "a100-sxm4-40gb": "ib-hdr-200-dgx-a100",
    "a100-pcie-80gb": "ib-edr-100",
    "a100-sxm4-80gb": "ib-hdr-200-dgx-a100",
    "h100-pcie-80gb": "ib-edr-100",
    "h100-sxm5-80gb": "ib-ndr-400-dgx-h100",
    "h100-nvl-94gb": "ib-edr-100",
    "h200-sxm-141gb": "ib-ndr-400-dgx-h100",
    "h200-nvl-141gb": "ib-edr-100",
    "gh200-96gb-hbm3": "ib-ndr-400-dgx-h100",
    "gh200-144gb-hbm3e": "ib-ndr-400-dgx-h100",
    "b200-hgx": "ib-ndr-400-dgx-b200",
    "gb200-per-gpu": "ib-ndr-400-gb200-nvl72",
    "b300-hgx": "ib-ndr-400-dgx-b200",
    "gb300-per-gpu": "ib-ndr-400-gb200-nvl72",
    "mi100": "roce-200gbe",
    "mi210": "roce-200gbe",
    "mi250x-package": "roce-200gbe",
    "mi250x-gcd": "roce-200gbe",
    "mi300x": "roce-400gbe",
    "mi325x": "roce-400gbe",
    "mi350x": "roce-400gbe",
    "mi355x": "roce-400gbe",
    "gaudi2": "roce-100gbe-gaudi2",
    "gaudi3": "roce-200gbe-gaudi3",
    "tpu-v4": "tpu-v5p-dcn",
    "tpu-v5e": "tpu-v5e-dcn",
    "tpu-v5p": "tpu-v5p-dcn",
    "tpu-v6e": "tpu-v5e-dcn",
}

# --------------------------------------------------------------------------------------
# Curated: small-message latency per fabric kind, microseconds.
# ASSUMPTIONS, not measurements: the alpha term of an alpha-beta collective model, i.e.
# the end-to-end NCCL point-to-point latency of one hop, not the wire latency.
#   * InfiniBand: RDMA verbs ~1-2 us plus NCCL proxy/protocol overhead -> about 5 us
#     (nccl-tests small-message latencies across two nodes are typically a few us).
#   * RoCE v2: as InfiniBand plus Ethernet switch hops and congestion control -> 8 us.
#   * TPU DCN: host data-center network through the host stack, not RDMA -> 25 us.
#   * NVLink scale-up domains (NVLink Switch System, NVL72): as intra-node NVLink, ~3 us.
# --------------------------------------------------------------------------------------
LATENCY_US_BY_KIND: dict[str, float] = {
    "infiniband": 5.0,
    "roce": 8.0,
    "dcn": 25.0,
    "nvlink": 3.0,
}

# --------------------------------------------------------------------------------------
# Curated: bidirectional per-GPU bandwidth of the OPTIONAL NVLink bridge of PCIe cards,
# GB/s (HardwareSpec.nvlink_bridge_bw_gbps). Not a CSV column: the CSV gives these cards'
# PCIe figure as intra_node_bw and states the bridge in its notes ("Optional NVLink bridge
# (600 GB/s per NVIDIA ...)" for A100 PCIe 40/80 GB, "Optional NVLink bridge 600 GB/s
# (NVIDIA table)" for H100 PCIe). Cards whose scale-up link IS the bridge (A40, H100/H200
# NVL) already carry it as intra_node_bw.
# --------------------------------------------------------------------------------------
NVLINK_BRIDGE_BW_GBPS: dict[str, float] = {
    "a100-pcie-40gb": 600.0,
    "a100-pcie-80gb": 600.0,
    "h100-pcie-80gb": 600.0,
}

# Derived: GPUs of one NVLink domain (HardwareSpec.nvlink_domain_gpus) where it is larger
# than the node: the CSV states the rack-scale domain in intra_node_link ("NVLink 5 via
# NVLink Switch trays (NVL72 domain)" for GB200 and GB300, whose compute tray holds 4 GPUs),
# and fabrics.csv gives the same domain as nvl72-gb200/nvl72-gb300 domain_size_gpus = 72.
# Other parts: the node is the domain (null).
NVLINK_DOMAIN_PATTERN = re.compile(r"\bNVL(\d+) domain\b")


def nvlink_domain_gpus(row: dict[str, str]) -> int | None:
    """GPUs of the part's NVLink domain when its intra_node_link names a rack domain (NVL72)."""
    found = NVLINK_DOMAIN_PATTERN.search(row.get("intra_node_link", ""))
    return int(found.group(1)) if found else None


# Curated: dense fp32 rate of the matrix (MFMA) path of AMD CDNA1/2 parts, TFLOP/s
# (HardwareSpec.peak_fp32_matrix_tflops). Not a CSV column: the CSV's peak_fp32 is the vector
# rate, and its notes state the matrix rate, which AMD's GEMM libraries use for fp32 GEMMs:
# mi100 "Matrix FP32 46.1 TFLOPS (packed/matrix) not in peak_fp32 column", mi210
# "Packed/matrix FP32 45.3", mi250x-package "Packed FP32 = 95.7"; mi250x-gcd is half the
# package, as its notes state for every per-GCD figure. CDNA3/4 parts' fp32 column already
# is their fp32 matrix rate or higher.
FP32_MATRIX_TFLOPS: dict[str, float] = {
    "mi100": 46.1,
    "mi210": 45.3,
    "mi250x-package": 95.7,
    "mi250x-gcd": 47.85,
}


# Curated: fabric confidence, only where the CSV notes or its README state it
# (ib-ndr-400-gb200-nvl72: "LOW CONFIDENCE" in its notes; nvl72-gb300: verda.com, the
# README's weakest source). Other rows: not stated (null).
FABRIC_CONFIDENCE: dict[str, str] = {
    "ib-ndr-400-gb200-nvl72": "low",
    "nvl72-gb300": "low",
}


class CatalogBuildError(Exception):
    """A CSV row or a curated table entry that cannot become a catalog entry."""


def fabric_kind(fabric_id: str) -> str:
    """Return the latency kind of a fabric id: ``infiniband``, ``roce``, ``dcn`` or ``nvlink``."""
    if fabric_id.startswith("ib-"):
        return "infiniband"
    if fabric_id.startswith("roce-"):
        return "roce"
    if fabric_id.endswith("-dcn"):
        return "dcn"
    if fabric_id.startswith(("nvlink", "nvl")):
        return "nvlink"
    raise CatalogBuildError(f"fabric id={fabric_id!r} matches no latency kind; extend fabric_kind()")


def parse_cell(value: str, kind: type, column: str, row_id: str) -> Any:
    """Convert one CSV cell: empty -> None, else ``kind`` (int cells must be whole numbers)."""
    text = value.strip()
    if not text:
        return None
    try:
        number = float(text) if kind in (int, float) else text
    except ValueError:
        raise CatalogBuildError(f"{row_id}: column {column}={text!r} is not a number") from None
    if kind is int:
        if not float(number).is_integer():
            raise CatalogBuildError(f"{row_id}: column {column}={text!r} is not a whole number")
        return int(number)
    return number


def read_rows(path: Path) -> list[dict[str, str]]:
    """Read a CSV file into a list of row dicts."""
    if not path.is_file():
        raise CatalogBuildError(f"{path} does not exist")
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def _typed(
    row: dict[str, str], ints: set[str], floats: set[str], strs: set[str], rename: dict[str, str]
) -> dict[str, Any]:
    """Type the listed columns of ``row`` and rename them to spec field names."""
    out: dict[str, Any] = {}
    for column, kind in [(c, int) for c in ints] + [(c, float) for c in floats] + [(c, str) for c in strs]:
        if column not in row:
            raise CatalogBuildError(f"{row.get('id')}: column {column!r} missing from the CSV")
        out[rename.get(column, column)] = parse_cell(row[column], kind, column, row.get("id", "?"))
    return out


def accelerator_entry(row: dict[str, str]) -> dict[str, Any]:
    """Turn one accelerators.csv row into the JSON dict of a HardwareSpec."""
    unknown = set(row) - _ACCEL_INT - _ACCEL_FLOAT - _ACCEL_STR - _ACCEL_FOLDED
    if unknown:
        raise CatalogBuildError(f"accelerators.csv has unmapped columns {sorted(unknown)}")
    hw_id = row["id"].strip()
    direction = row["intra_node_bw_direction"].strip()
    if direction not in ("", "bidirectional"):
        raise CatalogBuildError(
            f"{hw_id}: intra_node_bw_direction={direction!r}; the spec stores bidirectional figures"
        )
    if hw_id not in DEFAULT_FABRIC:
        raise CatalogBuildError(f"{hw_id}: no DEFAULT_FABRIC entry in build_catalog.py")
    entry = {"schema_version": SCHEMA_VERSION}
    entry.update(_typed(row, _ACCEL_INT, _ACCEL_FLOAT, _ACCEL_STR, _ACCEL_RENAME))
    entry["source"] = entry["source"] or ""
    notes = row["notes"].strip()
    unit = row["mem_capacity_unit_as_stated"].strip()
    if unit:
        notes = f"{notes} Memory capacity unit as stated by the vendor: {unit}.".strip()
    entry["notes"] = notes
    entry["default_fabric"] = DEFAULT_FABRIC[hw_id]
    entry["nvlink_bridge_bw_gbps"] = NVLINK_BRIDGE_BW_GBPS.get(hw_id)
    entry["peak_fp32_matrix_tflops"] = FP32_MATRIX_TFLOPS.get(hw_id)
    entry["nvlink_domain_gpus"] = nvlink_domain_gpus(row)
    entry["aliases"] = list(ALIASES.get(hw_id, ())) + list(CLOUD_INSTANCE_TYPES.get(hw_id, ()))
    return entry


def fabric_entry(row: dict[str, str]) -> dict[str, Any]:
    """Turn one fabrics.csv row into the JSON dict of a FabricSpec."""
    known = _FABRIC_INT | _FABRIC_FLOAT | _FABRIC_STR | _FABRIC_DROPPED | {"node_internode_gbps_uni"}
    unknown = set(row) - known
    if unknown:
        raise CatalogBuildError(f"fabrics.csv has unmapped columns {sorted(unknown)}")
    fabric_id = row["id"].strip()
    entry = {"schema_version": SCHEMA_VERSION}
    entry.update(_typed(row, _FABRIC_INT, _FABRIC_FLOAT, _FABRIC_STR, _FABRIC_RENAME))
    node_gbit = parse_cell(row["node_internode_gbps_uni"], float, "node_internode_gbps_uni", fabric_id)
    entry["node_bw_gbps"] = None if node_gbit is None else node_gbit / _BITS_PER_BYTE
    entry["latency_us"] = LATENCY_US_BY_KIND[fabric_kind(fabric_id)]
    entry["confidence"] = FABRIC_CONFIDENCE.get(fabric_id)
    entry["source"] = entry["source"] or ""
    entry["notes"] = entry["notes"] or ""
    return entry


def check_curated_tables(accel_ids: set[str], fabric_ids: set[str]) -> None:
    """Fail when a curated table names an id that is not in the CSVs."""
    curated = (("ALIASES", set(ALIASES)), ("DEFAULT_FABRIC", set(DEFAULT_FABRIC)),
               ("NVLINK_BRIDGE_BW_GBPS", set(NVLINK_BRIDGE_BW_GBPS)),
               ("CLOUD_INSTANCE_TYPES", set(CLOUD_INSTANCE_TYPES)))  # fmt: skip
    for table_name, keys in curated:
        stale = keys - accel_ids
        if stale:
            raise CatalogBuildError(f"{table_name} names ids not in accelerators.csv: {sorted(stale)}")
    bad = {f for f in DEFAULT_FABRIC.values() if f not in fabric_ids} | (set(FABRIC_CONFIDENCE) - fabric_ids)
    if bad:
        raise CatalogBuildError(f"curated tables name fabric ids not in fabrics.csv: {sorted(bad)}")


def _ordered(entry: dict[str, Any], model: type) -> dict[str, Any]:
    """Validate ``entry`` with the spec model and return it in the model's field order."""
    spec = model.model_validate(entry)
    return json.loads(spec.model_dump_json())


def write_entries(entries: list[dict[str, Any]], out_dir: Path) -> int:
    """Write ``<id>.json`` files into ``out_dir`` and remove JSON files of ids no longer present."""
    out_dir.mkdir(parents=True, exist_ok=True)
    keep = set()
    for entry in entries:
        path = out_dir / f"{entry['id']}.json"
        path.write_text(json.dumps(entry, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        keep.add(path.name)
    for stale in out_dir.glob("*.json"):
        if stale.name not in keep:
            stale.unlink()
            logger.info("removed stale entry %s", stale)
    return len(entries)


def build(hardware_dir: Path, catalog_dir: Path = CATALOG_DIR) -> tuple[int, int]:
    """Build the catalog from ``hardware_dir``; return (accelerators written, fabrics written)."""
    from perfcast.features.hardware import FabricSpec, HardwareSpec, check_alias_index

    accel_rows = read_rows(hardware_dir / "accelerators.csv")
    fabric_rows = read_rows(hardware_dir / "fabrics.csv")
    accel_ids = {r["id"].strip() for r in accel_rows}
    fabric_ids = {r["id"].strip() for r in fabric_rows}
    if not re.fullmatch(r"[a-z0-9-]+", "".join(accel_ids | fabric_ids)):
        raise CatalogBuildError("ids must be lowercase kebab case")
    check_curated_tables(accel_ids, fabric_ids)
    accelerators = [_ordered(accelerator_entry(r), HardwareSpec) for r in accel_rows]
    fabrics = [_ordered(fabric_entry(r), FabricSpec) for r in fabric_rows]
    check_alias_index([HardwareSpec.model_validate(e) for e in accelerators])
    n_accel = write_entries(accelerators, catalog_dir / "accelerators")
    n_fabric = write_entries(fabrics, catalog_dir / "fabrics")
    return n_accel, n_fabric


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "hardware_dir",
        nargs="?",
        type=Path,
        default=DEFAULT_HARDWARE_DIR,
        help="folder with accelerators.csv and fabrics.csv (default: ../shared/hardware)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        n_accel, n_fabric = build(args.hardware_dir.resolve())
    except (CatalogBuildError, ValueError) as exc:  # ValueError: SpecError, pydantic ValidationError
        logger.error("error: %s", exc)
        return 2
    logger.info("wrote %d accelerators and %d fabrics under %s", n_accel, n_fabric, CATALOG_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
