"""A hardware entry for the host CPU, built from measured rates (``perfcast calibrate --device cpu``)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from perfcast.features.hardware_spec import HardwareSpec

HOST_FABRIC = "roce-200gbe"
"""Fabric assumed for a measured host entry (it only matters for multi-node collectives)."""


def host_hardware_spec(
    name: str, *, cores: int, mem_gib: float, gemm_tflops: Mapping[str, float], copy_gbps: float
) -> HardwareSpec:
    """A catalog entry for the host CPU from measured rates (``perfcast calibrate --device cpu``).

    ``gemm_tflops`` maps dtypes to the measured GEMM rate (used as the peaks: a CPU has no
    datasheet the roofline could use); ``copy_gbps`` is the measured copy bandwidth.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "cpu"
    fp32 = float(gemm_tflops.get("fp32") or max(gemm_tflops.values()))
    return HardwareSpec(
        id=f"host-{slug}",
        vendor="host",
        name=f"{name} (host CPU, measured)",
        form_factor="CPU",
        architecture=None,
        sm_count=cores,
        boost_clock_mhz=None,
        peak_fp64_tflops=fp32 / 2,
        peak_fp64_matrix_tflops=None,
        peak_fp32_tflops=fp32,
        peak_tf32_tflops=None,
        peak_fp16_tflops=float(gemm_tflops.get("fp16") or fp32),
        peak_bf16_tflops=float(gemm_tflops.get("bf16") or fp32),
        peak_fp8_tflops=None,
        peak_fp4_tflops=None,
        peak_int8_tops=None,
        mem_gib=mem_gib,
        mem_type="DRAM",
        mem_bw_gbps=copy_gbps,
        l2_cache_mib=None,
        tdp_w=None,
        intra_node_link="host memory",
        intra_node_bw_gbps=2 * copy_gbps,
        pcie_gen=None,
        typical_gpus_per_node=1,
        release_year=None,
        default_fabric=HOST_FABRIC,
        source="measured by perfcast calibrate --device cpu (GEMM rate and copy bandwidth)",
        notes="Peaks are measured rates, not a datasheet.",
        confidence="low",
    )
