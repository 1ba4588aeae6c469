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
from perfcast.models.bundle import MANIFEST_FILE, OpPredictorBundle, catalog_hash, load_bundle, save_bundle
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
    bundle = OpPredictorBundle(path=None, manifest={}, op_model=model, collective_model=_FakeCollective())
    pred, lo, hi = bundle.predict_ops(mixed)
    is_coll = mixed["op"].isin(["allreduce", "allgather"]).to_numpy()
    np.testing.assert_array_equal(pred[is_coll], [1.0, 1.0])
    np.testing.assert_array_equal(pred[~is_coll], model.predict(mixed[~is_coll]))
    assert (lo <= pred).all() and (pred <= hi).all()

    no_coll = OpPredictorBundle(path=None, manifest={}, op_model=model)
    pred, lo, hi = no_coll.predict_ops(mixed)  # collectives fall back to the catalog alpha-beta, no interval
    analytic, _, _ = AnalyticOpPredictor().predict_ops(coll)
    np.testing.assert_allclose(pred[is_coll], analytic)
    assert np.isnan(lo[is_coll]).all() and np.isnan(hi[is_coll]).all()

    no_ops = OpPredictorBundle(path=None, manifest={}, collective_model=_FakeCollective())
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
    before = OpPredictorBundle(path=path, manifest={}, op_model=model, collective_model=cmodel).predict_ops(mixed)
    after = load_bundle(path).predict_ops(mixed)
    for a, b in zip(before, after, strict=True):
        np.testing.assert_array_equal(a, b)


class _PlainOpModel:
    """The op model behind only ``predict_with_interval`` and ``out_of_domain`` (no ``predict_flagged``)."""

    def __init__(self, model):
        self.boosters_ = model.boosters_
        self.predict_with_interval = model.predict_with_interval
        self.out_of_domain = model.out_of_domain


def test_predict_ops_flagged_matches_predict_ops_and_out_of_domain(model, data):
    ops, _ = data
    coll = pd.DataFrame({"op": ["allreduce"], "bytes": [1 << 20], "n_ranks": [8], "ranks_per_node": [8],
                         "dtype": "bf16", "gpu": "a100-pcie-40gb"})  # fmt: skip
    attention = pd.DataFrame({"op": ["attention"], "batch": [2], "heads": [8], "seq_q": [512], "seq_kv": [512],
                              "head_dim": [64], "dtype": "bf16", "gpu": "a100-pcie-40gb"})  # fmt: skip
    outside = ops.iloc[:6].assign(gpu="h100-sxm5-80gb")
    mixed = pd.concat([ops.iloc[:5], coll, outside, attention, ops.iloc[-5:]], ignore_index=True)
    for op_model in (model, _PlainOpModel(model)):
        bundle = OpPredictorBundle(path=None, manifest={}, op_model=op_model, collective_model=_FakeCollective())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OutOfDomainWarning)
            pred, lo, hi, ood = bundle.predict_ops_flagged(mixed, coverage=0.8)
            want = bundle.predict_ops(mixed, coverage=0.8)
            flags = bundle.out_of_domain(mixed)
        for got, expected in zip((pred, lo, hi), want, strict=True):
            np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(ood, flags)
        assert ood.sum() == len(outside) and ood.dtype == bool
    empty = OpPredictorBundle(path=None, manifest={}, op_model=model).predict_ops_flagged(mixed.iloc[:0])
    assert [len(a) for a in empty] == [0, 0, 0, 0]
