"""Where boosters are trained: in this process (``xgboost.train``) or on a Dask cluster (``xgboost.dask``).

The learned models call :func:`train_booster` for each booster they fit. By default it
trains in this process. Inside ``with train_on_dask(client):`` the same call builds a
``DaskDMatrix`` from the rows, split over the cluster's workers and persisted there, and
trains with ``xgboost.dask.train``: the boosting rounds run on the workers, and the
booster that comes back is an ordinary ``xgboost.Booster``, saved and predicted like any
other. Distributed ``hist`` sketches its bin edges per worker, so the trees can differ
slightly from the single-process ones (``tests/models/test_boosting.py`` bounds the gap).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

_CLIENT: ContextVar[Any] = ContextVar("perfcast_dask_client", default=None)


@contextmanager
def train_on_dask(client: Any) -> Iterator[None]:
    """Within this block :func:`train_booster` trains on ``client``'s cluster (a ``distributed.Client``)."""
    token = _CLIENT.set(client)
    try:
        yield
    finally:
        _CLIENT.reset(token)


def dask_client() -> Any:
    """The Dask client boosters train on now, or None (this process)."""
    return _CLIENT.get()


def train_booster(
    params: dict[str, Any],
    X: np.ndarray,
    label: np.ndarray,
    *,
    weight: np.ndarray | None = None,
    feature_names: list[str] | None = None,
    num_boost_round: int,
) -> Any:
    """An ``xgboost.Booster`` trained on ``X`` (rows x features) and ``label``, here or on Dask.

    Args:
        params: XGBoost training parameters (``nthread`` applies in this process only).
        X: float feature matrix, one row per sample.
        label: training target, one per row.
        weight: optional sample weights, one per row.
        feature_names: names of the columns of ``X``.
        num_boost_round: number of boosting rounds (trees).
    """
    import xgboost as xgb

    client = _CLIENT.get()
    if client is None:
        dtrain = xgb.DMatrix(X, label=label, weight=weight, feature_names=feature_names, nthread=params.get("nthread"))
        return xgb.train(params, dtrain, num_boost_round=num_boost_round)
    return _train_dask(client, params, X, label, weight, feature_names, num_boost_round)


def _train_dask(
    client: Any,
    params: dict[str, Any],
    X: np.ndarray,
    label: np.ndarray,
    weight: np.ndarray | None,
    feature_names: list[str] | None,
    num_boost_round: int,
) -> Any:
    """``xgboost.dask.train`` on rows split into one chunk per worker, persisted and spread over them."""
    import dask.array as da
    import xgboost.dask as dxgb

    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    rows = max(1, -(-len(X) // n_workers))
    parts = [da.from_array(np.asarray(X, dtype=np.float32), chunks=(rows, X.shape[1])),
             da.from_array(np.asarray(label, dtype=float), chunks=rows)]  # fmt: skip
    if weight is not None:
        parts.append(da.from_array(np.asarray(weight, dtype=float), chunks=rows))
    parts = list(client.persist(parts))
    client.rebalance(parts)  # else one worker may hold every chunk and train alone
    dtrain = dxgb.DaskDMatrix(
        client, parts[0], parts[1], weight=parts[2] if weight is not None else None, feature_names=feature_names
    )
    dask_params = {k: v for k, v in params.items() if k != "nthread"}
    return dxgb.train(client, dask_params, dtrain, num_boost_round=num_boost_round)["booster"]
