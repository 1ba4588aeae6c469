"""``perfcast train ops --dask local`` trains its boosters on a real LocalCluster, to the same model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fixtures.make_fixtures import synthetic_op_records
from typer.testing import CliRunner

pytest.importorskip("distributed")

from perfcast.data.dataset import write_dataset  # noqa: E402
from perfcast.models import boosting  # noqa: E402
from perfcast.models.bundle import load_bundle  # noqa: E402
from perfcast.serve.cli import app  # noqa: E402


def test_train_ops_on_a_local_cluster_matches_one_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = synthetic_op_records(n_per_gpu=80, gpus=("a100-sxm4-80gb", "v100-sxm2-32gb", "t4"))
    data = write_dataset(tmp_path / "ds", source="synthetic", how_measured="generated", ops=records)
    on_dask = []
    real = boosting._train_dask
    monkeypatch.setattr(boosting, "_train_dask", lambda *a, **k: on_dask.append(1) or real(*a, **k))
    base = ["train", "ops", "--data", str(data), "--n-estimators", "30", "--no-evaluate", "--no-collectives",
            "--no-track"]  # fmt: skip
    runner = CliRunner()
    here = runner.invoke(app, [*base, "-o", str(tmp_path / "here")])
    assert here.exit_code == 0, here.output
    assert not on_dask
    remote = runner.invoke(app, [*base, "-o", str(tmp_path / "dask"), "--dask", "local"])
    assert remote.exit_code == 0, remote.output
    assert on_dask, "no booster trained on the cluster"
    ops = records.drop(columns=["measured_ms"])
    a = load_bundle(tmp_path / "here").predict_ops(ops)[0]
    b = load_bundle(tmp_path / "dask").predict_ops(ops)[0]
    # the distributed hist sketch moves split points a little: the same model to within a few percent
    assert float(np.median(np.abs(np.log(b / a)))) < 0.05
