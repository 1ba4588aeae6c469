"""``perfcast evaluate steps|ops DATA``: a user's own measurements against the predictions."""

from __future__ import annotations

import matplotlib.image
import pandas as pd
import pytest
from typer.testing import CliRunner

from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.cli import app
from perfcast.serve.measured_eval import evaluate_measured, load_measured

RUN = {"model": "llama2-7b", "tp": 2, "dp": 4, "global_batch": 32, "gpu": "h100-sxm5-80gb", "num_gpus": 8}


def _measured_runs(tmp_path) -> pd.DataFrame:
    rows = [{**RUN, "global_batch": b} for b in (8, 16, 32, 64, 128)] + [{**RUN, "tp": 3}]
    table = pd.DataFrame(rows)
    predicted = evaluate_measured(table.assign(measured_step_ms=1.0), "steps", StepPredictor.analytic()).rows
    table["measured_step_ms"] = predicted["step_ms"].fillna(1000.0) * [1.1, 0.9, 1.2, 1.0, 1.05, 1.0]
    return table


def test_scores_are_those_of_the_answered_rows(tmp_path) -> None:
    table = _measured_runs(tmp_path)
    result = evaluate_measured(table, "steps", StepPredictor.analytic())
    assert result.summary["n"] == 5 and result.summary["n_unanswered"] == 1
    assert result.summary["mape"] == pytest.approx(100 * (0.1 / 1.1 + 0.1 / 0.9 + 0.2 / 1.2 + 0 + 0.05 / 1.05) / 5)
    assert result.summary["spearman"] == pytest.approx(1.0)
    assert list(result.by_group["gpu"]) == ["h100-sxm5-80gb"]


def test_evaluate_steps_prints_the_metrics_and_writes_the_parity_plot(tmp_path) -> None:
    data, plot, rows = tmp_path / "mine.csv", tmp_path / "parity.png", tmp_path / "rows.csv"
    _measured_runs(tmp_path).to_csv(data, index=False)
    result = CliRunner().invoke(app, ["evaluate", "steps", str(data), "--model", "analytic", "--plot", str(plot),
                                      "-o", str(rows)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "5 of 6 measured steps" in result.output and "MAPE" in result.output and "Spearman" in result.output
    assert matplotlib.image.imread(plot).shape[0] > 100
    assert len(pd.read_csv(rows)) == 6


def test_evaluate_ops_reads_a_torch_profiler_trace(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    layer, x = torch.nn.Linear(64, 64), torch.randn(16, 64)
    trace = tmp_path / "run.pt.trace.json"
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            torch.nn.functional.gelu(layer(x)).sum().backward()
    prof.export_chrome_trace(str(trace))
    assert not load_measured(trace, "ops", device="h100-sxm5-80gb").empty
    plot = tmp_path / "ops.png"
    result = CliRunner().invoke(app, ["evaluate", "ops", str(trace), "--gpu", "h100-sxm5-80gb", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert "measured ops predicted by" in result.output and "MAPE" in result.output
    assert matplotlib.image.imread(plot).shape[0] > 100


def test_data_without_measurements_is_a_one_line_error(tmp_path) -> None:
    data = tmp_path / "plain.csv"
    pd.DataFrame([RUN]).to_csv(data, index=False)
    result = CliRunner().invoke(app, ["evaluate", "steps", str(data), "--model", "analytic"])
    assert result.exit_code == 2 and "measured_step_ms" in result.output
