"""Boosters train in this process or on a real Dask LocalCluster, to nearly the same trees."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

from perfcast.models.boosting import dask_client, train_booster, train_on_dask  # noqa: E402

PARAMS = {"objective": "reg:squarederror", "tree_method": "hist", "eta": 0.3, "max_depth": 4, "seed": 0, "nthread": 1}


def _data(n: int = 4000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(n, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1] ** 2 - X[:, 2] + rng.normal(0, 0.05, n)
    return X, y


def test_dask_training_matches_this_process() -> None:
    import xgboost as xgb

    X, y = _data()
    w = np.linspace(0.5, 1.5, len(y))
    names = ["a", "b", "c"]
    local = train_booster(PARAMS, X, y, weight=w, feature_names=names, num_boost_round=60)
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, host="127.0.0.1",
                      processes=True) as cluster, Client(cluster) as client:  # fmt: skip
        with train_on_dask(client):
            assert dask_client() is client
            remote = train_booster(PARAMS, X, y, weight=w, feature_names=names, num_boost_round=60)
        assert dask_client() is None
    assert isinstance(remote, xgb.Booster) and remote.feature_names == names
    grid = xgb.DMatrix(_data(500)[0], feature_names=names)
    p_local, p_remote = local.predict(grid), remote.predict(grid)
    truth = _data(500)[1]
    rmse = lambda p: float(np.sqrt(np.mean((p - truth) ** 2)))  # noqa: E731
    # both fit the function; the distributed bin sketch moves split points a little, not the fit
    assert rmse(p_remote) < 0.12 and abs(rmse(p_remote) - rmse(p_local)) < 0.03
    assert float(np.median(np.abs(p_remote - p_local))) < 0.1  # the target spans about 8


def test_without_a_client_training_stays_here() -> None:
    X, y = _data(300)
    booster = train_booster(PARAMS, X, y, num_boost_round=5)
    assert dask_client() is None and booster.num_boosted_rounds() == 5
