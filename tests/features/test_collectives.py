"""Tests of the alpha-beta collective times (ring inside a node, hierarchical across nodes)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfcast.features.collectives import collective_time_s

BW_IN, BW_OUT = 450.0, 50.0  # GB/s per GPU and direction
A_IN, A_OUT = 2.0, 5.0  # us per ring step
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv")


def _t(kind, nbytes, n, rpn) -> float:
    out = collective_time_s(
        np.array([kind]),
        np.array([nbytes], dtype=float),
        np.array([n]),
        np.array([rpn]),
        intra_bw_gbps=BW_IN,
        inter_bw_gbps=BW_OUT,
        intra_latency_us=A_IN,
        inter_latency_us=A_OUT,
    )
    return float(out[0])


@pytest.mark.parametrize("n", [2, 4, 8])
def test_all_reduce_inside_one_node_is_a_ring(n):
    b = 256e6
    latency = 2 * (n - 1) * A_IN * 1e-6  # NCCL's tree is a chain inside a node: no step saved
    expected = 2 * (n - 1) / n * b / (BW_IN * 1e9) + latency
    assert _t("allreduce", b, n, n) == pytest.approx(expected, rel=1e-12)


def test_small_all_reduce_latency_grows_with_ranks_in_a_node():
    assert _t("allreduce", 1.0, 8, 8) - _t("allreduce", 1.0, 2, 2) == pytest.approx(2 * 6 * A_IN * 1e-6, rel=1e-6)


@pytest.mark.parametrize(("n", "rpn"), [(8, 8), (16, 1), (4, 2)])
def test_all_gather_and_reduce_scatter_are_half_an_all_reduce_where_its_ring_is_its_fastest(n, rpn):
    """Inside one node, with one node of few ranks beside another, or one rank per node (PAT)."""
    ar = _t("allreduce", 1e8, n, rpn)
    assert _t("allgather", 1e8, n, rpn) == pytest.approx(ar / 2, rel=1e-12)
    assert _t("reducescatter", 1e8, n, rpn) == pytest.approx(ar / 2, rel=1e-12)


@pytest.mark.parametrize("kind", ["allgather", "reducescatter"])
def test_gathers_over_many_nodes_pay_a_ring_step_per_node(kind):
    n, r = 8192, 8
    nodes = n / r
    ring_lat = (r - 1) * A_IN + (nodes - 1) * A_OUT  # NCCL has no tree for gathers
    assert _t(kind, 1.0, n, r) == pytest.approx(ring_lat * 1e-6, rel=1e-3)
    assert _t(kind, 1.0, n, r) > 10 * _t("allreduce", 1.0, n, r)  # the all-reduce's tree crosses in log2 steps
    pat = (math.ceil(math.log2(1024)) * A_OUT) * 1e-6  # one rank per node: PAT's log2 steps
    assert _t(kind, 1.0, 1024, 1) == pytest.approx(pat, rel=1e-3)


def test_multi_node_all_reduce_is_hierarchical():
    b, n, r = 1e9, 64, 8
    nodes = n / r
    bandwidth = 2 * ((r - 1) / r * b / (BW_IN * 1e9) + (nodes - 1) / nodes * (b / r) / (BW_OUT * 1e9))
    ring_lat = 2 * ((r - 1) * A_IN + (nodes - 1) * A_OUT)
    tree_lat = 2 * ((r - 1) * A_IN + math.ceil(math.log2(nodes)) * A_OUT)  # chain in the node, tree across nodes
    expected = bandwidth + min(ring_lat, tree_lat) * 1e-6
    assert _t("allreduce", b, n, r) == pytest.approx(expected, rel=1e-12)


def test_all_to_all_formula():
    b, n, r = 64e6, 16, 8
    expected = (n - r) / n * b / (BW_OUT * 1e9) + (r - 1) / n * b / (BW_IN * 1e9) + (n - 1) * A_OUT * 1e-6
    assert _t("alltoall", b, n, r) == pytest.approx(expected, rel=1e-12)


def test_send_recv_uses_the_link_between_the_two_ranks():
    b = 32e6
    assert _t("sendrecv", b, 2, 2) == pytest.approx(b / (BW_IN * 1e9) + A_IN * 1e-6, rel=1e-12)
    assert _t("sendrecv", b, 2, 1) == pytest.approx(b / (BW_OUT * 1e9) + A_OUT * 1e-6, rel=1e-12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [0, 1])
def test_a_single_rank_takes_no_time(kind, n):
    assert _t(kind, 1e9, n, 1) == 0.0


@pytest.mark.parametrize("kind", KINDS)
def test_inter_node_is_slower_than_intra_node(kind):
    n = 2 if kind == "sendrecv" else 8
    assert _t(kind, 1e8, n, 1) > _t(kind, 1e8, n, n)


def test_ranks_per_node_is_clipped_to_the_group():
    assert _t("allreduce", 1e8, 4, 8) == _t("allreduce", 1e8, 4, 4)
    assert _t("allreduce", 1e8, 4, 0) == _t("allreduce", 1e8, 4, 1)


def test_vectorised_over_rows_and_nan_for_non_collectives():
    out = collective_time_s(
        np.array(["allreduce", "allgather", "matmul"]),
        np.array([1e6, 1e6, 1e6]),
        np.array([8, 8, 8]),
        np.array([8, 8, 8]),
        intra_bw_gbps=BW_IN,
        inter_bw_gbps=BW_OUT,
        intra_latency_us=A_IN,
        inter_latency_us=A_OUT,
    )
    assert out.shape == (3,)
    assert out[0] == pytest.approx(2 * out[1])
    assert np.isnan(out[2])


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    n=st.integers(2, 256),
    rpn=st.integers(1, 8),
    small=st.floats(0, 1e10),
    extra=st.floats(0, 1e10),
)
def test_time_is_monotone_in_bytes(kind, n, rpn, small, extra):
    if kind == "sendrecv":
        n = 2
    low, high = _t(kind, small, n, rpn), _t(kind, small + extra, n, rpn)
    assert high >= low > 0
    if extra > 1e-3 * small + 1e3:
        assert high > low
