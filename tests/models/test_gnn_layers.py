"""Tests of perfcast.models.gnn_layers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch_geometric")

from perfcast.models.gnn_layers import FORWARD_EDGE, REVERSE_EDGE, DirectedGraphConv  # noqa: E402


def _chain(n: int) -> tuple:
    src = torch.arange(n - 1)
    fwd = torch.stack([src, src + 1])
    edge_index = torch.cat([fwd, fwd.flip(0)], dim=1)
    edge_type = torch.cat([torch.full((n - 1,), FORWARD_EDGE), torch.full((n - 1,), REVERSE_EDGE)])
    return edge_index, edge_type


def test_shapes_and_gradients() -> None:
    torch.manual_seed(0)
    conv = DirectedGraphConv(8)
    x = torch.randn(5, 8, requires_grad=True)
    edge_index, edge_type = _chain(5)
    out = conv(x, edge_index, edge_type)
    assert out.shape == (5, 8)
    out.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert conv.lin_fwd.weight.grad is not None and conv.lin_rev.weight.grad is not None


def test_directions_have_their_own_weights() -> None:
    torch.manual_seed(0)
    conv = DirectedGraphConv(4)
    x = torch.randn(3, 4)
    edge_index, edge_type = _chain(3)
    swapped = conv(x, edge_index, 1 - edge_type)
    assert not torch.allclose(conv(x, edge_index, edge_type), swapped)


def test_isolated_node_sees_only_itself() -> None:
    torch.manual_seed(0)
    conv = DirectedGraphConv(4)
    x = torch.randn(3, 4)
    edge_index, edge_type = _chain(2)  # node 2 has no edges
    out = conv(x, edge_index, edge_type)
    alone = x[2] + torch.relu(conv.norm(conv.lin_self(x[2])))
    assert torch.allclose(out[2], alone, atol=1e-6)
