"""Tests of the ``perfcast hardware`` sub-app, run alone through Typer's CliRunner."""

from __future__ import annotations

import csv
import io
import json

from typer.testing import CliRunner

from perfcast.features.hardware import list_hardware
from perfcast.serve.cli.hardware_cmd import hardware_app

runner = CliRunner()


def test_list_table_shows_every_id():
    result = runner.invoke(hardware_app, ["list"])
    assert result.exit_code == 0, result.output
    assert "bf16 TFLOPS" in result.output and "link GB/s" in result.output
    for spec in list_hardware():
        assert spec.id in result.output


def test_list_csv_has_one_row_per_entry_with_figures():
    result = runner.invoke(hardware_app, ["list", "--format", "csv"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["id"] for r in rows] == [s.id for s in list_hardware()]
    h100 = next(r for r in rows if r["id"] == "h100-sxm5-80gb")
    assert float(h100["peak_bf16_tflops"]) == 989.5
    assert float(h100["mem_bw_gbps"]) == 3350.0
    nvl = next(r for r in rows if r["id"] == "h100-nvl-94gb")
    assert nvl["peak_bf16_tflops"] == ""  # unknown stays empty


def test_list_json():
    result = runner.invoke(hardware_app, ["list", "-f", "json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert len(records) == len(list_hardware())
    assert set(records[0]) == {
        "id",
        "name",
        "vendor",
        "peak_bf16_tflops",
        "peak_fp32_tflops",
        "mem_gib",
        "mem_bw_gbps",
        "tdp_w",
        "intra_node_bw_gbps",
    }


def test_show_resolves_alias_json():
    result = runner.invoke(hardware_app, ["show", "NVIDIA H100 80GB HBM3", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["id"] == "h100-sxm5-80gb"
    assert data["default_fabric"] == "ib-ndr-400-dgx-h100"
    assert "NVIDIA H100 80GB HBM3" in data["aliases"]


def test_show_table_lists_fields():
    result = runner.invoke(hardware_app, ["show", "mi300x"])
    assert result.exit_code == 0, result.output
    for text in ("mi300x", "peak_bf16_tflops", "1307.4", "default_fabric", "roce-400gbe"):
        assert text in result.output


def test_show_unknown_exits_2_with_one_line_on_stderr():
    result = runner.invoke(hardware_app, ["show", "h10-sxm5-80gb"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "h10-sxm5-80gb" in lines[0] and "did you mean" in lines[0]
    assert result.stdout == ""


def test_listings_print_machine_readable_formats():
    import json

    from perfcast.serve.cli import app as cli

    hardware = [
        json.loads(line) for line in runner.invoke(cli, ["hardware", "list", "--format", "jsonl"]).stdout.splitlines()
    ]
    assert {"h100-sxm5-80gb", "gb200-per-gpu"} <= {row["id"] for row in hardware}
    presets = json.loads(runner.invoke(cli, ["models", "list", "--format", "json"]).stdout)
    assert any(row["id"] == "llama3-8b" and row["params_b"] > 7 for row in presets)
    shown = json.loads(runner.invoke(cli, ["models", "show", "llama3-8b"]).stdout)
    assert shown["num_layers"] == 32 and shown["num_params"] > 7e9
    ranked = runner.invoke(cli, ["search", "gpt3-125m", "--gpu", "a100-sxm4-80gb", "--num-gpus", "4",
                                 "--global-batch", "16", "--predictor", "analytic", "--format", "csv"])  # fmt: skip
    assert ranked.exit_code == 0 and ranked.stdout.splitlines()[0].startswith("rank,")
