"""The workload graph's container and names: :class:`WorkloadGraph`, its node columns, scopes and phases.

:mod:`perfcast.features.workload` builds the graph; this module holds what every reader
of a graph needs without the builder.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from perfcast.data.tables import OP_SHAPE_COLUMNS
from perfcast.features.ops import op_flops, op_memory_bytes


class Scope:
    """Where a graph node repeats (the ``scope`` column)."""

    LAYER = "layer"  # once per dense layer on the stage, per microbatch
    MOE_LAYER = "moe_layer"  # once per MoE layer on the stage, per microbatch
    FIRST_STAGE = "first_stage"  # on pipeline stage 0, per microbatch
    LAST_STAGE = "last_stage"  # on the last pipeline stage, per microbatch
    STAGE = "stage"  # on every stage, per microbatch (pipeline transfers)
    STEP = "step"  # once per training step


class Phase:
    """When a node runs (the ``phase`` column)."""

    FORWARD = "fwd"
    RECOMPUTE = "recompute"
    BACKWARD = "bwd"
    STEP = "step"


SHAPE_COLUMNS = OP_SHAPE_COLUMNS
NODE_COLUMNS = ("node", "name", "scope", "phase", "stream", "group", "overlap_with", "repeat", *SHAPE_COLUMNS)
_DERIVED = {"flops": op_flops, "mem_bytes": op_memory_bytes}
"""Node columns computed from the others: FLOPs and bytes moved to and from device memory."""


class WorkloadGraph:
    """The op graph of one training step (see :mod:`perfcast.features.workload`). Read-only.

    Attributes:
        nodes: one row per op, columns ``NODE_COLUMNS`` plus ``flops`` and ``mem_bytes``
            (bytes moved to and from device memory).
        edges: ``src``, ``dst`` node ids: ``dst`` starts after ``src`` ends.
        dense_layers_per_stage, moe_layers_per_stage: layers on the busiest stage (the
            pipeline rank holding the most layers).
        num_microbatches, pp, vpp: the pipeline schedule's parameters.
        stage_layers: ``(dense, moe)`` layers of each pipeline rank when ranks differ
            (:func:`layers_per_rank`); ``None`` when every rank holds the busiest stage's.

    ``nodes`` and ``edges`` may be given as frames, or (what :func:`build_workload_graph`
    does) as the ``NODE_COLUMNS`` (numpy arrays) and the ``(src, dst)`` pairs: the frames,
    ``flops`` and ``mem_bytes`` are then computed on first access, and :meth:`column` reads
    the arrays without building the frame.
    """

    def __init__(
        self,
        nodes: pd.DataFrame | Mapping[str, np.ndarray],
        edges: pd.DataFrame | Sequence[tuple[int, int]],
        dense_layers_per_stage: int,
        moe_layers_per_stage: int,
        num_microbatches: int,
        pp: int,
        vpp: int,
        stage_layers: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        if isinstance(nodes, pd.DataFrame):
            self._nodes: pd.DataFrame | None = nodes
            self._columns: dict[str, np.ndarray] = {}
            self.num_nodes = len(nodes)
        else:
            self._nodes, self._columns = None, dict(nodes)
            self.num_nodes = len(self._columns["node"])
        self._edges = edges
        self.dense_layers_per_stage = dense_layers_per_stage
        self.moe_layers_per_stage = moe_layers_per_stage
        self.num_microbatches = num_microbatches
        self.pp = pp
        self.vpp = vpp
        self.stage_layers = stage_layers

    @property
    def nodes(self) -> pd.DataFrame:
        """One row per op (see the class docstring)."""
        if self._nodes is None:
            self._nodes = pd.DataFrame({name: self.column(name) for name in (*NODE_COLUMNS, *_DERIVED)})
        return self._nodes

    @property
    def edges(self) -> pd.DataFrame:
        """``src``, ``dst`` node ids."""
        if not isinstance(self._edges, pd.DataFrame):
            self._edges = pd.DataFrame(self._edges, columns=["src", "dst"], dtype="int64")
        return self._edges

    def column(self, name: str) -> np.ndarray:
        """Node column ``name`` as a numpy array (strings as objects), cached: read it, do not modify it."""
        if name not in self._columns:
            if self._nodes is None and name in _DERIVED:
                self._columns[name] = _DERIVED[name](self._columns)
            else:
                self._columns[name] = self.nodes[name].to_numpy()
        return self._columns[name]

    def scope_multiplicity(self) -> dict[str, int]:
        """Executions of each scope per microbatch on one stage (step scope: per step)."""
        return {
            Scope.LAYER: self.dense_layers_per_stage,
            Scope.MOE_LAYER: self.moe_layers_per_stage,
            Scope.FIRST_STAGE: 1,
            Scope.LAST_STAGE: 1,
            Scope.STAGE: 1,
            Scope.STEP: 1,
        }
