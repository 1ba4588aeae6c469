"""Step-time GNN: learns what the schedule composition misses, from the workload graph.

Its samples are :class:`~perfcast.models.step_graphs.StepGraph`: a config's workload
graph as a small PyG graph (node and graph features in :mod:`perfcast.models.step_graphs`,
whose names this module re-exports) with the step time composed from the same node times.

:class:`StepGNNRegressor` predicts ``log(measured / composed)`` with an ensemble of
small GNNs (different seeds) and turns the ensemble spread into an interval by
split-conformal scaling on a held-out group of the training runs.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted
from torch import Tensor, nn
from torch_geometric.data import Batch, Data
from torch_geometric.nn import global_add_pool, global_max_pool, global_mean_pool

from perfcast.errors import BundleError, SpecError
from perfcast.models.gnn_layers import DirectedGraphConv
from perfcast.models.intervals import check_coverage, conformal_quantile
from perfcast.models.step_graphs import (
    DTYPES,
    FLAG_COLUMNS,
    GNN_FEATURES_VERSION,
    GRAPH_FEATURE_NAMES,
    GROUPS,
    LAUNCH_MS,
    LOG_SHAPE_COLUMNS,
    NODE_FEATURE_NAMES,
    OP_KINDS,
    PHASES,
    SCOPES,
    SHARE_FLOOR,
    STREAMS,
    StepGraph,
    basic_graph_features,
    build_step_graph,
    graph_to_data,
    step_graphs,
)

__all__ = [
    "DTYPES",
    "FLAG_COLUMNS",
    "GNN_FEATURES_VERSION",
    "GRAPH_FEATURE_NAMES",
    "GROUPS",
    "LAUNCH_MS",
    "LOG_SHAPE_COLUMNS",
    "NODE_FEATURE_NAMES",
    "OP_KINDS",
    "PHASES",
    "READOUTS",
    "SCOPES",
    "STREAMS",
    "StepGNN",
    "StepGNNRegressor",
    "StepGraph",
    "basic_graph_features",
    "build_step_graph",
    "graph_to_data",
    "step_graphs",
]

logger = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- network


READOUTS = ("time", "pool")


class StepGNN(nn.Module):
    r"""Node encoder, ``num_layers`` :class:`DirectedGraphConv`, a readout to one log ratio per graph.

    Both readouts end in an MLP over the pooled node states (mean, time-share-weighted
    sum and max) and the graph-level vector ``u``, giving :math:`g(\mathbf{u}, \mathbf{h})`.

    * ``"pool"``: the log ratio is :math:`g`.
    * ``"time"``: each node also gets a log time correction :math:`c_i` (a linear map of
      its final state), and the log ratio is
      :math:`\log \sum_i s_i e^{c_i} + g`, with :math:`s_i` the node's share of the
      step's op time (``node_weight``): the op times are corrected node by node and
      summed, so a graph whose time shifts to ops with large corrections (small
      kernels, wide collectives) gets a larger ratio without learning that from ``u``.

    Shapes:
        - **input:** a PyG batch with ``x`` :math:`(N, F)`, ``edge_index`` :math:`(2, E)`,
          ``edge_type`` :math:`(E)`, ``node_weight`` :math:`(N)`, ``u`` :math:`(B, G)`
        - **output:** :math:`(B)`, log ratios
    """

    def __init__(self, node_dim: int, graph_dim: int, hidden: int, num_layers: int, readout: str = "time") -> None:
        super().__init__()
        if readout not in READOUTS:
            raise SpecError(f"readout={readout!r}; allowed: {', '.join(READOUTS)}")
        self.encode = nn.Sequential(nn.Linear(node_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        self.convs = nn.ModuleList(DirectedGraphConv(hidden) for _ in range(num_layers))
        self.node_head = nn.Linear(hidden, 1) if readout == "time" else None
        self.head = nn.Sequential(nn.Linear(3 * hidden + graph_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def init_output(self, log_ratio: float) -> None:
        """Start from a constant prediction ``log_ratio`` (the training mean)."""
        last = self.node_head if self.node_head is not None else self.head[-1]
        nn.init.constant_(last.bias, log_ratio)

    def forward(self, batch: Batch) -> Tensor:
        h = self.encode(batch.x)
        for conv in self.convs:
            h = conv(h, batch.edge_index, batch.edge_type)
        pooled = torch.cat(
            [
                global_mean_pool(h, batch.batch),
                global_add_pool(h * batch.node_weight[:, None], batch.batch),
                global_max_pool(h, batch.batch),
                batch.u,
            ],
            dim=1,
        )
        out = self.head(pooled).squeeze(-1)
        if self.node_head is not None:
            z = torch.log(batch.node_weight.clamp_min(SHARE_FLOOR)) + self.node_head(h).squeeze(-1)
            top = global_max_pool(z[:, None], batch.batch).squeeze(-1)
            total = global_add_pool(torch.exp(z - top[batch.batch])[:, None], batch.batch).squeeze(-1)
            out = out + top + torch.log(total)
        return out


def _to_ms(composed_ms: np.ndarray, log_ratio: np.ndarray) -> np.ndarray:
    """Step time, ms, from the composed step and a predicted ``log(measured / composed)``: the one inverse."""
    return composed_ms * np.exp(log_ratio)


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run with ``n`` torch threads, restoring the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ----------------------------------------------------------------------------- estimator


class StepGNNRegressor(RegressorMixin, BaseEstimator):
    """Training-step time, ms: the composed step times a GNN-predicted correction.

    The target is ``log(measured_ms / composed_ms)``. Each of ``n_members`` networks
    (seeds ``random_state + i``) is trained on it with AdamW, a one-cycle learning rate
    and a squared loss scaled by the target's spread; the prediction is the ensemble
    mean. The interval is ``mean ± q * (s + s0)`` in log space, ``s`` the ensemble
    standard deviation, ``s0`` the median ``s`` on the calibration fold and ``q`` the
    split-conformal quantile of the normalised absolute errors ``|t - mean| / (s + s0)``
    of an ensemble trained without that fold.

    The calibration fold is a group: the samples with the largest value of the graph
    feature ``calibration_feature`` (by default the largest cluster size seen), so the
    interval is calibrated on an extrapolation like the one it will be used for; with
    only one value, a seeded random ``calibration_fraction`` of the samples. The
    returned ensemble is refit on all samples.

    Hyperparameters (stored only; checked in :meth:`fit`):
        hidden, num_layers: width and number of message-passing layers.
        readout: ``"time"`` (node-wise time corrections summed, plus a graph term) or
            ``"pool"`` (a graph term only); see :class:`StepGNN`.
        n_members: ensemble size (>= 2).
        epochs, batch_size, learning_rate, weight_decay: Adam training.
        calibration_feature: name in ``graph_feature_names`` defining the held-out group.
        calibration_fraction: random fold size when the group split is impossible.
        graph_feature_names: names of the graph-level vector's entries (its length is
            checked against the samples).
        random_state, num_threads: seed, torch threads (1 or 2; 1 is faster for these small
            graphs on a busy machine, where a second thread mostly waits).

    Fitted attributes:
        members_: the trained :class:`StepGNN` networks.
        x_mean_, x_std_, u_mean_, u_std_: node and graph feature scalers.
        scale_floor_: ``s0``; conformal_scores_: sorted normalised calibration errors.
        calibration_split_: ``"group"`` or ``"random"``; n_features_in_: node features.
    """

    inputs = "graphs"
    """What ``predict`` takes: :class:`StepGraph` samples (see :func:`step_graphs`)."""

    def __init__(
        self,
        *,
        hidden: int = 32,
        num_layers: int = 2,
        readout: str = "pool",
        n_members: int = 5,
        epochs: int = 40,
        batch_size: int = 32,
        learning_rate: float = 3e-3,
        weight_decay: float = 1e-4,
        calibration_feature: str = "log2_num_gpus",
        calibration_fraction: float = 0.2,
        graph_feature_names: Sequence[str] = GRAPH_FEATURE_NAMES,
        random_state: int = 0,
        num_threads: int = 1,
    ) -> None:
        self.hidden = hidden
        self.num_layers = num_layers
        self.readout = readout
        self.n_members = n_members
        self.epochs = epochs
        self.batch_size = batch_size
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.calibration_feature = calibration_feature
        self.calibration_fraction = calibration_fraction
        self.graph_feature_names = graph_feature_names
        self.random_state = random_state
        self.num_threads = num_threads

    # ------------------------------------------------------------------------ checks

    def _check_params(self) -> None:
        ints = {"hidden": 1, "num_layers": 0, "n_members": 2, "epochs": 1, "batch_size": 1}
        for name, low in ints.items():
            value = getattr(self, name)
            if not isinstance(value, int) or value < low:
                raise SpecError(f"{name}={value!r} must be an integer >= {low}")
        if self.num_threads not in (1, 2):
            raise SpecError(f"num_threads={self.num_threads!r} must be 1 or 2")
        if not self.learning_rate > 0 or not self.weight_decay >= 0:
            raise SpecError(f"learning_rate={self.learning_rate} must be > 0 and weight_decay={self.weight_decay} >= 0")
        if self.readout not in READOUTS:
            raise SpecError(f"readout={self.readout!r}; allowed: {', '.join(READOUTS)}")
        if not 0 < self.calibration_fraction < 1:
            raise SpecError(f"calibration_fraction={self.calibration_fraction} must be in (0, 1)")
        if self.calibration_feature not in tuple(self.graph_feature_names):
            raise SpecError(
                f"calibration_feature={self.calibration_feature!r} is not in graph_feature_names "
                f"{list(self.graph_feature_names)}"
            )

    def _check_samples(self, X: Sequence[StepGraph]) -> list[StepGraph]:
        samples = list(X)
        if not samples:
            raise SpecError("X is empty: need at least one StepGraph")
        bad = [i for i, s in enumerate(samples) if not isinstance(s, StepGraph)]
        if bad:
            raise SpecError(f"X must hold StepGraph samples (see build_step_graph); rows {bad[:5]} do not")
        n_graph = len(tuple(self.graph_feature_names))
        for i, s in enumerate(samples):
            if not (math.isfinite(s.composed_ms) and s.composed_ms > 0):
                raise SpecError(f"sample {i}: composed_ms={s.composed_ms!r} must be finite and > 0")
            if s.data.x.shape[1] != len(NODE_FEATURE_NAMES) or s.data.u.shape != (1, n_graph):
                raise SpecError(
                    f"sample {i}: node features {tuple(s.data.x.shape)} / graph features {tuple(s.data.u.shape)}; "
                    f"expected (*, {len(NODE_FEATURE_NAMES)}) / (1, {n_graph})"
                )
        return samples

    # ------------------------------------------------------------------------ fit

    def fit(self, X: Sequence[StepGraph], y: Any, *, sample_weight: Any = None) -> StepGNNRegressor:
        """Fit the ensemble and its conformal interval.

        Args:
            X: samples from :func:`build_step_graph` (or :func:`graph_to_data` plus the
                composed time).
            y: measured step times, ms, > 0.
            sample_weight: optional per-sample weights (> 0) of the loss.

        Raises:
            SpecError: bad hyperparameters, samples, times or weights.
        """
        self._check_params()
        samples = self._check_samples(X)
        measured = np.asarray(y, dtype=np.float64)
        if measured.shape != (len(samples),) or not np.isfinite(measured).all() or (measured <= 0).any():
            raise SpecError(f"y must be {len(samples)} finite measured times > 0 (ms), got shape {measured.shape}")
        w = np.ones(len(samples)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        if w.shape != (len(samples),) or not np.isfinite(w).all() or (w <= 0).any():
            raise SpecError(f"sample_weight must be {len(samples)} finite weights > 0")
        t = np.log(measured / np.array([s.composed_ms for s in samples]))

        x_all = torch.cat([s.data.x for s in samples]).double()
        u_all = torch.cat([s.data.u for s in samples]).double()
        self.x_mean_ = x_all.mean(0).numpy()
        self.x_std_ = np.where(x_all.std(0).numpy() > 1e-8, x_all.std(0).numpy(), 1.0)
        self.u_mean_ = u_all.mean(0).numpy()
        self.u_std_ = np.where(u_all.std(0).numpy() > 1e-8, u_all.std(0).numpy(), 1.0)
        self.n_features_in_ = len(NODE_FEATURE_NAMES)

        calib, self.calibration_split_ = self._calibration_fold(u_all.numpy())
        with _torch_threads(self.num_threads):
            data = self._scaled(samples)
            fold = [data[i] for i in np.flatnonzero(~calib)]
            held = [data[i] for i in np.flatnonzero(calib)]
            inner = self._train_ensemble(fold, t[~calib], w[~calib])
            mean, spread = self._ensemble_predict(inner, held)
            self.scale_floor_ = float(max(np.median(spread), 1e-6))
            scores = np.abs(t[calib] - mean) / (spread + self.scale_floor_)
            self.conformal_scores_ = np.sort(scores)
            self.members_ = self._train_ensemble(data, t, w)
        return self

    def _calibration_fold(self, u: np.ndarray) -> tuple[np.ndarray, str]:
        """Boolean mask of the calibration samples, and how it was chosen."""
        column = u[:, tuple(self.graph_feature_names).index(self.calibration_feature)]
        values = np.unique(column)
        if len(values) > 1:
            return column == values[-1], "group"
        rng = np.random.default_rng(self.random_state)
        n_calib = max(1, round(self.calibration_fraction * len(u)))
        mask = np.zeros(len(u), dtype=bool)
        mask[rng.choice(len(u), size=n_calib, replace=False)] = True
        if mask.all():
            raise SpecError("need at least 2 samples to hold out a calibration fold")
        logger.info("one value of %s in the training set: random calibration fold", self.calibration_feature)
        return mask, "random"

    def _scaled(self, samples: Sequence[StepGraph]) -> list[Data]:
        x_mean, x_std = torch.tensor(self.x_mean_, dtype=torch.float32), torch.tensor(self.x_std_, dtype=torch.float32)
        u_mean, u_std = torch.tensor(self.u_mean_, dtype=torch.float32), torch.tensor(self.u_std_, dtype=torch.float32)
        out = []
        for s in samples:
            d = s.data.clone()
            d.x = (d.x - x_mean) / x_std
            d.u = (d.u - u_mean) / u_std
            out.append(d)
        return out

    def _train_ensemble(self, data: list[Data], t: np.ndarray, w: np.ndarray) -> list[StepGNN]:
        """Train the members on log ratios ``t``: each starts at their mean, the loss is scaled by their spread."""
        start = float(np.average(t, weights=w))
        scale = float(max(np.sqrt(np.average((t - start) ** 2, weights=w)), 1e-3))
        target = torch.tensor((t - start) / scale, dtype=torch.float32)
        weight = torch.tensor(w / w.mean(), dtype=torch.float32)
        return [
            self._train_member(data, target, weight, start, scale, self.random_state + i) for i in range(self.n_members)
        ]

    def _new_network(self) -> StepGNN:
        n_graph = len(tuple(self.graph_feature_names))
        return StepGNN(len(NODE_FEATURE_NAMES), n_graph, self.hidden, self.num_layers, self.readout)

    def _train_member(
        self, data: list[Data], target: Tensor, weight: Tensor, start: float, scale: float, seed: int
    ) -> StepGNN:
        """One network; ``target`` is the standardised log ratio ``(t - start) / scale``."""
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        net = self._new_network()
        net.init_output(start)
        opt = torch.optim.AdamW(net.parameters(), lr=self.learning_rate, weight_decay=self.weight_decay)
        n = len(data)
        n_batches = max(1, math.ceil(n / self.batch_size))
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.learning_rate, total_steps=self.epochs * n_batches)
        net.train()
        for _ in range(self.epochs):
            order = rng.permutation(n)
            for chunk in np.array_split(order, n_batches):
                batch = Batch.from_data_list([data[i] for i in chunk])
                idx = torch.as_tensor(chunk)
                loss = (weight[idx] * ((net(batch) - start) / scale - target[idx]) ** 2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
        net.eval()
        return net

    def _ensemble_predict(self, members: Sequence[StepGNN], data: list[Data]) -> tuple[np.ndarray, np.ndarray]:
        """Ensemble mean and standard deviation of the log ratio."""
        batch = Batch.from_data_list(data)
        with torch.no_grad():
            outs = np.stack([m(batch).double().numpy() for m in members])
        return outs.mean(0), outs.std(0)

    # ------------------------------------------------------------------------ predict

    def _predict_log(self, X: Sequence[StepGraph]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        check_is_fitted(self, "members_")
        samples = self._check_samples(X)
        with _torch_threads(self.num_threads):
            mean, spread = self._ensemble_predict(self.members_, self._scaled(samples))
        composed = np.array([s.composed_ms for s in samples])
        return composed, mean, spread

    def predict(self, X: Sequence[StepGraph]) -> np.ndarray:
        """Predicted step times, ms, shape ``(n,)``."""
        composed, mean, _ = self._predict_log(X)
        return _to_ms(composed, mean)

    def predict_interval(self, X: Sequence[StepGraph], *, coverage: float = 0.9) -> np.ndarray:
        """Lower and upper step times, ms, shape ``(n, 2)``, at ``coverage`` (0 < coverage < 1).

        With ``n`` calibration errors the conformal level is ``ceil((n + 1) * coverage) / n``,
        capped at the largest error when that exceeds 1.
        """
        check_coverage(coverage)
        composed, mean, spread = self._predict_log(X)
        q = conformal_quantile(self.conformal_scores_, coverage)
        half = q * (spread + self.scale_floor_)
        return np.column_stack([_to_ms(composed, mean - half), _to_ms(composed, mean + half)])

    # ------------------------------------------------------------------------ persistence

    def _save_to(self, directory: str | Path) -> dict[str, Any]:
        """Write one ``gnn_member_<i>.pt`` state_dict per member; return the JSON-able rest."""
        check_is_fitted(self, "members_")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files = []
        for i, member in enumerate(self.members_):
            name = f"gnn_member_{i}.pt"
            torch.save(member.state_dict(), directory / name)
            files.append(name)
        params = self.get_params()
        params["graph_feature_names"] = list(params["graph_feature_names"])
        return {
            "params": params,
            "features_version": GNN_FEATURES_VERSION,
            "node_feature_names": list(NODE_FEATURE_NAMES),
            "member_files": files,
            "x_mean": self.x_mean_.tolist(),
            "x_std": self.x_std_.tolist(),
            "u_mean": self.u_mean_.tolist(),
            "u_std": self.u_std_.tolist(),
            "scale_floor": self.scale_floor_,
            "conformal_scores": self.conformal_scores_.tolist(),
            "calibration_split": self.calibration_split_,
        }

    @classmethod
    def _load_from(cls, directory: str | Path, meta: dict[str, Any]) -> StepGNNRegressor:
        """Rebuild a fitted model from :meth:`_save_to`'s files and dict.

        Raises:
            BundleError: missing files or keys, or features other than this perfcast's.
        """
        directory = Path(directory)
        try:
            if meta["features_version"] != GNN_FEATURES_VERSION or meta["node_feature_names"] != list(
                NODE_FEATURE_NAMES
            ):
                raise BundleError(
                    f"GNN features version {meta['features_version']} do not match this perfcast's "
                    f"{GNN_FEATURES_VERSION}: retrain the model"
                )
            params = dict(meta["params"])
            params["graph_feature_names"] = tuple(params["graph_feature_names"])
            model = cls(**params)
            model.x_mean_ = np.asarray(meta["x_mean"], dtype=np.float64)
            model.x_std_ = np.asarray(meta["x_std"], dtype=np.float64)
            model.u_mean_ = np.asarray(meta["u_mean"], dtype=np.float64)
            model.u_std_ = np.asarray(meta["u_std"], dtype=np.float64)
            model.scale_floor_ = float(meta["scale_floor"])
            model.conformal_scores_ = np.asarray(meta["conformal_scores"], dtype=np.float64)
            model.calibration_split_ = str(meta["calibration_split"])
            files = list(meta["member_files"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"GNN model metadata is incomplete or invalid: {exc!r}") from None
        members = []
        for name in files:
            path = directory / name
            if not path.is_file():
                raise BundleError(f"GNN member file {path} is missing")
            net = model._new_network()
            net.load_state_dict(torch.load(path, weights_only=True))
            net.eval()
            members.append(net)
        model.members_ = members
        model.n_features_in_ = len(NODE_FEATURE_NAMES)
        return model
