"""Message-passing layers of the step GNN (:mod:`perfcast.models.gnn`).

The workload graph is a DAG of ops (an edge ``j -> i`` means ``i`` starts after ``j``
ends). Information about a node's predecessors and its successors both matter (a
collective's cost depends on the GEMM that produced its tensor and on the one waiting
for it), so the layer aggregates the two directions with separate weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing

FORWARD_EDGE = 0
"""``edge_type`` of an edge along a dependency (``src`` ends before ``dst`` starts)."""
REVERSE_EDGE = 1
"""``edge_type`` of the reversed copy of a dependency edge."""


class DirectedGraphConv(MessagePassing):
    r"""Residual graph convolution with separate weights for the two edge directions.

    .. math::
        \mathbf{m}_i^{(r)} = \frac{1}{|\mathcal{N}_r(i)|} \sum_{j \in \mathcal{N}_r(i)}
            \mathbf{W}_r \mathbf{x}_j, \qquad r \in \{\text{fwd}, \text{rev}\}

        \mathbf{x}_i' = \mathbf{x}_i + \mathrm{ReLU}\Big(\mathrm{LayerNorm}\big(
            \mathbf{W}_0 \mathbf{x}_i + \mathbf{m}_i^{(\text{fwd})} + \mathbf{m}_i^{(\text{rev})}
            + \mathbf{b}\big)\Big)

    where :math:`\mathcal{N}_r(i)` are the sources of the edges of type ``r`` that end in
    ``i`` (mean over an empty set is zero): with ``fwd`` edges a node hears from its
    predecessors, with ``rev`` edges from its successors.

    Args:
        channels: width of the node states (input and output, for the residual).

    Shapes:
        - **input:** node states :math:`(|\mathcal{V}|, C)`, edge indices
          :math:`(2, |\mathcal{E}|)`, edge types :math:`(|\mathcal{E}|)` (int64, values
          ``FORWARD_EDGE`` / ``REVERSE_EDGE``)
        - **output:** node states :math:`(|\mathcal{V}|, C)`
    """

    def __init__(self, channels: int) -> None:
        super().__init__(aggr="mean")
        self.channels = channels
        self.lin_self = nn.Linear(channels, channels)
        self.lin_fwd = nn.Linear(channels, channels, bias=False)
        self.lin_rev = nn.Linear(channels, channels, bias=False)
        self.norm = nn.LayerNorm(channels)

    def forward(self, x: Tensor, edge_index: Tensor, edge_type: Tensor) -> Tensor:
        fwd = edge_index[:, edge_type == FORWARD_EDGE]
        rev = edge_index[:, edge_type == REVERSE_EDGE]
        out = self.lin_self(x)
        out = out + self.propagate(fwd, x=self.lin_fwd(x))
        out = out + self.propagate(rev, x=self.lin_rev(x))
        return x + torch.relu(self.norm(out))

    def message(self, x_j: Tensor) -> Tensor:
        return x_j

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.channels})"
