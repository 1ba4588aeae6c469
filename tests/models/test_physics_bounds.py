"""Physics bounds of predicted steps: MFU ceiling, compute-at-peak floor, faster hardware not slower.

The sweep covers every catalog GPU x a few presets (dense and fine-grained MoE) and 8-GPU
layouts, for the analytic predictor and the shipped default predictor (one batch each, so it
stays fast).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from perfcast.errors import SpecError
from perfcast.features.hardware import list_hardware
from perfcast.features.model import TransformerSpec
from perfcast.features.run_config import RunConfig, parse_run_row
from perfcast.models.physics_bounds import (
    MFUCeiling,
    apply_floor,
    dtype_class,
    gpu_generation,
    measured_mfu,
    model_flops,
    peak_flops,
)
from perfcast.models.step_predictor import StepPredictor
from perfcast.serve.predictors import load_step_predictor

PRESETS = ("gpt3-350m", "llama3-8b", "llama2-13b", "qwen3-30b-a3b")
LAYOUTS = ({"tp": 1, "pp": 1, "dp": 8}, {"tp": 8, "pp": 1, "dp": 1}, {"tp": 2, "pp": 2, "dp": 2})
MOE_LAYOUTS = ({"tp": 1, "pp": 1, "dp": 8, "ep": 8}, {"tp": 1, "pp": 1, "dp": 8, "ep": 8, "ep_comm_overlap": True})
"""Expert-parallel layouts, swept for the MoE presets only: all-to-all exposed and overlapped."""
TOL = 1e-9


def _configs() -> list[RunConfig]:
    """Every catalog GPU x preset x layout that parses (bf16, else fp16 where the GPU has no bf16).

    Parts without a vector (fp32) peak in the catalog cannot be timed and are left out."""
    configs = []
    gpus = [g for g in list_hardware() if g.peak_fp32_tflops is not None]
    grid = [(m, lay) for m in PRESETS for lay in LAYOUTS]
    grid += [(m, lay) for m in PRESETS if TransformerSpec.from_name(m).is_moe for lay in MOE_LAYOUTS]
    for gpu, (model, layout) in itertools.product(gpus, grid):
        for dtype in ("bf16", "fp16"):
            row = {"model": model, **layout, "cp": 1, "micro_batch": 1, "global_batch": 32, "dtype": dtype,
                   "gpu": gpu.id, "num_gpus": 8, "gpus_per_node": 8, "recompute": "none"}  # fmt: skip
            try:
                configs.append(parse_run_row(row))
                break
            except SpecError:
                continue
    return configs


@pytest.fixture(scope="module")
def sweep() -> tuple[list[RunConfig], dict[str, pd.DataFrame], dict[str, MFUCeiling]]:
    configs = _configs()
    predictors = {"analytic": StepPredictor.analytic(), "default": load_step_predictor(None)}
    preds = {name: p.predict_configs(configs) for name, p in predictors.items()}
    ceilings = {name: getattr(p.step_model, "mfu_ceiling_", None) or MFUCeiling() for name, p in predictors.items()}
    return configs, preds, ceilings


def test_sweep_covers_the_catalog(sweep) -> None:  # type: ignore[no-untyped-def]
    configs, _, _ = sweep
    gpus = {c.cluster.gpu.id for c in configs}
    assert {"a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb", "b200-hgx", "gb200-per-gpu", "mi300x"} <= gpus
    assert len(gpus) >= 20  # parts without a 16-bit or vector peak in the catalog cannot run these
    moe = {c.cluster.gpu.id for c in configs if c.model.is_moe and c.parallel.ep == 8}
    overlapped = {c.cluster.gpu.id for c in configs if c.parallel.ep_comm_overlap}
    assert moe == overlapped == gpus  # the fine-grained MoE preset, expert-parallel, on every GPU


@pytest.mark.parametrize("name", ["analytic", "default"])
def test_mfu_at_most_the_ceiling(sweep, name: str) -> None:  # type: ignore[no-untyped-def]
    configs, preds, ceilings = sweep
    mfu = measured_mfu(configs, preds[name]["step_ms"])
    assert (mfu <= ceilings[name].ceiling(configs) + TOL).all()
    assert (mfu <= 1.0 + TOL).all()


@pytest.mark.parametrize("name", ["analytic", "default"])
def test_step_at_least_compute_at_peak(sweep, name: str) -> None:  # type: ignore[no-untyped-def]
    configs, preds, _ = sweep
    floor = model_flops(configs) / peak_flops(configs) * 1e3
    pred = preds[name]
    assert (pred["step_ms"].to_numpy() >= floor * (1 - TOL)).all()
    if name == "default":  # the interval is raised with the median
        assert (pred["step_lo_ms"].to_numpy() >= floor * (1 - TOL)).all()
        assert (pred["step_lo_ms"] <= pred["step_ms"]).all() and (pred["step_ms"] <= pred["step_hi_ms"]).all()


def _dominates(a: RunConfig, b: RunConfig) -> bool:
    """``a``'s GPU has at least ``b``'s peak at the dtype, memory bandwidth and link bandwidths, more of one."""
    fa, fb = (
        np.array([
            c.cluster.gpu.peak_tflops(c.parallel.dtype), c.cluster.gpu.mem_bw_gbps,
            c.cluster.intra_node_bw_gbps, c.cluster.inter_node_bw_gbps,
        ])
        for c in (a, b)
    )  # fmt: skip
    return bool((fa >= fb).all() and (fa > fb).any())


@pytest.mark.parametrize("name", ["analytic", "default"])
def test_faster_hardware_not_slower_beyond_the_interval(sweep, name: str) -> None:  # type: ignore[no-untyped-def]
    configs, preds, _ = sweep
    pred = preds[name]
    step = pred["step_ms"].to_numpy()
    # the analytic predictor has no interval: the faster GPU must not be slower at all
    hi = step if name == "analytic" else pred["step_hi_ms"].to_numpy()
    key = [
        (c.model.num_layers, c.model.hidden_size, c.parallel.tp, c.parallel.pp, c.parallel.dp, c.parallel.ep,
         c.parallel.ep_comm_overlap)
        for c in configs
    ]
    by_key: dict[tuple, list[int]] = {}
    for i, k in enumerate(key):
        by_key.setdefault(k, []).append(i)
    bad, compared = [], 0
    for rows in by_key.values():
        for i, j in itertools.permutations(rows, 2):
            if configs[i].parallel.dtype == configs[j].parallel.dtype and _dominates(configs[i], configs[j]):
                compared += 1
                if step[i] > hi[j] * (1 + 1e-6):
                    bad.append((configs[i].cluster.gpu.id, configs[j].cluster.gpu.id, key[i], step[i], hi[j]))
    assert compared > 100 and not bad, bad[:5]


def test_ceiling_rule() -> None:
    configs = [c for c in _configs() if c.cluster.gpu.id in ("a100-sxm4-80gb", "h100-sxm5-80gb")]
    a100 = [c for c in configs if c.cluster.gpu.id == "a100-sxm4-80gb"][:2]
    step = model_flops(a100) / peak_flops(a100) * 1e3 / np.array([0.5, 0.4])  # MFU 0.5 and 0.4
    ceiling = MFUCeiling(margin=0.1).fit(a100, step)
    assert ceiling.best_ == {("ampere", "tensor"): pytest.approx(0.5)}
    assert ceiling.ceiling_of("ampere", "bf16") == pytest.approx(0.55)
    assert ceiling.ceiling_of("ampere", "fp8") == pytest.approx(0.55)  # same tensor class
    assert ceiling.ceiling_of("hopper", "bf16") == pytest.approx(0.55)  # nearest generation
    assert ceiling.ceiling_of("ampere", "fp32") == 1.0  # no fp32 run: only compute at peak
    assert MFUCeiling().ceiling_of("hopper", "bf16") == 1.0
    assert MFUCeiling.from_dict(ceiling.to_dict()).best_ == ceiling.best_
    assert dtype_class("fp32") == "fp32" and dtype_class("mxfp8") == "tensor"
    assert gpu_generation(a100[0].cluster.gpu) == "ampere"


def test_apply_floor_raises_median_and_interval() -> None:
    step, lo, hi, capped = apply_floor([1.0, 5.0], [0.5, np.nan], [2.0, np.nan], [3.0, 3.0])
    assert step.tolist() == [3.0, 5.0] and capped.tolist() == [True, False]
    assert lo[0] == 3.0 and hi[0] == 3.0 and np.isnan(lo[1]) and np.isnan(hi[1])
