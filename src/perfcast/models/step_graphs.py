"""Step graphs: a config's workload graph as one small PyG graph, the input of the step GNN.

A config's :class:`~perfcast.features.workload.WorkloadGraph` is already a template
(one dense layer, one MoE layer, first/last-stage and once-per-step ops, each with its
multiplicity), so it becomes one small PyG graph of some 50-100 nodes whatever the
model depth. :func:`graph_to_data` turns it into a ``Data``:

* node features (``NODE_FEATURE_NAMES``): one-hot op kind, scope, phase, stream,
  process group and dtype; flags; log shapes, FLOPs and bytes; the log of the node's
  given time (ms), ``log(1 + LAUNCH_MS / time)`` (how far a launch overhead would
  stretch it: small kernels, which grow with tp, are where the composition errs most)
  and the log of its share of the step's op time; the log of how often it runs per
  microbatch and per step;
* ``edge_index``: the dependency edges plus their reverses, told apart by
  ``edge_type`` (:data:`~perfcast.models.gnn_layers.FORWARD_EDGE` /
  :data:`~perfcast.models.gnn_layers.REVERSE_EDGE`);
* ``node_weight``: the node's share of the step's op time (readout weights);
* ``u``: the caller's graph-level vector, shape ``(1, G)``.

The node times are an input, so a caller can pass learned op times; the graph-level
vector too (:func:`basic_graph_features` is a minimal layout-and-cluster one).
:class:`StepGraph` pairs a graph with its composed step time: one sample of
:class:`~perfcast.models.gnn.StepGNNRegressor`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from perfcast.data.schema import DType, OpType
from perfcast.errors import SpecError
from perfcast.features.roofline import op_time_ms
from perfcast.features.run_config import RunConfig
from perfcast.features.schedule import compose_step
from perfcast.features.workload import Group, Phase, Scope, WorkloadGraph, build_workload_graph
from perfcast.models.gnn_layers import FORWARD_EDGE, REVERSE_EDGE

GNN_FEATURES_VERSION = 2  # 2: cluster sizes by NVLink domain
"""Bumped whenever the node or graph features change meaning or order."""

OP_KINDS = tuple(o.value for o in OpType)
SCOPES = (Scope.LAYER, Scope.MOE_LAYER, Scope.FIRST_STAGE, Scope.LAST_STAGE, Scope.STAGE, Scope.STEP)
PHASES = (Phase.FORWARD, Phase.RECOMPUTE, Phase.BACKWARD, Phase.STEP)
STREAMS = ("compute", "comm")
GROUPS = ("", Group.TP, Group.CP, Group.EP, Group.PP, Group.DP, Group.EXPERT_DP, Group.EMBEDDING)
DTYPES = tuple(d.value for d in DType)
LOG_SHAPE_COLUMNS = (
    "batch",
    "m",
    "n",
    "k",
    "rows",
    "cols",
    "heads",
    "kv_heads",
    "seq_q",
    "seq_kv",
    "head_dim",
    "bytes",
    "n_ranks",
    "ranks_per_node",
    "flops",
    "mem_bytes",
)
FLAG_COLUMNS = ("scalar", "causal", "backward")
_ONE_HOT = (("op", OP_KINDS), ("scope", SCOPES), ("phase", PHASES), ("stream", STREAMS), ("group", GROUPS))
NODE_FEATURE_NAMES = (
    *(f"{col}={value or 'none'}" for col, values in _ONE_HOT for value in values),
    *(f"dtype={d}" for d in DTYPES),
    *FLAG_COLUMNS,
    "overlapped",
    *(f"log1p_{c}" for c in LOG_SHAPE_COLUMNS),
    "log_time_ms",
    "log1p_launch_over_time",
    "log_time_share",
    "log_count_per_microbatch",
    "log_count_per_step",
)
GRAPH_FEATURE_NAMES = (
    "log2_tp",
    "log2_pp",
    "log2_dp",
    "log2_cp",
    "log2_ep",
    "log2_micro_batch",
    "log2_num_microbatches",
    "log2_vpp",
    "log_peak_tflops",
    "log_mem_bw_gbps",
    "log_intra_node_bw_gbps",
    "log_inter_node_bw_gbps",
    "log2_num_gpus",
    "log2_nvlink_domain",
    "log2_num_domains",
)
_TIME_FLOOR_MS = 1e-6
LAUNCH_MS = 0.01
"""A typical kernel launch and framework overhead per op, ms: the scale of ``log1p_launch_over_time``."""
SHARE_FLOOR = 1e-6
"""Floor of a node's share of the step's op time before its log."""


@dataclass(frozen=True)
class StepGraph:
    """One sample of :class:`StepGNNRegressor`: a config's graph and its composed step time.

    Attributes:
        data: the PyG graph of :func:`graph_to_data`.
        composed_ms: the step time composed from the same node times, ms (> 0): the
            model predicts ``measured / composed_ms``.
    """

    data: Data
    composed_ms: float


def basic_graph_features(config: RunConfig) -> np.ndarray:
    """A minimal graph-level vector (``GRAPH_FEATURE_NAMES``): log layout and cluster figures."""
    p, c = config.parallel, config.cluster
    return np.array(
        [
            math.log2(p.tp),
            math.log2(p.pp),
            math.log2(p.dp),
            math.log2(p.cp),
            math.log2(p.ep),
            math.log2(p.micro_batch),
            math.log2(p.num_microbatches),
            math.log2(p.vpp),
            math.log(c.gpu.peak_tflops(p.dtype)),
            math.log(c.gpu.mem_bw_gbps),
            math.log(c.intra_node_bw_gbps),
            math.log(c.inter_node_bw_gbps),
            math.log2(c.num_gpus),
            math.log2(c.nvlink_domain),
            math.log2(c.num_domains),
        ],
        dtype=np.float64,
    )


def _one_hot(values: np.ndarray, vocab: tuple[str, ...], column: str) -> np.ndarray:
    index = {v: i for i, v in enumerate(vocab)}
    unknown = sorted({str(v) for v in values if v not in index})
    if unknown:
        raise SpecError(f"workload graph column {column} has values {unknown}; the GNN knows {list(vocab)}")
    out = np.zeros((len(values), len(vocab)))
    out[np.arange(len(values)), [index[v] for v in values]] = 1.0
    return out


def _executions(graph: WorkloadGraph) -> tuple[np.ndarray, np.ndarray]:
    """How often each node runs per microbatch on one stage, and per step."""
    nodes = graph.nodes
    mult = nodes["scope"].map(graph.scope_multiplicity()).to_numpy(dtype=float)
    per_mb = nodes["repeat"].to_numpy(dtype=float) * mult
    per_step = per_mb * np.where(nodes["scope"].to_numpy() == Scope.STEP, 1.0, graph.num_microbatches)
    return per_mb, per_step


def graph_to_data(graph: WorkloadGraph, op_ms: np.ndarray, graph_features: np.ndarray) -> Data:
    """The PyG graph of one config (see the module docstring).

    Args:
        graph: the config's workload graph.
        op_ms: each node's time, ms, aligned with ``graph.nodes`` (analytic or learned).
        graph_features: the config's graph-level vector, shape ``(G,)``.

    Raises:
        SpecError: misaligned or non-finite times or features, or a node value outside
            the GNN's vocabularies.
    """
    nodes = graph.nodes
    op_ms = np.asarray(op_ms, dtype=np.float64)
    if op_ms.shape != (len(nodes),) or not np.isfinite(op_ms).all() or (op_ms < 0).any():
        raise SpecError(f"op_ms must be {len(nodes)} finite times >= 0, got shape {op_ms.shape}")
    u = np.asarray(graph_features, dtype=np.float64)
    if u.ndim != 1 or not np.isfinite(u).all():
        raise SpecError(f"graph_features must be a finite 1-D vector, got shape {u.shape}")
    per_mb, per_step = _executions(graph)
    total_ms = float((op_ms * per_step).sum())
    if total_ms <= 0:
        raise SpecError("op_ms sum to zero over the graph: no time to share out")
    share = op_ms * per_step / total_ms
    parts = [_one_hot(nodes[col].to_numpy(), vocab, col) for col, vocab in _ONE_HOT]
    parts.append(_one_hot(nodes["dtype"].to_numpy(), DTYPES, "dtype"))
    parts.append(nodes.loc[:, list(FLAG_COLUMNS)].to_numpy(dtype=float))
    parts.append((nodes["overlap_with"].to_numpy() >= 0).astype(float)[:, None])
    shapes = nodes.loc[:, list(LOG_SHAPE_COLUMNS)].to_numpy(dtype=float)
    parts.append(np.log1p(np.clip(shapes, 0.0, None)))
    parts.append(
        np.column_stack(
            [
                np.log(np.maximum(op_ms, _TIME_FLOOR_MS)),
                np.log1p(LAUNCH_MS / np.maximum(op_ms, _TIME_FLOOR_MS)),
                np.log(np.maximum(share, SHARE_FLOOR)),
                np.log(np.maximum(per_mb, 1.0)),
                np.log(np.maximum(per_step, 1.0)),
            ]
        )
    )
    x = np.concatenate(parts, axis=1)
    edges = graph.edges.loc[:, ["src", "dst"]].to_numpy(dtype=np.int64).T
    edge_index = np.concatenate([edges, edges[::-1]], axis=1)
    edge_type = np.repeat([FORWARD_EDGE, REVERSE_EDGE], edges.shape[1])
    data = Data(
        x=torch.tensor(x, dtype=torch.float32),
        edge_index=torch.tensor(edge_index, dtype=torch.long),
        edge_type=torch.tensor(edge_type, dtype=torch.long),
        node_weight=torch.tensor(share, dtype=torch.float32),
        u=torch.tensor(u[None, :], dtype=torch.float32),
        num_nodes=len(nodes),
    )
    data.validate(raise_on_error=True)
    return data


def build_step_graph(
    config: RunConfig,
    *,
    op_ms: np.ndarray | None = None,
    graph_features: np.ndarray | None = None,
) -> StepGraph:
    """The sample of one config: its graph with node times and its composed step, ms.

    Args:
        config: the checked run config.
        op_ms: node times, ms, aligned with the config's graph nodes; default the analytic
            :func:`~perfcast.features.roofline.op_time_ms`.
        graph_features: graph-level vector; default :func:`basic_graph_features`.
    """
    graph = build_workload_graph(config.model, config.parallel, config.cluster)
    times = op_time_ms(graph.nodes, config.cluster) if op_ms is None else np.asarray(op_ms, dtype=float)
    u = basic_graph_features(config) if graph_features is None else graph_features
    composed = compose_step(graph, times).step_ms
    return StepGraph(data=graph_to_data(graph, times, u), composed_ms=float(composed))


def step_graphs(configs: Sequence[RunConfig], steps: Sequence[Any]) -> list[StepGraph]:
    """Samples of configs already composed by :class:`~perfcast.models.composer.StepComposer`.

    The node times are the composer's (learned op predictions), the base the composed
    step: the GNN learns what composing those op times misses.
    """
    if len(configs) != len(steps):
        raise SpecError(f"got {len(configs)} configs but {len(steps)} composed steps")
    return [
        StepGraph(data=graph_to_data(s.graph, s.node_ms, basic_graph_features(c)), composed_ms=float(s.step_ms))
        for c, s in zip(configs, steps, strict=True)
    ]
