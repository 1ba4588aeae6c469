"""The device a profile runs on: torch (imported on first use), the CPU or CUDA device it
finds with its software versions, and torch's names of the timed dtypes.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfcast._optional import require
from perfcast.data.schema import DType, OpTiming
from perfcast.errors import DatasetError, SpecError


@dataclass(frozen=True)
class DeviceInfo:
    """The device a profile runs on.

    Attributes:
        kind: ``cpu`` or ``cuda``.
        name: as torch prints it (``torch.cuda.get_device_name``), or the CPU model.
        count: CUDA devices visible (1 for the CPU).
        torch_version, cuda_version, driver_version: software versions (CUDA ones only on cuda).
        properties: ``total_memory`` (bytes), ``multi_processor_count``, ``capability``,
            ``l2_cache_bytes`` on CUDA; ``logical_cpus``, ``torch_threads``, ``machine`` on CPU.
    """

    kind: str
    name: str
    count: int
    torch_version: str
    cuda_version: str | None = None
    driver_version: str | None = None
    properties: Mapping[str, Any] = field(default_factory=dict)

    @property
    def record_gpu(self) -> str:
        """The records' ``gpu``: the printed device name, ``cpu`` for host runs."""
        return "cpu" if self.kind == "cpu" else self.name

    @property
    def record_timing(self) -> OpTiming:
        """The records' ``timing``: CUDA events around each call on CUDA, the call's host wall time on the CPU."""
        return OpTiming.CPU_OP if self.kind == "cpu" else OpTiming.CUDA_EVENTS

    @property
    def capability(self) -> tuple[int, int] | None:
        """CUDA compute capability (major, minor), None on the CPU."""
        cap = self.properties.get("capability")
        return (int(cap[0]), int(cap[1])) if cap else None


def _torch() -> Any:
    require("torch", purpose="perfcast profile")
    import torch

    return torch


def detect_device(kind: str) -> DeviceInfo:
    """Describe the CPU (``kind="cpu"``) or the first CUDA device (``"cuda"``).

    Raises:
        DatasetError: ``cuda`` is asked for but torch sees no CUDA device.
        SpecError: ``kind`` is neither ``cpu`` nor ``cuda``.
    """
    torch = _torch()
    kind = str(kind).strip().lower()
    if kind == "cpu":
        return DeviceInfo(
            kind="cpu",
            name=_cpu_name(),
            count=1,
            torch_version=torch.__version__,
            properties={
                "logical_cpus": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "machine": platform.machine(),
            },
        )
    if kind != "cuda":
        raise SpecError(f"device={kind!r} is not supported; allowed: cpu, cuda")
    if not torch.cuda.is_available():
        raise DatasetError(
            f"device=cuda was requested but torch {torch.__version__} sees no CUDA device "
            f"(torch built with CUDA {torch.version.cuda or 'none'}); use --device cpu or a CUDA build of torch"
        )
    props = torch.cuda.get_device_properties(0)
    return DeviceInfo(
        kind="cuda",
        name=torch.cuda.get_device_name(0),
        count=torch.cuda.device_count(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        driver_version=_driver_version(),
        properties={
            "total_memory": int(props.total_memory),
            "multi_processor_count": int(props.multi_processor_count),
            "capability": [int(props.major), int(props.minor)],
            "l2_cache_bytes": int(getattr(props, "L2_cache_size", 0)) or None,
        },
    )


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


_TORCH_DTYPES = {DType.FP32: "float32", DType.TF32: "float32", DType.FP16: "float16", DType.BF16: "bfloat16"}
