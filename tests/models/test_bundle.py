"""Bundles: save/load round trip, manifest, refusals, dispatch by op class."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import BundleError, OutOfDomainWarning
from perfcast.features.op_features import FEATURE_SPEC_VERSION, featurize_ops
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.bundle import (
    FILE_HASHES,
    MANIFEST_FILE,
    PredictorBundle,
    catalog_hash,
    load_bundle,
    save_bundle,
)
from perfcast.models.op_model import OpTimeRegressor

GPUS = {"a100-pcie-40gb": 0.7, "v100-pcie-32gb": 0.64, "t4": 0.6}


def _ops(n: int = 60, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    parts = []
    for gpu in GPUS:
        dims = np.exp(rng.uniform(np.log(8), np.log(2048), size=(n, 3))).astype(int)
        parts.append(pd.DataFrame({"op": "bmm", "batch": 4, "m": dims[:, 0], "n": dims[:, 1], "k": dims[:, 2],
                                   "dtype": "fp32", "gpu": gpu}))  # fmt: skip
        parts.append(pd.DataFrame({"op": "softmax", "rows": dims[:, 0] * 4, "cols": dims[:, 1],
                                   "dtype": "fp32", "gpu": gpu}))  # fmt: skip
    ops = pd.concat(parts, ignore_index=True)
    roof = featurize_ops(ops)["roofline_ms"].to_numpy()
    t = 0.01 + roof / ops["gpu"].map(GPUS).to_numpy() * np.exp(rng.normal(0, 0.05, len(ops)))
    return ops, t


@pytest.fixture(scope="module")
def data():
    return _ops()


@pytest.fixture(scope="module")
def model(data):
    ops, t = data
    return OpTimeRegressor(n_estimators=20, learning_rate=0.3, n_jobs=1).fit(ops, t)


@pytest.fixture
def bundle_dir(tmp_path, model):
    return save_bundle(
        tmp_path / "bundle",
        op_model=model,
        metrics={"logo_mape_gemm": 0.19},
        datasets={"synthetic": "abc123"},
    )


def test_round_trip_identical_predictions(bundle_dir, model, data):
    ops, _ = data
    loaded = load_bundle(bundle_dir)
    np.testing.assert_array_equal(loaded.op_model.predict(ops), model.predict(ops))
    np.testing.assert_array_equal(loaded.op_model.predict_interval(ops), model.predict_interval(ops))
    pred, lo, hi = loaded.predict_ops(ops, coverage=0.8)
    np.testing.assert_array_equal(pred, model.predict(ops))
    interval = model.predict_interval(ops, coverage=0.8)
    np.testing.assert_array_equal(lo, interval[:, 0])
    np.testing.assert_array_equal(hi, interval[:, 1])
    assert loaded.op_model.get_params() == model.get_params()
    assert loaded.op_model.launch_ms_ == model.launch_ms_


def test_manifest_contents(bundle_dir):
    manifest = json.loads((bundle_dir / MANIFEST_FILE).read_text())
    assert manifest["feature_spec_version"] == FEATURE_SPEC_VERSION
    assert manifest["catalog_sha256"] == catalog_hash()
    assert manifest["datasets"] == {"synthetic": "abc123"}
    assert manifest["metrics"] == {"logo_mape_gemm": 0.19}
    assert manifest["perfcast_version"]
    assert sorted(manifest["models"]["op"]["files"]) == ["op_gemm.ubj", "op_vector.ubj"]
    assert load_bundle(bundle_dir).metrics == {"logo_mape_gemm": 0.19}


def test_no_pickles(bundle_dir):
    names = sorted(p.name for p in bundle_dir.rglob("*"))
    assert names == [MANIFEST_FILE, "op_gemm.ubj", "op_vector.ubj"]
    for path in bundle_dir.iterdir():
        assert not path.read_bytes().startswith(b"\x80")  # pickle protocol 2+ opcode


def test_feature_spec_mismatch_refused(bundle_dir):
    manifest = json.loads((bundle_dir / MANIFEST_FILE).read_text())
    manifest["feature_spec_version"] = FEATURE_SPEC_VERSION + 1
    (bundle_dir / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="FeatureSpec version"):
        load_bundle(bundle_dir)


def test_missing_file_named(bundle_dir):
    (bundle_dir / "op_vector.ubj").unlink()
    with pytest.raises(BundleError, match="op_vector.ubj"):
        load_bundle(bundle_dir)
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(bundle_dir / "nope")


def test_save_needs_a_model(tmp_path):
    with pytest.raises(BundleError, match="neither"):
        save_bundle(tmp_path / "empty")


def test_save_replaces_existing_bundle(bundle_dir, model):
    again = save_bundle(bundle_dir, op_model=model, metrics={"v": 2})
    assert load_bundle(again).metrics == {"v": 2}
    assert [p.name for p in again.parent.iterdir() if p.name.startswith(".")] == []


class _FakeCollective:
    """Stands in for CollectiveTimeRegressor: 1 ms per row, interval [0.5, 2] ms."""

    def predict(self, X):
        return np.ones(len(X))

    def predict_interval(self, X, *, coverage=0.9):
        return np.column_stack([np.full(len(X), 0.5), np.full(len(X), 2.0)])

    def predict_with_interval(self, X, *, coverage=0.9):
        return self.predict(X), self.predict_interval(X, coverage=coverage)


def test_predict_ops_dispatches_by_class(model, data):
    ops, _ = data
    coll = pd.DataFrame({"op": ["allreduce", "allgather"], "bytes": [1 << 20, 1 << 22], "n_ranks": [8, 8],
                         "ranks_per_node": [8, 8], "dtype": "bf16", "gpu": "a100-pcie-40gb"})  # fmt: skip
    mixed = pd.concat([ops.iloc[:5], coll, ops.iloc[5:8]], ignore_index=True)
    bundle = PredictorBundle(path=None, manifest={}, op_model=model, collective_model=_FakeCollective())
    pred, lo, hi = bundle.predict_ops(mixed)
    is_coll = mixed["op"].isin(["allreduce", "allgather"]).to_numpy()
    np.testing.assert_array_equal(pred[is_coll], [1.0, 1.0])
    np.testing.assert_array_equal(pred[~is_coll], model.predict(mixed[~is_coll]))
    assert (lo <= pred).all() and (pred <= hi).all()

    no_coll = PredictorBundle(path=None, manifest={}, op_model=model)
    pred, lo, hi = no_coll.predict_ops(mixed)  # collectives fall back to the catalog alpha-beta, no interval
    analytic, _, _ = AnalyticOpPredictor().predict_ops(coll)
    np.testing.assert_allclose(pred[is_coll], analytic)
    assert np.isnan(lo[is_coll]).all() and np.isnan(hi[is_coll]).all()

    no_ops = PredictorBundle(path=None, manifest={}, collective_model=_FakeCollective())
    pred, lo, _ = no_ops.predict_ops(mixed)  # compute rows fall back to the roofline
    np.testing.assert_allclose(pred[~is_coll], AnalyticOpPredictor().predict_ops(mixed[~is_coll])[0])
    assert np.isnan(lo[~is_coll]).all()


def test_round_trip_with_collective_model(tmp_path, model, data):
    collective_model = pytest.importorskip("perfcast.models.collective_model")
    sizes = np.logspace(12, 28, 12, base=2).round()
    coll = pd.DataFrame(
        [{"op": op, "bytes": int(b), "n_ranks": n, "ranks_per_node": n, "dtype": "fp16", "gpu": gpu}
         for gpu in ("a100-sxm4-80gb", "t4") for op, n in (("allreduce", 2), ("allreduce", 8), ("allgather", 4))
         for b in sizes]
    )  # fmt: skip
    y = 0.01 + coll["bytes"].to_numpy() / 1e8 * np.where(coll["gpu"] == "t4", 5.0, 1.0)
    cmodel = collective_model.CollectiveTimeRegressor(n_estimators=10, n_jobs=1).fit(coll, y)
    path = save_bundle(tmp_path / "b", op_model=model, collective_model=cmodel)
    assert "collective.ubj" in {p.name for p in path.iterdir()}
    mixed = pd.concat([data[0].iloc[:6], coll.iloc[::5]], ignore_index=True)
    before = PredictorBundle(path=path, manifest={}, op_model=model, collective_model=cmodel).predict_ops(mixed)
    after = load_bundle(path).predict_ops(mixed)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


def test_predict_ops_flagged_matches_predict_ops_and_out_of_domain(model, data):
    ops, _ = data
    coll = pd.DataFrame({"op": ["allreduce"], "bytes": [1 << 20], "n_ranks": [8], "ranks_per_node": [8],
                         "dtype": "bf16", "gpu": "a100-pcie-40gb"})  # fmt: skip
    attention = pd.DataFrame({"op": ["attention"], "batch": [2], "heads": [8], "seq_q": [512], "seq_kv": [512],
                              "head_dim": [64], "dtype": "bf16", "gpu": "a100-pcie-40gb"})  # fmt: skip
    outside = ops.iloc[:6].assign(gpu="h100-sxm5-80gb")
    mixed = pd.concat([ops.iloc[:5], coll, outside, attention, ops.iloc[-5:]], ignore_index=True)
    bundle = PredictorBundle(path=None, manifest={}, op_model=model, collective_model=_FakeCollective())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OutOfDomainWarning)
        pred, lo, hi, ood = bundle.predict_ops_flagged(mixed, coverage=0.8)
        want = bundle.predict_ops(mixed, coverage=0.8)
        flags = bundle.out_of_domain(mixed)
    for got, expected in zip((pred, lo, hi), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(ood, flags)
    assert ood.sum() == len(outside) and ood.dtype == bool
    empty = PredictorBundle(path=None, manifest={}, op_model=model).predict_ops_flagged(mixed.iloc[:0])
    assert [len(a) for a in empty] == [0, 0, 0, 0]


# ----------------------------------------------------------------------------- checksums and malformed bundles


def _manifest(path):
    return json.loads((path / MANIFEST_FILE).read_text())


def _write_manifest(path, manifest):
    (path / MANIFEST_FILE).write_text(json.dumps(manifest))


def _damage(file):
    raw = bytearray(file.read_bytes())
    raw[len(raw) // 3 : len(raw) // 3 + 256] = b"\xff" * 256
    file.write_bytes(bytes(raw))


def test_manifest_records_a_checksum_per_file(bundle_dir):
    import hashlib

    hashes = _manifest(bundle_dir)[FILE_HASHES]
    assert sorted(hashes) == ["op_gemm.ubj", "op_vector.ubj"]
    for name, digest in hashes.items():
        assert hashlib.sha256((bundle_dir / name).read_bytes()).hexdigest() == digest


def test_damaged_or_empty_booster_refused_before_xgboost_parses_it(bundle_dir, monkeypatch):
    import xgboost as xgb

    parsed = []
    monkeypatch.setattr(xgb.Booster, "load_model", lambda self, fname: parsed.append(fname))
    _damage(bundle_dir / "op_vector.ubj")
    with pytest.raises(BundleError, match=r"op_vector\.ubj is damaged or was changed after saving"):
        load_bundle(bundle_dir)
    (bundle_dir / "op_vector.ubj").write_bytes(b"")
    with pytest.raises(BundleError, match=r"op_vector\.ubj is empty"):
        load_bundle(bundle_dir)
    assert parsed == []


def test_bundle_without_checksums_is_refused_with_what_to_do(bundle_dir):
    manifest = _manifest(bundle_dir)
    del manifest[FILE_HASHES]
    manifest["schema_version"] = 1
    _write_manifest(bundle_dir, manifest)
    with pytest.raises(BundleError, match="no file checksums.*retrain it"):
        load_bundle(bundle_dir)


def _set(path, value):
    def edit(manifest):
        *parents, last = path
        node = manifest
        for key in parents:
            node = node[key]
        if value is _DELETE:
            del node[last]
        else:
            node[last] = value

    return edit


_DELETE = object()


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_set(("models", "op", "class"), _DELETE), r"models\.op\.class must be a non-empty string"),
        (_set(("models", "op", "class"), None), r"models\.op\.class must be a non-empty string"),
        (_set(("models", "op", "class"), "perfcast.models.step_model.StepTimeRegressor"), "step model metadata"),
        (_set(("models", "op", "class"), "os.system"), "not a perfcast.models class"),
        (_set(("models", "op", "hook"), 3), r"models\.op\.hook must be a non-empty string"),
        (_set(("models", "op", "meta"), None), r"models\.op\.meta must be an object"),
        (_set(("models", "op", "files"), None), r"models\.op\.files must be a non-empty list"),
        (_set(("models", "op", "files"), []), r"models\.op\.files must be a non-empty list"),
        (_set(("models", "op", "meta", "files", "gemm"), "../outside.ubj"), "not a plain file name"),
        (_set(("models", "op", "meta", "files", "gemm"), "/etc/passwd"), "not a plain file name"),
        (_set(("models", "op", "meta", "files", "gemm"), None), "not a plain file name"),
        (_set(("models", "op", "meta", "files", "attention"), "extra.ubj"), "does not cover"),
        (_set(("models", "op", "meta", "feature_names"), _DELETE), "malformed"),
        (_set(("models", "op", "meta", "launch_ms"), []), "fail to predict"),
        (_set(("models", "op", "meta", "gpu_shifts", "gemm"), None), "fail to predict"),
        (_set(("models", "op", "meta", "params", "n_jobs"), "x"), "fail to predict"),
        (_set(("models",), {}), "lists no models"),
        (_set(("models",), None), "lists no models"),
        (_set(("models", "step"), {"class": "x"}), r"models\.step\.hook"),
        (_set(("metrics",), [1]), "metrics must be an object"),
        (_set((FILE_HASHES,), None), f"{FILE_HASHES} must be a non-empty object"),
        (_set((FILE_HASHES, "op_gemm.ubj"), "abc"), "is not a sha256 hex digest"),
        (_set((FILE_HASHES, "op_gemm.ubj"), _DELETE), "does not cover"),
        (_set((FILE_HASHES, "missing.ubj"), "0" * 64), r"missing\.ubj is missing"),
        (_set(("schema_version",), 99), "schema_version=99"),
    ],
)
def test_malformed_manifest_is_a_bundle_error(bundle_dir, edit, match):
    manifest = _manifest(bundle_dir)
    edit(manifest)
    _write_manifest(bundle_dir, manifest)
    with pytest.raises(BundleError, match=match):
        load_bundle(bundle_dir)


def test_manifest_that_is_not_json_or_not_an_object(bundle_dir):
    for text in ("{", "[]", "null", '"x"'):
        (bundle_dir / MANIFEST_FILE).write_text(text)
        with pytest.raises(BundleError):
            load_bundle(bundle_dir)


def test_save_never_replaces_a_folder_that_is_not_a_bundle(tmp_path, model):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(BundleError, match="not a bundle"):
        save_bundle(mine, op_model=model)
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def _cli(*args, env=None):
    import os
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-m", "perfcast.serve.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})},
    )


def test_cli_on_a_damaged_bundle_exits_2_naming_the_file(tmp_path):
    """XGBoost's parser crashes the process (SIGSEGV, exit 139, no message) on some damaged boosters,
    such as the shipped GEMM booster with 8 bytes overwritten below; the checksum refuses it first."""
    import random
    import shutil

    from perfcast.serve.predictors import default_bundle_path

    bundle = tmp_path / "bundle"
    shutil.copytree(default_bundle_path(), bundle)
    booster = bundle / "op_gemm.ubj"
    raw = bytearray(booster.read_bytes())
    at = random.Random(17).randrange(len(raw))
    raw[at : at + 8] = b"\x7f" * 8
    booster.write_bytes(bytes(raw))
    runs = tmp_path / "runs.csv"
    pd.DataFrame([{"model": "gpt3-125m", "gpu": "h100-sxm5-80gb", "dp": 2, "micro_batch": 2,
                   "global_batch": 8}]).to_csv(runs, index=False)  # fmt: skip
    done = _cli("predict", "steps", str(runs), "-o", str(tmp_path / "out.csv"), "--model", str(bundle))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "op_gemm.ubj" in done.stderr and "Traceback" not in done.stderr
    served = _cli("serve", "--model", str(bundle), "--port", "1")
    assert served.returncode == 2, served.stderr[-2000:]
    assert "op_gemm.ubj" in served.stderr and "Traceback" not in served.stderr
    booster.write_bytes(b"")
    empty = _cli("predict", "steps", str(runs), "-o", str(tmp_path / "out.csv"), "--model", str(bundle))
    assert empty.returncode == 2 and "op_gemm.ubj is empty" in empty.stderr
