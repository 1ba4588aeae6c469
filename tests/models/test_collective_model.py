"""Tests of perfcast.models.collective_model (synthetic alpha-beta data with known figures)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError

from perfcast.errors import BundleError, SpecError
from perfcast.features.collectives import collective_time_s
from perfcast.features.hardware import ClusterSpec
from perfcast.models.collective_model import CollectiveTimeRegressor, table_groups

# Ground truth of the synthetic data: efficiency (achieved / catalog bandwidth), step latency in us.
TRUTH = {"intra:nvlink": (0.8, 4.0), "intra:pcie": (0.6, 10.0), "inter:infiniband": (0.9, 8.0)}
GPUS = {"h100-sxm5-80gb": "intra:nvlink", "a100-sxm4-80gb": "intra:nvlink", "l4": "intra:pcie", "t4": "intra:pcie"}
FAST = {"n_estimators": 30, "max_rows_per_group": 400, "n_jobs": 1}


def _synthetic(gpus: dict[str, str] = GPUS, noise: float = 0.01, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """Rows of every GPU: intra-node all-reduce/all-gather/send-recv, inter-node (1 rank/node) ones."""
    rng = np.random.default_rng(seed)
    rows = []
    sizes = np.logspace(12, 30, 14, base=2).round()
    configs = [("allreduce", 2, 2), ("allreduce", 4, 4), ("allreduce", 8, 8), ("allgather", 4, 4),
               ("sendrecv", 2, 2), ("sendrecv", 2, 1), ("allreduce", 4, 1), ("allreduce", 2, 1)]  # fmt: skip
    for gpu, intra in gpus.items():
        for op, n, rpn in configs:
            c = ClusterSpec.build(gpu, n, rpn)
            eff_in, lat_in = TRUTH[intra]
            eff_out, lat_out = TRUTH["inter:infiniband"]
            t_s = collective_time_s(
                np.full(len(sizes), op),
                sizes,
                np.full(len(sizes), n),
                np.full(len(sizes), rpn),
                intra_bw_gbps=c.intra_node_bw_gbps * eff_in,
                inter_bw_gbps=c.inter_node_bw_gbps * eff_out,
                intra_latency_us=lat_in,
                inter_latency_us=lat_out,
            )
            for b, t in zip(sizes, t_s, strict=True):
                rows.append({"op": op, "bytes": int(b), "n_ranks": n, "ranks_per_node": rpn, "dtype": "fp16",
                             "gpu": gpu, "measured_ms": t * 1e3})  # fmt: skip
    df = pd.DataFrame(rows)
    y = df["measured_ms"].to_numpy() * np.exp(rng.normal(0.0, noise, len(df)))
    return df, y


@pytest.fixture(scope="module")
def data() -> tuple[pd.DataFrame, np.ndarray]:
    return _synthetic()


@pytest.fixture(scope="module")
def fitted(data: tuple[pd.DataFrame, np.ndarray]) -> CollectiveTimeRegressor:
    X, y = data
    return CollectiveTimeRegressor(**FAST).fit(X, y)


def test_fit_recovers_alpha_beta(fitted: CollectiveTimeRegressor) -> None:
    for group, (eff, lat_us) in TRUTH.items():
        assert fitted.efficiency_[group] == pytest.approx(eff, rel=0.03), group
        assert fitted.step_latency_us_[group] == pytest.approx(lat_us, rel=0.1), group
    assert fitted.launch_ms_ < 1e-3


def test_physics_alone_is_accurate(fitted: CollectiveTimeRegressor, data: tuple[pd.DataFrame, np.ndarray]) -> None:
    X, _ = data
    ape = np.abs(fitted.predict_physics(X) / X["measured_ms"].to_numpy() - 1)
    assert np.median(ape) < 0.02
    ape = np.abs(fitted.predict(X) / X["measured_ms"].to_numpy() - 1)
    assert np.median(ape) < 0.03


def test_fit_returns_self(data: tuple[pd.DataFrame, np.ndarray]) -> None:
    X, y = data
    model = CollectiveTimeRegressor(**FAST, calibrate=False)
    assert model.fit(X, y) is model


def test_unfitted_raises() -> None:
    X, _ = _synthetic({"l4": "intra:pcie"})
    model = CollectiveTimeRegressor()
    with pytest.raises(NotFittedError):
        model.predict(X)
    with pytest.raises(NotFittedError):
        model.predict_interval(X)


def test_shapes_and_ordering(fitted: CollectiveTimeRegressor, data: tuple[pd.DataFrame, np.ndarray]) -> None:
    X, _ = data
    pred = fitted.predict(X)
    iv = fitted.predict_interval(X, coverage=0.9)
    assert pred.shape == (len(X),) and iv.shape == (len(X), 2)
    assert (iv[:, 0] <= pred).all() and (pred <= iv[:, 1]).all()
    wide = fitted.predict_interval(X, coverage=0.99)
    assert (wide[:, 0] <= iv[:, 0]).all() and (wide[:, 1] >= iv[:, 1]).all()
    assert "leave-one-GPU-out over 4 GPUs" in fitted.calibration_


def test_unseen_link_group_uses_pooled_fit(data: tuple[pd.DataFrame, np.ndarray]) -> None:
    X, y = data
    nvlink_only = X["gpu"].isin(["h100-sxm5-80gb", "a100-sxm4-80gb"]).to_numpy() & (X["ranks_per_node"] > 1)
    model = CollectiveTimeRegressor(**FAST).fit(X[nvlink_only], y[nvlink_only])
    assert "intra:pcie" not in model.physics_
    assert "2-fold" in model.calibration_ or "5-fold" in model.calibration_
    pred = model.predict(X[X["gpu"] == "t4"])
    assert np.isfinite(pred).all() and (pred > 0).all()


def test_save_load_round_trip(fitted: CollectiveTimeRegressor, data: tuple[pd.DataFrame, np.ndarray], tmp_path) -> None:
    X, _ = data
    meta = fitted._save_to(tmp_path)
    assert (tmp_path / "collective.ubj").is_file()
    meta = json.loads(json.dumps(meta))  # what the bundle's manifest keeps
    loaded = CollectiveTimeRegressor._load_from(tmp_path, meta)
    np.testing.assert_array_equal(loaded.predict(X), fitted.predict(X))
    np.testing.assert_array_equal(loaded.predict_interval(X), fitted.predict_interval(X))
    assert loaded.get_params() == fitted.get_params()


def test_load_refuses_version_mismatch(fitted: CollectiveTimeRegressor, tmp_path) -> None:
    meta = fitted._save_to(tmp_path)
    with pytest.raises(BundleError, match="version"):
        CollectiveTimeRegressor._load_from(tmp_path, {**meta, "feature_spec_version": 99})
    (tmp_path / "collective.ubj").unlink()
    with pytest.raises(BundleError, match="missing"):
        CollectiveTimeRegressor._load_from(tmp_path, meta)


def test_bad_input(data: tuple[pd.DataFrame, np.ndarray], fitted: CollectiveTimeRegressor) -> None:
    X, y = data
    with pytest.raises(SpecError, match="rows"):
        CollectiveTimeRegressor(**FAST).fit(X, y[:-1])
    with pytest.raises(SpecError, match="positive"):
        CollectiveTimeRegressor(**FAST).fit(X, -y)
    with pytest.raises(SpecError, match="coverage"):
        fitted.predict_interval(X, coverage=1.5)
    with pytest.raises(SpecError, match="n_estimators"):
        CollectiveTimeRegressor(n_estimators=0).fit(X, y)


def test_table_groups() -> None:
    X = pd.DataFrame({"gpu": ["a", "a", "b"], "cluster": ["x", None, "y"], "source": ["vidur:p", "vtrain:q", None]})
    assert list(table_groups(X)) == ["a|x|vidur", "a||vtrain", "b|y|"]


def test_out_of_domain_rows_get_the_catalog_alpha_beta(
    fitted: CollectiveTimeRegressor, data: tuple[pd.DataFrame, np.ndarray]
) -> None:
    X, _ = data
    assert not fitted.out_of_domain(X).any()
    big = pd.DataFrame(
        {"op": ["allreduce", "allreduce", "reducescatter", "allreduce"], "bytes": [2**24, 2**24, 2**24, 2**45],
         "n_ranks": [4, 256, 4, 4], "ranks_per_node": [4, 8, 4, 4], "dtype": "fp16", "gpu": "h100-sxm5-80gb"}
    )  # fmt: skip
    ood = fitted.out_of_domain(big)
    assert ood.tolist() == [False, True, True, True]  # in domain; too many ranks and nodes; unseen kind; too large
    c = ClusterSpec.build("h100-sxm5-80gb", 256, 8)
    alpha_beta_ms = 1e3 * collective_time_s(
        np.array(["allreduce"]), np.array([2.0**24]), np.array([256]), np.array([8]),
        intra_bw_gbps=c.intra_node_bw_gbps, inter_bw_gbps=c.inter_node_bw_gbps,
        intra_latency_us=c.intra_node_latency_us, inter_latency_us=c.inter_node_latency_us,
    )  # fmt: skip
    pred, interval = fitted.predict_with_interval(big)
    assert pred[1] == pytest.approx(alpha_beta_ms[0], rel=1e-9)
    assert (interval[:, 0] <= pred).all() and (pred <= interval[:, 1]).all()


def test_domain_survives_save_and_load(fitted: CollectiveTimeRegressor, tmp_path) -> None:
    meta = json.loads(json.dumps(fitted._save_to(tmp_path)))
    loaded = CollectiveTimeRegressor._load_from(tmp_path, meta)
    probe = pd.DataFrame({"op": ["allreduce"] * 2, "bytes": [2**20] * 2, "n_ranks": [8, 512],
                          "ranks_per_node": [8, 8], "dtype": "fp16", "gpu": "a100-sxm4-80gb"})  # fmt: skip
    np.testing.assert_array_equal(loaded.out_of_domain(probe), fitted.out_of_domain(probe))
    np.testing.assert_array_equal(loaded.predict_interval(probe), fitted.predict_interval(probe))
