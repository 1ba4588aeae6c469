"""Cluster spec: how many GPUs a run uses and how they are wired, levels and links.

:class:`ClusterSpec` is the cluster a run uses: which GPU, how many, how many per node and
per NVLink domain, and the per-GPU bandwidths and latencies inside and between nodes, filled
from the catalog by :meth:`ClusterSpec.build` (which raises
:class:`~perfcast.errors.SpecError`; direct construction raises
:class:`pydantic.ValidationError`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from perfcast.errors import SpecError
from perfcast.features._spec_io import to_spec_error
from perfcast.features.hardware_spec import FabricSpec, HardwareSpec

# Small-message latency of one hop inside a node, microseconds: the alpha term of an
# alpha-beta collective model. ASSUMPTIONS, not measurements:
# - NVLink/NVSwitch, AMD xGMI, Gaudi scale-up RoCE and TPU ICI: NCCL/RCCL point-to-point
#   latency of a few us for small messages (kernel launch + protocol), taken as 3 us;
# - PCIe-only cards (peer traffic through the PCIe switch or the host): 5 us.
NVLINK_BRIDGE_GPUS = 2
"""GPUs one optional NVLink bridge joins on a PCIe card (A100 and H100 PCIe: pairs)."""
NVLINK_INTRA_NODE_LATENCY_US = 3.0
PCIE_INTRA_NODE_LATENCY_US = 5.0

# GPUs per node when the catalog has no ``typical_gpus_per_node`` (PCIe cards, TPU v4):
# the common 8-slot server. ClusterSpec.build caps it at num_gpus.
DEFAULT_GPUS_PER_NODE = 8


class ClusterSpec(BaseModel):
    """The GPUs a run uses and how they talk: per-GPU bandwidth and latency, ONE direction.

    Three levels: a GPU; its NVLink domain of ``nvlink_domain`` GPUs (the node on HGX
    servers, a 72-GPU rack of 4-GPU trays on GB200/GB300 NVL72), inside which
    ``intra_node_bw_gbps`` is what one GPU sends to its domain peers per direction
    (NVLink 4: 450 GB/s); and the scale-out fabric between domains, over which each GPU
    sends ``inter_node_bw_gbps`` per direction (one NDR 400 port: 50 GB/s; its NICs sit
    in the node of ``gpus_per_node`` GPUs). Collectives are timed over the levels their
    ranks span. Latencies are the per-hop alpha terms, us. Build one with :meth:`build`,
    which fills these from the catalog.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu: HardwareSpec
    num_gpus: int
    gpus_per_node: int
    intra_node_bw_gbps: float
    inter_node_bw_gbps: float
    intra_node_latency_us: float
    inter_node_latency_us: float
    inter_node_fabric: str | None = None
    nvlink_domain: int = Field(0, description="GPUs of one NVLink domain; 0 = the node (gpus_per_node)")

    @model_validator(mode="before")
    @classmethod
    def _domain_defaults_to_the_node(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("nvlink_domain"):
            data = {**data, "nvlink_domain": data.get("gpus_per_node")}
        return data

    @field_validator("num_gpus", "gpus_per_node", "nvlink_domain")
    @classmethod
    def _check_count(cls, value: int, info: Any) -> int:
        if value < 1:
            raise ValueError(f"{info.field_name}={value} must be >= 1")
        return value

    @field_validator("intra_node_bw_gbps", "inter_node_bw_gbps", "intra_node_latency_us", "inter_node_latency_us")
    @classmethod
    def _check_figure(cls, value: float, info: Any) -> float:
        if not value > 0:
            raise ValueError(f"{info.field_name}={value!r} must be > 0")
        return value

    @model_validator(mode="after")
    def _check_nodes(self) -> ClusterSpec:
        if self.num_gpus > self.gpus_per_node and self.num_gpus % self.gpus_per_node:
            raise ValueError(f"num_gpus={self.num_gpus} is not a multiple of gpus_per_node={self.gpus_per_node}")
        if self.nvlink_domain < self.gpus_per_node or (
            self.nvlink_domain < self.num_gpus and self.nvlink_domain % self.gpus_per_node
        ):
            raise ValueError(
                f"nvlink_domain={self.nvlink_domain} must be a multiple of gpus_per_node={self.gpus_per_node} "
                "(an NVLink domain joins whole nodes)"
            )
        return self

    @property
    def num_domains(self) -> int:
        """NVLink domains the run occupies (1 when all GPUs share one)."""
        return max(1, -(-self.num_gpus // self.nvlink_domain))

    @property
    def num_nodes(self) -> int:
        """Nodes the run occupies (1 when all GPUs fit in one node)."""
        return max(1, -(-self.num_gpus // self.gpus_per_node))

    @classmethod
    def build(
        cls,
        gpu: str | HardwareSpec,
        num_gpus: int,
        gpus_per_node: int | None = None,
        inter_node: str | None = None,
        *,
        nvlink_bridged: bool = False,
        nvlink_domain: int | None = None,
    ) -> ClusterSpec:
        """Cluster of ``num_gpus`` x ``gpu`` with figures from the catalog.

        - ``gpu``: a catalog id, alias or device name, or a :class:`HardwareSpec`;
        - ``gpus_per_node``: defaults to ``gpu.typical_gpus_per_node``, else
          ``DEFAULT_GPUS_PER_NODE`` (8, the common server for PCIe cards); the value used
          is capped at ``num_gpus`` (a 4-GPU run on an 8-GPU node uses 4 per node);
        - ``inter_node``: a fabric id, defaults to ``gpu.default_fabric``;
        - ``nvlink_domain``: GPUs of one NVLink domain, defaults to
          ``gpu.nvlink_domain_gpus`` (72 on NVL72 racks), else the node; capped at
          ``num_gpus``;
        - ``nvlink_bridged``: the PCIe cards carry their optional NVLink bridges. When the
          GPUs of a node fit in one bridge (at most :data:`NVLINK_BRIDGE_GPUS`), the
          intra-node link is the bridge (``nvlink_bridge_bw_gbps``, NVLink latency);
          with more GPUs a node's ring crosses PCIe between bridges and keeps the PCIe
          figures. No effect on parts whose scale-up link is not PCIe.

        Bandwidths: intra-node = :attr:`HardwareSpec.intra_node_bw_uni_gbps`, inter-node =
        :meth:`FabricSpec.per_gpu_bw_for`. Latencies: intra-node
        ``NVLINK_INTRA_NODE_LATENCY_US`` (``PCIE_INTRA_NODE_LATENCY_US`` for PCIe-only
        cards), inter-node the fabric's ``latency_us``.

        Raises:
            SpecError: unknown gpu or fabric, invalid counts (e.g. ``"num_gpus=12 is not a
                multiple of gpus_per_node=8"``), or a part with no intra-node bandwidth.
        """
        hw = gpu if isinstance(gpu, HardwareSpec) else HardwareSpec.from_name(gpu)
        _check_count_arg("num_gpus", num_gpus)
        if gpus_per_node is not None:
            _check_count_arg("gpus_per_node", gpus_per_node)
        if nvlink_domain is not None:
            _check_count_arg("nvlink_domain", nvlink_domain)
        per_node = min(gpus_per_node or hw.typical_gpus_per_node or DEFAULT_GPUS_PER_NODE, num_gpus)
        domain = min(nvlink_domain or max(hw.nvlink_domain_gpus or per_node, per_node), num_gpus)
        fabric = FabricSpec.from_name(inter_node or hw.default_fabric)
        if hw.intra_node_bw_uni_gbps is None:
            raise SpecError(
                f"{hw.id} has no intra_node_bw_gbps in the catalog; construct ClusterSpec "
                "directly with intra_node_bw_gbps (GB/s per GPU, one direction)"
            )
        intra_bw, intra_latency = hw.intra_node_bw_uni_gbps, _intra_node_latency_us(hw)
        if nvlink_bridged and (hw.intra_node_link or "").lower().startswith("pcie"):
            if hw.nvlink_bridge_bw_gbps is None:
                raise SpecError(
                    f"nvlink_bridged=True but {hw.id} has no nvlink_bridge_bw_gbps in the catalog (its link: "
                    f"{hw.intra_node_link!r}); allowed only for PCIe cards with an optional NVLink bridge"
                )
            if per_node <= NVLINK_BRIDGE_GPUS:
                intra_bw, intra_latency = hw.nvlink_bridge_bw_gbps / 2.0, NVLINK_INTRA_NODE_LATENCY_US
        fields = {
            "gpu": hw,
            "num_gpus": num_gpus,
            "gpus_per_node": per_node,
            "intra_node_bw_gbps": intra_bw,
            "inter_node_bw_gbps": fabric.per_gpu_bw_for(hw, per_node),
            "intra_node_latency_us": intra_latency,
            "inter_node_latency_us": fabric.latency_us,
            "inter_node_fabric": fabric.id,
            "nvlink_domain": domain,
        }
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise to_spec_error(exc, "cluster") from None


def collective_cluster(
    gpu: str | HardwareSpec,
    n_ranks: int,
    ranks_per_node: int | None,
    inter_node: str | None,
    *,
    bridged: bool = False,
) -> ClusterSpec:
    """The cluster one collective op row describes: ``n_ranks`` GPUs, ``ranks_per_node`` of
    them in each NVLink domain (the op table's meaning of the column), or the catalog's
    node and domain when it is not given.

    Raises:
        SpecError: as :meth:`ClusterSpec.build`.
    """
    return ClusterSpec.build(
        gpu, n_ranks, ranks_per_node, inter_node, nvlink_bridged=bridged, nvlink_domain=ranks_per_node
    )


def _check_count_arg(name: str, value: Any) -> None:
    """Reject a non-integer or < 1 count before it reaches arithmetic."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(f"{name}={value!r} must be an integer >= 1")


def _intra_node_latency_us(hw: HardwareSpec) -> float:
    """Stated default intra-node hop latency: PCIe-only cards vs scale-up links."""
    link = (hw.intra_node_link or "").lower()
    return PCIE_INTRA_NODE_LATENCY_US if link.startswith("pcie") else NVLINK_INTRA_NODE_LATENCY_US
