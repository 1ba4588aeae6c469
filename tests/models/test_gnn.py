"""Tests of perfcast.models.gnn on small synthetic configs (no shared data needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from torch_geometric.data import Batch  # noqa: E402

from perfcast.errors import SpecError  # noqa: E402
from perfcast.features.roofline import op_time_ms  # noqa: E402
from perfcast.features.run_config import parse_run_row  # noqa: E402
from perfcast.features.schedule import compose_step  # noqa: E402
from perfcast.features.workload import build_workload_graph  # noqa: E402
from perfcast.models.gnn import (  # noqa: E402
    GRAPH_FEATURE_NAMES,
    NODE_FEATURE_NAMES,
    StepGNNRegressor,
    basic_graph_features,
    build_step_graph,
    graph_to_data,
)

TINY = {"hidden": 8, "num_layers": 1, "n_members": 2, "epochs": 3, "batch_size": 8, "num_threads": 1}


def _row(num_layers: int, hidden: int, tp: int, dp: int, micro_batch: int) -> dict:
    return {
        "num_layers": num_layers,
        "hidden_size": hidden,
        "num_heads": 8,
        "vocab_size": 8192,
        "seq_len": 256,
        "tp": tp,
        "dp": dp,
        "micro_batch": micro_batch,
        "global_batch": 8 * dp,
        "gpu": "a100-sxm4-80gb",
        "num_gpus": tp * dp,
    }


def _configs() -> list:
    rows = [
        _row(L, h, tp, dp, mb)
        for L in (2, 4)
        for h in (256, 512)
        for tp, dp in ((1, 2), (2, 1), (2, 2), (1, 4))
        for mb in (1, 2)
    ]
    return [parse_run_row(r) for r in rows]


def _truth(samples: list, configs: list) -> np.ndarray:
    """Synthetic measured steps: the composition off by a factor growing with tp, plus 2% noise."""
    rng = np.random.default_rng(0)
    tp = np.array([c.parallel.tp for c in configs])
    composed = np.array([s.composed_ms for s in samples])
    return composed * (1.5 + 0.5 * np.log2(tp)) * np.exp(rng.normal(0.0, 0.02, len(samples)))


@pytest.fixture(scope="module")
def dataset() -> tuple[list, np.ndarray]:
    configs = _configs()
    samples = [build_step_graph(c) for c in configs]
    return samples, _truth(samples, configs)


@pytest.fixture(scope="module")
def fitted(dataset: tuple[list, np.ndarray]) -> StepGNNRegressor:
    X, y = dataset
    return StepGNNRegressor(**TINY).fit(X, y)


# ----------------------------------------------------------------------------- graphs


def test_graph_to_data_is_valid_and_aligned() -> None:
    config = _configs()[5]
    graph = build_workload_graph(config.model, config.parallel, config.cluster)
    op_ms = op_time_ms(graph.nodes, config.cluster)
    data = graph_to_data(graph, op_ms, basic_graph_features(config))
    data.validate(raise_on_error=True)
    assert data.x.shape == (len(graph.nodes), len(NODE_FEATURE_NAMES))
    assert data.edge_index.shape == (2, 2 * len(graph.edges))
    assert data.edge_type.sum().item() == len(graph.edges)  # one reverse copy per edge
    assert data.u.shape == (1, len(GRAPH_FEATURE_NAMES))
    assert data.node_weight.sum().item() == pytest.approx(1.0, rel=1e-5)
    assert np.isfinite(data.x.numpy()).all()


def test_node_times_come_from_the_caller() -> None:
    config = _configs()[5]
    graph = build_workload_graph(config.model, config.parallel, config.cluster)
    op_ms = op_time_ms(graph.nodes, config.cluster)
    col = NODE_FEATURE_NAMES.index("log_time_ms")
    base = graph_to_data(graph, op_ms, basic_graph_features(config))
    doubled = graph_to_data(graph, 2 * op_ms, basic_graph_features(config))
    assert np.allclose(doubled.x[:, col] - base.x[:, col], np.log(2.0), atol=1e-5)
    share = NODE_FEATURE_NAMES.index("log_time_share")
    assert np.allclose(doubled.x[:, share], base.x[:, share], atol=1e-5)
    sample = build_step_graph(config, op_ms=2 * op_ms)
    assert sample.composed_ms == pytest.approx(compose_step(graph, 2 * op_ms).step_ms)
    assert sample.composed_ms > build_step_graph(config).composed_ms


def test_graph_to_data_rejects_bad_input() -> None:
    config = _configs()[0]
    graph = build_workload_graph(config.model, config.parallel, config.cluster)
    u = basic_graph_features(config)
    with pytest.raises(SpecError, match="op_ms"):
        graph_to_data(graph, np.ones(3), u)
    nodes = graph.nodes.copy()
    nodes.loc[0, "group"] = "zz"
    odd = type(graph)(nodes, graph.edges, graph.dense_layers_per_stage, 0, graph.num_microbatches, graph.pp, 1)
    with pytest.raises(SpecError, match="group"):
        graph_to_data(odd, np.ones(len(nodes)), u)


# ----------------------------------------------------------------------------- estimator contract


def test_fit_returns_self_and_sets_state(dataset: tuple[list, np.ndarray]) -> None:
    X, y = dataset
    model = StepGNNRegressor(**TINY)
    assert model.fit(X, y) is model
    assert len(model.members_) == TINY["n_members"]
    assert model.calibration_split_ == "group"  # 2 and 4 GPUs: the 4-GPU runs calibrate
    assert model.conformal_scores_.size == sum(s.data.u[0, -3].item() == 2 for s in X)


def test_predict_before_fit_raises(dataset: tuple[list, np.ndarray]) -> None:
    with pytest.raises(NotFittedError):
        StepGNNRegressor(**TINY).predict(dataset[0])


def test_shapes_and_ordering(fitted: StepGNNRegressor, dataset: tuple[list, np.ndarray]) -> None:
    X, _ = dataset
    pred = fitted.predict(X)
    interval = fitted.predict_interval(X, coverage=0.9)
    assert pred.shape == (len(X),) and interval.shape == (len(X), 2)
    assert (pred > 0).all()
    assert (interval[:, 0] <= pred).all() and (pred <= interval[:, 1]).all()


def test_interval_widens_with_coverage(fitted: StepGNNRegressor, dataset: tuple[list, np.ndarray]) -> None:
    X, _ = dataset
    widths = [np.diff(fitted.predict_interval(X, coverage=c), axis=1).ravel() for c in (0.5, 0.8, 0.95)]
    assert (widths[0] <= widths[1]).all() and (widths[1] <= widths[2]).all()
    assert widths[2].mean() > widths[0].mean()
    with pytest.raises(SpecError, match="coverage"):
        fitted.predict_interval(X, coverage=1.0)


def test_deterministic_with_seed(fitted: StepGNNRegressor, dataset: tuple[list, np.ndarray]) -> None:
    X, y = dataset
    again = clone(fitted).fit(X, y)
    assert np.array_equal(again.predict(X), fitted.predict(X))


def test_save_load_round_trip(fitted: StepGNNRegressor, dataset: tuple[list, np.ndarray], tmp_path) -> None:
    X, _ = dataset
    meta = fitted._save_to(tmp_path)
    meta = json.loads(json.dumps(meta))  # what a manifest stores
    loaded = StepGNNRegressor._load_from(tmp_path, meta)
    assert np.array_equal(loaded.predict(X), fitted.predict(X))
    assert np.array_equal(loaded.predict_interval(X, coverage=0.8), fitted.predict_interval(X, coverage=0.8))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(meta["member_files"])


def test_fit_rejects_bad_input(dataset: tuple[list, np.ndarray]) -> None:
    X, y = dataset
    with pytest.raises(SpecError, match="y must be"):
        StepGNNRegressor(**TINY).fit(X, -y)
    with pytest.raises(SpecError, match="StepGraph"):
        StepGNNRegressor(**TINY).fit([s.data for s in X], y)
    with pytest.raises(SpecError, match="n_members"):
        StepGNNRegressor(**{**TINY, "n_members": 1}).fit(X, y)
    with pytest.raises(SpecError, match="calibration_feature"):
        StepGNNRegressor(**{**TINY, "calibration_feature": "nope"}).fit(X, y)
    with pytest.raises(SpecError, match="num_threads"):
        StepGNNRegressor(**{**TINY, "num_threads": 4}).fit(X, y)
    with pytest.raises(SpecError, match="readout"):
        StepGNNRegressor(**{**TINY, "readout": "sum"}).fit(X, y)


@pytest.mark.parametrize("readout", ["time", "pool"])
def test_readouts_start_from_the_mean_ratio(readout: str, dataset: tuple[list, np.ndarray]) -> None:
    """With the output weights zeroed, every graph gets the starting log ratio exactly.

    For ``"time"`` this checks the readout's sum: node shares add up to 1, so equal node
    corrections ``c`` give a graph log ratio ``c``.
    """
    X, y = dataset
    model = StepGNNRegressor(**{**TINY, "readout": readout})
    net = model._new_network()
    net.init_output(0.7)
    with torch.no_grad():
        net.head[-1].weight.zero_()
        if net.node_head is not None:  # "time": the node head carries the start value, the graph term is zero
            net.node_head.weight.zero_()
            net.head[-1].bias.zero_()
        out = net(Batch.from_data_list([s.data for s in X[:4]]))
    assert out.shape == (4,)
    assert np.allclose(out.numpy(), 0.7, atol=1e-4)


def test_learns_the_synthetic_correction(dataset: tuple[list, np.ndarray]) -> None:
    """Trained a little longer, the GNN corrects most of the composition's error."""
    X, y = dataset
    model = StepGNNRegressor(**{**TINY, "hidden": 16, "epochs": 40}).fit(X, y)
    composed = np.array([s.composed_ms for s in X])
    err_model = np.mean(np.abs(model.predict(X) / y - 1))
    err_composed = np.mean(np.abs(composed / y - 1))
    assert err_model < 0.1 and err_composed > 0.3
