"""Accelerator and fabric datasheets: what a GPU can do and what links it to other GPUs.

:class:`HardwareSpec` is one accelerator's datasheet (vendor peaks, dense only, see
``../shared/hardware/README.md``) and :class:`FabricSpec` one scale-out fabric or NVLink
domain. Entries come from the catalog (:mod:`perfcast.features.catalog_files`: package data plus
the user's folder), loaded once per process; device names resolve to catalog ids with
:func:`resolve_gpu_name` (rules in :mod:`perfcast.features.gpu_names`).

Units are in the field names: ``_tflops`` 1e12 FLOP/s, ``_tops`` 1e12 int ops/s, ``_gbps``
GB/s (1e9 bytes/s), ``_gbitps`` Gb/s (1e9 bits/s), ``_gib`` GiB, ``_mib`` MiB, ``_mhz``,
``_w``, ``_us`` microseconds.

Direct construction raises :class:`pydantic.ValidationError` (a ``ValueError`` with field
paths); ``from_name`` and ``from_file`` raise :class:`~perfcast.errors.SpecError` instead.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from perfcast.data.schema import DType
from perfcast.errors import SpecError, UnknownEntryError
from perfcast.features._spec_io import read_json
from perfcast.features.catalog_files import (
    ACCELERATOR_DIR,
    FABRIC_DIR,
    read_catalog_dir,
    read_hardware_entries,
    spec_from_dict,
    user_hardware_dir,
)
from perfcast.features.gpu_names import (
    PartIndex,
    check_alias_index,
    close_ids,
    index_parts,
    index_suggestions,
    resolve_device_name,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_GIB = 2**30

# NVIDIA architectures without BF16 tensor cores (bf16 requested there is an error).
_NO_BF16_ARCHITECTURES = ("pascal", "volta", "turing")


def _check_positive(value: float | int | None, info: Any) -> float | int | None:
    """Shared field check: a figure, when present, is > 0."""
    if value is not None and value <= 0:
        raise ValueError(f"{info.field_name}={value!r} must be > 0 (empty means unknown)")
    return value


class HardwareSpec(BaseModel):
    """Datasheet of one accelerator (vendor peak figures, dense, per device).

    Compute peaks are dense (no 2:4 sparsity). ``peak_fp64_tflops`` and
    ``peak_fp32_tflops`` are vector (non-tensor) rates (``peak_fp32_matrix_tflops``: the fp32
    rate of AMD's matrix cores, where the catalog states it); ``peak_tf32/fp16/bf16/fp8/fp4``
    and ``peak_int8_tops`` are tensor-core / matrix-engine rates. ``None`` means the
    figure was not found in a vendor source (or the part does not support the format;
    ``notes`` says which). ``intra_node_bw_gbps`` is the per-GPU scale-up bandwidth,
    BIDIRECTIONAL as the vendor states it (NVLink 4: 900 GB/s = 450 GB/s per direction);
    see :attr:`intra_node_bw_uni_gbps`. ``nvlink_bridge_bw_gbps`` (bidirectional, per GPU)
    is the optional NVLink bridge of a PCIe card that joins :data:`NVLINK_BRIDGE_GPUS` GPUs,
    for clusters that have it (``ClusterSpec.build(..., nvlink_bridged=True)``).
    ``nvlink_domain_gpus`` is the GPUs one NVLink domain joins where it spans several nodes
    (72 on a GB200 NVL72 rack of 4-GPU trays); None means the node is the domain.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    id: str
    vendor: str
    name: str
    form_factor: str | None
    architecture: str | None
    sm_count: int | None
    boost_clock_mhz: float | None
    peak_fp64_tflops: float | None
    peak_fp64_matrix_tflops: float | None
    peak_fp32_tflops: float | None
    peak_fp32_matrix_tflops: float | None = None
    peak_tf32_tflops: float | None
    peak_fp16_tflops: float | None
    peak_bf16_tflops: float | None
    peak_fp8_tflops: float | None
    peak_fp4_tflops: float | None
    peak_int8_tops: float | None
    mem_gib: float
    mem_type: str | None
    mem_bw_gbps: float
    l2_cache_mib: float | None
    tdp_w: float | None
    intra_node_link: str | None
    intra_node_bw_gbps: float | None
    nvlink_bridge_bw_gbps: float | None = None
    nvlink_domain_gpus: int | None = None
    pcie_gen: int | None
    typical_gpus_per_node: int | None
    release_year: int | None
    default_fabric: str
    aliases: tuple[str, ...] = ()
    source: str
    notes: str = ""
    confidence: str | None

    _positive = field_validator(
        "sm_count",
        "boost_clock_mhz",
        "peak_fp64_tflops",
        "peak_fp64_matrix_tflops",
        "peak_fp32_tflops",
        "peak_fp32_matrix_tflops",
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
        "intra_node_bw_gbps",
        "nvlink_bridge_bw_gbps",
        "nvlink_domain_gpus",
        "pcie_gen",
        "typical_gpus_per_node",
        "release_year",
    )(_check_positive)

    @field_validator("schema_version")
    @classmethod
    def _check_schema_version(cls, value: int) -> int:
        if value != SCHEMA_VERSION:
            raise ValueError(f"schema_version={value!r} is not supported; allowed: {SCHEMA_VERSION}")
        return value

    @field_validator("id", "default_fabric")
    @classmethod
    def _check_kebab(cls, value: str, info: Any) -> str:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", value):
            raise ValueError(f"{info.field_name}={value!r} must be lowercase kebab case, e.g. 'h100-sxm5-80gb'")
        return value

    # ---------------------------------------------------------------- derived figures

    @property
    def mem_bytes(self) -> int:
        """Device memory as the vendor states it, bytes (``mem_gib`` x 2**30)."""
        return int(round(self.mem_gib * _GIB))

    @property
    def intra_node_bw_uni_gbps(self) -> float | None:
        """Per-GPU scale-up bandwidth in ONE direction, GB/s (``intra_node_bw_gbps / 2``)."""
        if self.intra_node_bw_gbps is None:
            return None
        return self.intra_node_bw_gbps / 2.0

    def peak_tflops(self, dtype: DType | str) -> float:
        """Dense tensor/matrix peak used for GEMMs in ``dtype``, TFLOP/s (1e12 FLOP/s).

        Per dtype, the first figure present is used:

        - ``fp32``: ``peak_fp32_matrix_tflops`` (AMD CDNA1/2, whose GEMM libraries run fp32
          on the matrix cores at twice the vector rate), else ``peak_fp32_tflops`` (NVIDIA
          runs plain fp32 GEMMs on the vector units);
        - ``tf32``: ``peak_tf32_tflops``, else as ``fp32`` -- parts without TF32
          (pre-Ampere NVIDIA, CDNA1/2/4) run a TF32 request as plain fp32;
        - ``fp16``: ``peak_fp16_tflops`` (no fallback);
        - ``bf16``: ``peak_bf16_tflops`` (no fallback). Parts without BF16 tensor units
          (Pascal, Volta, Turing) raise: frameworks emulate bf16 there at a fraction of the
          fp16 rate, so the fp16 peak would predict runs far too fast; use fp16;
        - ``fp8``: ``peak_fp8_tflops``, else ``peak_bf16_tflops``, else
          ``peak_fp16_tflops`` -- without fp8 hardware the framework runs the GEMMs in
          16 bit;
        - ``mxfp8``: ``peak_fp8_tflops`` (block-scaled MMA runs at the fp8 rate);
          ``nvfp4`` and ``mxfp4``: ``peak_fp4_tflops``. These need block-scaled tensor
          cores (Blackwell, CDNA4), which the catalog marks by a ``peak_fp4_tflops``
          figure: parts without one raise, as do AMD parts for ``nvfp4`` (an NVIDIA
          format; AMD's FP4 is MXFP4). No fallback: the framework does not emulate them.

        Raises:
            SpecError: the dtype is unknown, bf16 on a part without BF16, a block-scaled
                dtype on a part without block-scaled tensor cores, or the catalog has no
                figure (e.g. H100 NVL, whose compute columns are empty); the message names
                the hardware id and the missing field(s).
        """
        dt = DType.parse(dtype)
        if dt is DType.BF16 and self.peak_bf16_tflops is None and self._lacks_bf16():
            raise SpecError(
                f"bf16 is not supported on {self.id} ({self.architecture}): no BF16 tensor cores "
                "(peak_bf16_tflops is empty); use fp16"
            )
        if dt.scale_block_size is not None:
            self._check_block_scaled(dt)
        fields = _PEAK_FALLBACKS[dt]
        for field in fields:
            value = getattr(self, field)
            if value is not None:
                if field != fields[0]:
                    logger.debug("%s: no %s; %s uses %s", self.id, fields[0], dt.value, field)
                return float(value)
        raise SpecError(
            f"{self.id} has no {dt.value} peak in the catalog: {' and '.join(fields)} "
            f"{'is' if len(fields) == 1 else 'are'} empty (no source the catalog cites states it); choose "
            "another GPU, or load your own entry with HardwareSpec.from_file"
        )

    def vector_tflops(self, dtype: DType | str = DType.FP32) -> float:
        """Non-tensor (vector) peak for element-wise work, TFLOP/s.

        This is ``peak_fp32_tflops`` for every dtype: PyTorch computes 16-bit and
        low-precision element-wise ops in fp32 registers (``opmath_type``), and such ops are memory
        bound anyway. ``dtype`` is checked but does not change the figure.

        Raises:
            SpecError: unknown dtype, or ``peak_fp32_tflops`` is empty for this part.
        """
        DType.parse(dtype)
        if self.peak_fp32_tflops is None:
            raise SpecError(f"{self.id} has no vector peak in the catalog: peak_fp32_tflops is empty")
        return float(self.peak_fp32_tflops)

    def _check_block_scaled(self, dt: DType) -> None:
        """Raise unless this part has tensor cores for the block-scaled ``dt``."""
        instead = "fp8" if self.peak_fp8_tflops is not None else "bf16"
        if self.peak_fp4_tflops is None:
            raise SpecError(
                f"{dt.value} is not supported on {self.id} ({self.architecture}): no block-scaled "
                f"(MX/NVFP4) tensor cores (peak_fp4_tflops is empty); use {instead}"
            )
        if dt is DType.NVFP4 and self.vendor.upper() != "NVIDIA":
            raise SpecError(
                f"nvfp4 is not supported on {self.id} ({self.architecture}): NVFP4 is an NVIDIA "
                "Blackwell format; use mxfp4"
            )

    def _lacks_bf16(self) -> bool:
        arch = (self.architecture or "").lower()
        return self.vendor.upper() == "NVIDIA" and arch.startswith(_NO_BF16_ARCHITECTURES)

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_name(cls, name: str) -> HardwareSpec:
        """Catalog entry for an id, alias or device name (see :func:`resolve_gpu_name`).

        Raises:
            UnknownEntryError: no entry matches; the message suggests close matches.
        """
        return _load_hardware()[resolve_gpu_name(name)]

    @classmethod
    def from_file(cls, path: str | Path) -> HardwareSpec:
        """Load a hardware entry from a JSON file with the catalog's fields (a user's own GPU).

        Raises:
            SpecError: unreadable file, invalid JSON or invalid fields (field path, value).
        """
        path = Path(path)
        return spec_from_dict(cls, read_json(path), where=str(path))


_PEAK_FALLBACKS: dict[DType, tuple[str, ...]] = {
    DType.FP32: ("peak_fp32_matrix_tflops", "peak_fp32_tflops"),
    DType.TF32: ("peak_tf32_tflops", "peak_fp32_matrix_tflops", "peak_fp32_tflops"),
    DType.FP16: ("peak_fp16_tflops",),
    DType.BF16: ("peak_bf16_tflops",),
    DType.FP8: ("peak_fp8_tflops", "peak_bf16_tflops", "peak_fp16_tflops"),
    DType.MXFP8: ("peak_fp8_tflops",),
    DType.NVFP4: ("peak_fp4_tflops",),
    DType.MXFP4: ("peak_fp4_tflops",),
}


class FabricSpec(BaseModel):
    """One scale-out fabric (NICs between nodes) or scale-up NVLink domain.

    ``per_port_line_rate_gbitps`` is the signalling rate of one port (one NVLink link for
    NVLink rows) per direction, in Gb/s (bits). ``per_gpu_bw_gbps`` and ``node_bw_gbps``
    are scale-out bandwidth in GB/s (bytes), ONE direction, per GPU and per node of the
    documented example system (``gpus_per_node`` GPUs, ``nics_or_ports_per_node``
    ports). ``latency_us`` is a stated default (an assumption, see
    ``scripts/build_catalog.py``), not a measurement.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    id: str
    fabric: str
    scope: str
    lane_config: str | None = None
    example_system: str | None = None
    per_port_line_rate_gbitps: float | None
    per_gpu_bw_gbps: float | None
    node_bw_gbps: float | None = None
    nics_or_ports_per_node: int | None
    gpus_per_node: int | None
    domain_size_gpus: int | None
    latency_us: float
    source: str
    notes: str = ""
    confidence: str | None = None

    _positive = field_validator(
        "per_port_line_rate_gbitps",
        "per_gpu_bw_gbps",
        "node_bw_gbps",
        "nics_or_ports_per_node",
        "gpus_per_node",
        "domain_size_gpus",
        "latency_us",
    )(_check_positive)

    @property
    def is_scale_up_domain(self) -> bool:
        """True for NVLink domain rows (their bandwidth is the GPUs' own NVLink)."""
        return self.domain_size_gpus is not None

    def per_gpu_bw_for(self, gpu: HardwareSpec, gpus_per_node: int) -> float:
        """Scale-out bandwidth one GPU gets in one direction, GB/s.

        The first rule that applies:

        1. ``per_gpu_bw_gbps`` when the catalog states it;
        2. ``node_bw_gbps`` shared by the GPUs of the documented node (``gpus_per_node``
           of this fabric, else of the cluster);
        3. an NVLink scale-up domain: the GPU's own NVLink bandwidth per direction
           (every GPU of the domain reaches the switches at its full NVLink rate);
        4. one port per GPU: ``per_port_line_rate_gbitps / 8``.

        Raises:
            SpecError: none of these figures exists.
        """
        if self.per_gpu_bw_gbps is not None:
            return self.per_gpu_bw_gbps
        if self.node_bw_gbps is not None:
            return self.node_bw_gbps / (self.gpus_per_node or gpus_per_node)
        if self.is_scale_up_domain and gpu.intra_node_bw_uni_gbps is not None:
            return gpu.intra_node_bw_uni_gbps
        if self.per_port_line_rate_gbitps is not None:
            return self.per_port_line_rate_gbitps / 8.0
        raise SpecError(
            f"fabric {self.id} has no per_gpu_bw_gbps, node_bw_gbps or per_port_line_rate_gbitps usable for {gpu.id}"
        )

    @classmethod
    def from_name(cls, name: str) -> FabricSpec:
        """Catalog entry for a fabric id (case, ``_`` and spaces ignored).

        Raises:
            UnknownEntryError: unknown id; the message suggests close matches.
        """
        fabrics = _load_fabrics()
        key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
        if key in fabrics:
            return fabrics[key]
        close = close_ids([key], {f: f for f in fabrics}, cutoff=0.5)
        hint = f"; did you mean: {', '.join(close)}?" if close else f"; known fabrics: {', '.join(sorted(fabrics))}"
        raise UnknownEntryError(f"inter_node={name!r} is not a known fabric{hint}")

    @classmethod
    def from_file(cls, path: str | Path) -> FabricSpec:
        """Load a fabric entry from a JSON file with the catalog's fields.

        Raises:
            SpecError: unreadable file, invalid JSON or invalid fields.
        """
        path = Path(path)
        return spec_from_dict(cls, read_json(path), where=str(path))


def resolve_gpu_name(name: str) -> str:
    """Catalog id of a catalog id, alias or device name, e.g. ``"NVIDIA H100 80GB HBM3"``.

    The rules are :func:`perfcast.features.gpu_names.resolve_device_name`'s, over the
    loaded catalog.

    Raises:
        SpecError: ``name`` is not a non-empty string.
        UnknownEntryError: no entry matches; the message names the closest known part of
            the same family when there is one, else suggests up to 3 close ids.
    """
    return resolve_device_name(name, _alias_index, _part_index, _suggestion_candidates)


def list_hardware() -> list[HardwareSpec]:
    """Every accelerator of the catalog, sorted by id."""
    return [spec for _, spec in sorted(_load_hardware().items())]


def list_fabrics() -> list[FabricSpec]:
    """Every fabric of the catalog, sorted by id."""
    return [spec for _, spec in sorted(_load_fabrics().items())]


def add_user_hardware(spec: HardwareSpec, directory: Path | None = None) -> Path:
    """Save ``spec`` as a user entry (``<dir>/<id>.json``); later lookups in any process find it.

    Raises:
        SpecError: the id is a shipped catalog entry.
    """
    if spec.id in read_catalog_dir(HardwareSpec, ACCELERATOR_DIR):
        raise SpecError(f"id={spec.id!r} is a catalog entry; give your hardware another id")
    directory = Path(directory) if directory is not None else user_hardware_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{spec.id}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(spec.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    for cached in (_load_hardware, _alias_index, _suggestion_candidates, _part_index):
        cached.cache_clear()
    return path


@lru_cache(maxsize=1)
def _load_hardware() -> Mapping[str, HardwareSpec]:
    """The shipped catalog plus the user's entries
    (:func:`~perfcast.features.catalog_files.read_hardware_entries`)."""
    return read_hardware_entries(HardwareSpec)


@lru_cache(maxsize=1)
def _load_fabrics() -> Mapping[str, FabricSpec]:
    return MappingProxyType(read_catalog_dir(FabricSpec, FABRIC_DIR))


@lru_cache(maxsize=1)
def _alias_index() -> Mapping[str, str]:
    return MappingProxyType(check_alias_index(list(_load_hardware().values())))


@lru_cache(maxsize=1)
def _part_index() -> PartIndex:
    """Catalog entries by part family (:func:`~perfcast.features.gpu_names.index_parts`)."""
    return MappingProxyType(index_parts(_load_hardware().values()))


@lru_cache(maxsize=1)
def _suggestion_candidates() -> dict[str, str]:
    """Lowercase ids, aliases and their normalized keys, each mapped to its id."""
    return index_suggestions(_load_hardware().values())
