"""Three-level clusters: GPU, NVLink domain (the node, or a 72-GPU NVL72 rack), scale-out fabric."""

from __future__ import annotations

import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import ClusterSpec, HardwareSpec, collective_cluster
from perfcast.features.parallel import ParallelConfig
from perfcast.features.run_config import parse_run_row
from perfcast.features.workload import Group, fabric_level, group_placement
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.batch import predict_steps_table

GB200_512 = {"model": "llama3-70b", "tp": 4, "pp": 4, "dp": 32, "global_batch": 1024, "micro_batch": 1,
             "sequence_parallel": True, "gpu": "gb200-per-gpu", "num_gpus": 512}  # fmt: skip


def test_the_catalog_gives_nvl72_parts_a_rack_domain_and_hgx_parts_their_node() -> None:
    assert HardwareSpec.from_name("gb200-per-gpu").nvlink_domain_gpus == 72
    assert HardwareSpec.from_name("h100-sxm5-80gb").nvlink_domain_gpus is None
    rack = ClusterSpec.build("gb200-per-gpu", 512)
    assert (rack.gpus_per_node, rack.nvlink_domain, rack.num_domains) == (4, 72, 8)
    assert ClusterSpec.build("gb200-per-gpu", 16).nvlink_domain == 16  # capped at the run
    hgx = ClusterSpec.build("h100-sxm5-80gb", 64)
    assert (hgx.nvlink_domain, hgx.num_domains) == (8, 8)
    assert ClusterSpec.build("gb200-per-gpu", 512, nvlink_domain=64).nvlink_domain == 64


def test_a_domain_must_hold_whole_nodes() -> None:
    with pytest.raises(SpecError, match="nvlink_domain=6 must be a multiple of gpus_per_node=4"):
        ClusterSpec.build("gb200-per-gpu", 512, nvlink_domain=6)
    with pytest.raises(SpecError, match="nvlink_domain=2"):
        ClusterSpec.build("h100-sxm5-80gb", 64, nvlink_domain=2)


def test_a_collective_rows_ranks_per_node_is_its_domain() -> None:
    cluster = collective_cluster("gb200-per-gpu", 64, 16, None)
    assert cluster.nvlink_domain == 16
    assert collective_cluster("gb200-per-gpu", 64, None, None).nvlink_domain == 64  # one rack holds them


def test_groups_are_placed_in_megatron_order() -> None:
    p = ParallelConfig(tp=4, pp=4, dp=32, global_batch=1024)
    rack, tray = group_placement(p, 72), group_placement(p, 4)
    assert rack[Group.TP] == (4, 4) and rack[Group.DP] == (32, 16) and rack[Group.PP] == (2, 1)
    assert tray[Group.DP] == (32, 1)
    assert fabric_level(*rack[Group.TP], "ib") == "nvlink"
    assert fabric_level(*rack[Group.DP], "ib") == "nvlink+ib"
    assert fabric_level(*tray[Group.DP], "ib") == "ib"
    assert fabric_level(1, 1, "ib") == ""


def test_the_run_table_states_or_defaults_the_domain() -> None:
    stated = parse_run_row({**GB200_512, "nvlink_domain": 64})
    assert stated.cluster.nvlink_domain == 64 and "nvlink_domain" not in stated.defaulted
    defaulted = parse_run_row(GB200_512)
    assert defaulted.cluster.nvlink_domain == 72 and "nvlink_domain" in defaulted.defaulted


def test_an_nvl72_rack_syncs_data_parallel_gradients_faster_than_trays_on_infiniband() -> None:
    rows = pd.DataFrame([GB200_512, {**GB200_512, "nvlink_domain": 4}])
    out = predict_steps_table(rows, predictor=StepPredictor.analytic(), breakdown=True)
    rack, trays = out.to_dict("records")
    assert rack["error"] == trays["error"] == ""
    assert rack["link_tp"] == "nvlink" and rack["link_dp"] == "nvlink+ib-ndr-400-gb200-nvl72"
    assert trays["link_dp"] == "ib-ndr-400-gb200-nvl72"
    assert rack["dp_sync_ms"] < trays["dp_sync_ms"] / 3 and rack["step_ms"] < trays["step_ms"]
