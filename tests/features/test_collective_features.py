"""Tests of perfcast.features.collective_features."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.collective_features import (
    COLLECTIVE_FEATURES,
    COLLECTIVE_FEATURES_VERSION,
    featurize_collectives,
    inter_link_kind,
    intra_link_kind,
)
from perfcast.features.collectives import collective_time_s
from perfcast.features.hardware import ClusterSpec, HardwareSpec


def _ops(**overrides: object) -> pd.DataFrame:
    base = {
        "op": ["allreduce", "allgather", "sendrecv", "allreduce", "alltoall"],
        "bytes": [2**20, 2**24, 2**22, 2**26, 2**20],
        "n_ranks": [8, 4, 2, 16, 8],
        "ranks_per_node": [8, 4, 1, 8, None],
        "dtype": ["fp16", "bf16", "fp16", "fp32", "fp16"],
        "gpu": ["h100-sxm5-80gb", "NVIDIA A100-SXM4-80GB", "a40", "p100-pcie-16gb", "a100-pcie-80gb"],
    }
    base.update(overrides)
    return pd.DataFrame(base, index=[10, 11, 12, 13, 14])


def test_version_and_columns() -> None:
    out = featurize_collectives(_ops())
    assert COLLECTIVE_FEATURES_VERSION == 4  # 4: gathers across nodes pay the ring latency
    assert list(out.columns[: len(COLLECTIVE_FEATURES)]) == list(COLLECTIVE_FEATURES)
    assert {"intra_link_kind", "inter_link_kind", "gpu_id"} <= set(out.columns)
    assert list(out.index) == [10, 11, 12, 13, 14]
    assert np.isfinite(out[list(COLLECTIVE_FEATURES)].to_numpy(dtype=float)).all()


def test_alpha_beta_matches_collectives_module() -> None:
    ops = _ops()
    out = featurize_collectives(ops)
    for i, row in enumerate(ops.itertuples()):
        rpn = None if pd.isna(row.ranks_per_node) else int(row.ranks_per_node)
        c = ClusterSpec.build(row.gpu, int(row.n_ranks), rpn)
        expect = collective_time_s(
            np.array([row.op]),
            np.array([row.bytes]),
            np.array([row.n_ranks]),
            np.array([c.gpus_per_node]),
            intra_bw_gbps=c.intra_node_bw_gbps,
            inter_bw_gbps=c.inter_node_bw_gbps,
            intra_latency_us=c.intra_node_latency_us,
            inter_latency_us=c.inter_node_latency_us,
        )[0]
        assert out["alpha_beta_ms"].iloc[i] == pytest.approx(expect * 1e3, rel=1e-12)
        assert out["ranks_per_node"].iloc[i] == c.gpus_per_node


def test_parts_add_up_and_latency_steps() -> None:
    out = featurize_collectives(_ops())
    total = out["alpha_beta_bw_ms"] + out["alpha_beta_lat_ms"]
    np.testing.assert_allclose(total, out["alpha_beta_ms"], rtol=1e-12)
    np.testing.assert_allclose(out["bw_intra_ms"] + out["bw_inter_ms"], out["alpha_beta_bw_ms"], rtol=1e-12)
    # 8-rank all-reduce in one node: 2 * 7 ring steps (NCCL's tree is a chain inside a node)
    assert out.loc[10, "latency_steps"] == pytest.approx(14.0)
    # inter-node send/recv: one fabric step, all bandwidth over the fabric
    assert out.loc[12, "latency_steps"] == pytest.approx(1.0)
    assert out.loc[12, "bw_intra_ms"] == 0.0
    assert out.loc[12, "nodes"] == 2
    # missing ranks_per_node: the GPU's default node size (8) capped at n_ranks
    assert out.loc[14, "ranks_per_node"] == 8 and out.loc[14, "nodes"] == 1


def test_link_kinds() -> None:
    out = featurize_collectives(_ops())
    assert out.loc[10, "intra_link_kind"] == "nvlink"
    assert out.loc[13, "intra_link_kind"] == "pcie"
    assert out.loc[14, "nvlink_bridge"] == 1.0 and out.loc[13, "nvlink_bridge"] == 0.0
    assert set(out["inter_link_kind"]) == {"infiniband"}
    assert intra_link_kind(HardwareSpec.from_name("mi300x")) == "xgmi"
    assert inter_link_kind("roce-400gbe") == "roce"
    assert inter_link_kind("nvl72-gb200") == "nvlink"
    assert inter_link_kind("tpu-v5p-dcn") == "dcn"


def test_inter_node_column_selects_fabric() -> None:
    ops = _ops().iloc[[3]].assign(inter_node="ib-ndr-400-dgx-h100")
    slow = featurize_collectives(_ops().iloc[[3]])
    fast = featurize_collectives(ops)
    assert fast["inter_bw_gbps"].iloc[0] > slow["inter_bw_gbps"].iloc[0]


def test_one_rank_takes_no_time() -> None:
    out = featurize_collectives(_ops(n_ranks=[1, 1, 1, 1, 1], ranks_per_node=[1] * 5))
    assert (out["alpha_beta_ms"] == 0).all() and (out["bw_share"] == 0).all()


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"op": ["matmul", "allgather", "sendrecv", "allreduce", "alltoall"]}, "not a collective"),
        ({"bytes": [0, 1, 1, 1, 1]}, "bytes must be a positive"),
        ({"n_ranks": [8, 4, 2, 16, 2.5]}, "n_ranks must be an integer"),
        ({"gpu": ["nope-gpu"] * 5}, "not in the hardware catalog"),
        ({"n_ranks": [12, 4, 2, 16, 8]}, "not a multiple"),
    ],
)
def test_bad_rows_raise_spec_error(overrides: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        featurize_collectives(_ops(**overrides))


def test_missing_column() -> None:
    with pytest.raises(SpecError, match="lack columns"):
        featurize_collectives(_ops().drop(columns="bytes"))


def test_nvlink_bridged_pairs_use_the_bridge_and_larger_groups_keep_pcie() -> None:
    ops = pd.DataFrame({
        "op": ["allreduce"] * 4 + ["sendrecv"],
        "bytes": [2**28] * 5,
        "n_ranks": [2, 2, 4, 4, 2],
        "ranks_per_node": [2, 2, 4, 4, 2],
        "gpu": "a100-pcie-80gb",
        "dtype": "fp16",
        "nvlink_bridged": [False, True, False, True, None],
    })  # fmt: skip
    out = featurize_collectives(ops)
    hw = HardwareSpec.from_name("a100-pcie-80gb")
    assert out["intra_bw_gbps"].tolist() == [32.0, hw.nvlink_bridge_bw_gbps / 2, 32.0, 32.0, 32.0]
    assert out["intra_link_kind"].tolist() == ["pcie", "nvlink", "pcie", "pcie", "pcie"]
    assert out["alpha_beta_ms"][1] < out["alpha_beta_ms"][0] / 5  # 300 vs 32 GB/s a direction
    assert out["alpha_beta_ms"][3] == out["alpha_beta_ms"][2]  # a 4-GPU ring crosses PCIe between bridges
    # parts whose scale-up link is not PCIe are unaffected; a PCIe card without a bridge figure is an error
    sxm = featurize_collectives(ops.assign(gpu="a100-sxm4-80gb"))
    assert sxm["alpha_beta_ms"][1] == sxm["alpha_beta_ms"][0]
    with pytest.raises(SpecError, match="nvlink_bridged=True but p100-pcie-16gb has no nvlink_bridge_bw_gbps"):
        featurize_collectives(ops.assign(gpu="p100-pcie-16gb"))
