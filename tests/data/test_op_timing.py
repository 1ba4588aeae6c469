"""record_timing: each op record's timing method, from its cell, its source, or the default."""

from __future__ import annotations

import pandas as pd
import pytest

from perfcast.data.op_timing import SOURCE_TIMING, record_timing
from perfcast.data.schema import QUERY_TIMING, OpTiming
from perfcast.errors import SpecError


def test_cell_then_source_then_default():
    records = pd.DataFrame(
        {
            "source": ["neusight:v.csv", "vidur:a100/mlp.csv", "deepbench:x.xlsx", "mine", None, "vidur:x"],
            "timing": [None, None, None, None, None, "CUDA_events "],
        }
    )
    got = record_timing(records, QUERY_TIMING)
    assert got.tolist() == ["cuda_events", "gpu_kernels", "loop_mean", "gpu_kernels", "gpu_kernels", "cuda_events"]


def test_no_columns_take_the_default():
    assert record_timing(pd.DataFrame({"op": ["add", "mul"]}), OpTiming.CUDA_EVENTS).tolist() == ["cuda_events"] * 2
    assert record_timing(pd.DataFrame({"op": []}), OpTiming.CUDA_EVENTS).tolist() == []


def test_perfcast_profiles_are_cuda_events():
    # data/h200-sxm-141gb was written before the column: its card says CUDA events around each call
    assert SOURCE_TIMING["perfcast-profiler"] is OpTiming.CUDA_EVENTS
    assert record_timing(pd.DataFrame({"source": ["perfcast-profiler"]}), QUERY_TIMING).tolist() == ["cuda_events"]


def test_unknown_timing_names_the_value_and_the_allowed_ones():
    with pytest.raises(SpecError, match=r"timing='stopwatch' is not a known timing; allowed: gpu_kernels, cuda_events"):
        record_timing(pd.DataFrame({"timing": ["stopwatch"]}), QUERY_TIMING)


def test_which_timings_include_the_launch():
    assert {t.value for t in OpTiming if t.includes_launch} == {"cuda_events", "cpu_op"}
