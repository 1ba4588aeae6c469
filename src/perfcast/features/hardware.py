"""Hardware catalog and cluster spec, under their historical import path.

The code lives in one module per job; this module re-exports their names so that
``from perfcast.features.hardware import ...`` keeps working:

- :mod:`perfcast.features.hardware_spec`: :class:`HardwareSpec`, :class:`FabricSpec`, the
  loaded catalog (:func:`list_hardware`, :func:`resolve_gpu_name`, :func:`add_user_hardware`);
- :mod:`perfcast.features.catalog_files`: the catalog files and the user's hardware folder;
- :mod:`perfcast.features.gpu_names`: device-name normalisation, aliases, part matching;
- :mod:`perfcast.features.cluster`: :class:`ClusterSpec` and :func:`collective_cluster`;
- :mod:`perfcast.features.descriptors`: :func:`descriptor_figures` (imputed catalog gaps);
- :mod:`perfcast.features.host_hardware`: :func:`host_hardware_spec` (measured host CPU).
"""

from __future__ import annotations

from perfcast.errors import SpecError as SpecError
from perfcast.errors import UnknownEntryError as UnknownEntryError
from perfcast.features.catalog_files import USER_HARDWARE_ENV, user_hardware_dir
from perfcast.features.cluster import (
    DEFAULT_GPUS_PER_NODE,
    NVLINK_BRIDGE_GPUS,
    NVLINK_INTRA_NODE_LATENCY_US,
    PCIE_INTRA_NODE_LATENCY_US,
    ClusterSpec,
    collective_cluster,
)
from perfcast.features.descriptors import IMPUTED_FIGURES, descriptor_figures
from perfcast.features.gpu_names import check_alias_index, normalize_device_name
from perfcast.features.hardware_spec import (
    SCHEMA_VERSION,
    FabricSpec,
    HardwareSpec,
    add_user_hardware,
    list_fabrics,
    list_hardware,
    resolve_gpu_name,
)
from perfcast.features.hardware_spec import _alias_index as _alias_index
from perfcast.features.hardware_spec import _load_fabrics as _load_fabrics
from perfcast.features.hardware_spec import _load_hardware as _load_hardware
from perfcast.features.hardware_spec import _part_index as _part_index
from perfcast.features.hardware_spec import _suggestion_candidates as _suggestion_candidates
from perfcast.features.host_hardware import HOST_FABRIC, host_hardware_spec

__all__ = [
    "DEFAULT_GPUS_PER_NODE",
    "HOST_FABRIC",
    "IMPUTED_FIGURES",
    "NVLINK_BRIDGE_GPUS",
    "NVLINK_INTRA_NODE_LATENCY_US",
    "PCIE_INTRA_NODE_LATENCY_US",
    "SCHEMA_VERSION",
    "USER_HARDWARE_ENV",
    "ClusterSpec",
    "FabricSpec",
    "HardwareSpec",
    "add_user_hardware",
    "check_alias_index",
    "collective_cluster",
    "descriptor_figures",
    "host_hardware_spec",
    "list_fabrics",
    "list_hardware",
    "normalize_device_name",
    "resolve_gpu_name",
    "user_hardware_dir",
]
