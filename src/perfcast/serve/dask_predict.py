"""Batch prediction on a Dask cluster: the single-machine rows and predictions, in partitions.

``perfcast predict steps|ops --dask local|ADDRESS`` reads the input with
``dask.dataframe``, predicts each partition on a worker with the same batch functions as
the single-machine path (:mod:`perfcast.serve.batch`) and returns the rows in input
order. Each worker loads the predictor once by its reference (``analytic``, a bundle
folder, an MLflow URI; the shipped default when None) through
:func:`~perfcast.serve.predictors.load_calibrated_predictor`, with the stored calibrations
of the client's calibration folder unless told not to, and keeps it for the next partitions. ``local`` starts a
``LocalCluster`` on this machine (one thread per worker).
"""

from __future__ import annotations

import functools
import io
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from perfcast._optional import require
from perfcast.errors import SpecError
from perfcast.models.physics_bounds import AT_CEILING_COLUMN
from perfcast.serve.batch import warn_at_ceiling
from perfcast.serve.calibration_store import calibration_dir

KINDS = ("steps", "ops")
LOCAL = "local"


@functools.lru_cache(maxsize=4)
def _predictor(kind: str, ref: str | None, calibration: bool, folder: str | None) -> Any:
    from perfcast.serve.predictors import load_calibrated_predictor

    return load_calibrated_predictor(kind, ref, calibration, folder=folder)


def _typed(part: pd.DataFrame) -> pd.DataFrame:
    """A CSV partition read as text, typed as pandas types a whole CSV file (what ``read_table`` does)."""
    return pd.read_csv(io.StringIO(part.to_csv(index=False))).set_axis(part.index)


def predict_partition(
    part: pd.DataFrame,
    kind: str,
    ref: str | None,
    coverage: float,
    calibration: bool,
    text: bool,
    folder: str | None = None,
) -> pd.DataFrame:
    """Predict one partition with the worker's cached predictor (the single-machine functions).

    ``text``: the partition was read from CSV as strings and is typed first. ``folder``:
    the calibration folder (None: the worker's own :func:`calibration_dir`).
    """
    from perfcast.serve.batch import predict_ops_table, predict_steps_table

    part = _typed(part) if text else part
    predictor = _predictor(kind, ref, calibration, folder)
    if kind == "steps":
        return predict_steps_table(part, predictor=predictor, coverage=coverage)
    return predict_ops_table(part, predictor=predictor, coverage=coverage)


@contextmanager
def dask_client(address: str, n_workers: int = 2, timeout_s: float = 30.0) -> Iterator[Any]:
    """A client of a new ``LocalCluster`` (``address="local"``) or of the scheduler at ``address``.

    Raises:
        SpecError: no scheduler answers at ``address`` within ``timeout_s`` seconds.
    """
    require("dask", "distributed", purpose="--dask")
    from distributed import Client, LocalCluster

    if address == LOCAL:
        with LocalCluster(n_workers=n_workers, threads_per_worker=1, dashboard_address=None,
                          host="127.0.0.1", processes=True) as cluster, Client(cluster) as client:  # fmt: skip
            yield client
        return
    try:
        client = Client(address, timeout=f"{timeout_s}s")
    except (OSError, TimeoutError) as exc:
        raise SpecError(
            f"--dask={address!r}: no Dask scheduler answered within {timeout_s:g} s ({exc}); "
            f"allowed: '{LOCAL}' or a scheduler address such as tcp://host:8786"
        ) from None
    with client:
        yield client


def predict_table_dask(
    path: str | Path,
    kind: str,
    *,
    address: str = LOCAL,
    ref: str | None = None,
    coverage: float = 0.9,
    calibration: bool = True,
    blocksize: str = "16MB",
) -> pd.DataFrame:
    """Predict the op or run table at ``path`` on a Dask cluster; rows come back in input order.

    Raises:
        SpecError: an unknown kind, or a file type other than CSV/Parquet.
    """
    import dask.dataframe as dd

    if kind not in KINDS:
        raise SpecError(f"kind={kind!r} unknown; allowed: {', '.join(KINDS)}")
    name = str(path)
    if name.endswith(".parquet"):
        frame = dd.read_parquet(name)
    elif name.endswith((".csv", ".csv.gz")):
        frame = dd.read_csv(name, blocksize=None if name.endswith(".gz") else blocksize, dtype=object)
    else:
        raise SpecError(f"{path}: give a .csv, .csv.gz or .parquet table for --dask")
    text = not name.endswith(".parquet")
    folder = str(calibration_dir()) if calibration else None  # the client's folder, read by every worker
    args = (kind, ref, coverage, calibration, text, folder)
    with warnings.catch_warnings():  # the columns of two rows; the warnings come from the whole table below
        warnings.simplefilter("ignore")
        meta = predict_partition(frame.head(2, npartitions=-1), *args).iloc[:0]
    with dask_client(address) as client:
        parts = frame.map_partitions(predict_partition, *args, meta=meta)
        result = client.compute(parts).result()
    result = result.reset_index(drop=True)
    if kind == "steps":  # the workers' own warnings stay on the workers
        warn_at_ceiling(result[AT_CEILING_COLUMN].astype("boolean"), stacklevel=3)
    return result
