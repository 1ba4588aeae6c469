"""Physics bounds of a predicted training step: a measured MFU ceiling per GPU generation and dtype.

DESIGN.md decision 1: "no step above a plausible MFU ceiling". A learned correction can
push a step below what the hardware can do (a tree leaf learned on slow runs applied to
a fast one, or the reverse); the bound stops it.

Model FLOPs and MFU are perfcast's own (the ``mfu`` column of ``perfcast predict steps``):

.. math::

    F = \\text{model\\_flops\\_per\\_step}(c), \\qquad
    \\text{MFU} = \\frac{F}{t_{step} \\cdot N_{gpu} \\cdot P_{dtype}}

with :func:`perfcast.models.analytic.model_flops_per_step` (Narayanan et al.: 6 FLOPs per
parameter and token plus causal attention, no recomputation; LoRA without the frozen
weights' gradients) and ``P_dtype`` the GPU's dense peak for the run's dtype
(:meth:`~perfcast.features.hardware.HardwareSpec.peak_tflops`). A forward-only time
(``timing_scope = "fwd"``) counts a third of ``F``.

Ceiling rule (:class:`MFUCeiling`): ``fit`` records, per (GPU generation, dtype class),
the highest measured MFU of the training runs whose time is a step or a forward-backward
pass. The dtype class (:func:`dtype_class`) is ``tensor`` for the tensor-core dtypes (tf32,
fp16, bf16, fp8 and the block-scaled ones) and ``fp32`` for plain fp32: a run in fp8
reaches a lower fraction of its (twice as high) peak than the same run in bf16, because
attention, norms and communication do not speed up, so the best 16-bit MFU of a generation
bounds its fp8 runs too (an exact-dtype key would leave the fp8 ceiling to whichever
frameworks happened to be in training).
A query's ceiling is that best MFU times ``1 + margin`` (default :data:`DEFAULT_MARGIN` =
+10% relative), at most ``max_mfu`` (1). A (generation, class) with no training run takes
the nearest generation that has the class (by the mean release year of the generation's
catalog GPUs; a tie takes the higher ceiling); a class with no training run at all takes
``max_mfu``. Unfitted (a bundle trained before the bound existed, or the analytic
predictor), every ceiling is ``max_mfu``: the step is at least its model FLOPs at
datasheet peak.

Caveat: NeuSight's fp32 runs on AMD MI210 measure MFU 1.01-1.02 against the catalog's
fp32 peak, which is the vector rate, while the GEMMs run on the matrix cores (twice the
rate); the ``max_mfu`` cap clips those two rows by at most 2%.

The bound (:func:`apply_floor`): the step floor is ``F / (ceiling * N_gpu * P_dtype)``,
which is at least the compute at peak (``ceiling <= 1``). The median and both interval
bounds are raised to the floor; a raised median is "MFU-capped". Communication is not
added to the floor: every measured run overlaps a framework-specific share of it, so the
part that no framework can hide is not known from the config alone; the ceiling is
measured on whole steps and so already holds the communication of the best runs.

GPU generation (:func:`gpu_generation`): the first word of the catalog's
``architecture`` (``Hopper``, ``Ampere``, ``Blackwell`` ...), lowercased; the GPU id when the
catalog states none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

import numpy as np

from perfcast.features.hardware_spec import HardwareSpec, list_hardware
from perfcast.features.run_config import RunConfig
from perfcast.models.analytic import model_flops_per_step

__all__ = [
    "AT_CEILING_COLUMN",
    "DEFAULT_MARGIN",
    "MAX_MEASURED_MFU",
    "MFUCeiling",
    "apply_floor",
    "at_ceiling",
    "dtype_class",
    "floor_at",
    "gpu_generation",
    "measured_mfu",
    "model_flops",
    "peak_flops",
]

DEFAULT_MARGIN = 0.10
"""Relative margin over the best measured MFU of a (generation, dtype)."""
_FORWARD_SHARE = {"step": 1.0, "fwd_bwd": 1.0, "fwd": 1.0 / 3.0}
"""Share of a training step's model FLOPs in a measured time of each timing scope."""
_CEILING_SCOPES = ("step", "fwd_bwd")


def dtype_class(dtype: str) -> str:
    """``fp32`` for plain fp32 (vector units), else ``tensor`` (see the module docstring)."""
    return "fp32" if dtype == "fp32" else "tensor"


def gpu_generation(gpu: HardwareSpec) -> str:
    """Generation of ``gpu``: first word of its catalog architecture, lowercased (``hopper``), else its id."""
    words = (gpu.architecture or "").split()
    return words[0].lower() if words else gpu.id


def _generation_years() -> dict[str, float]:
    """Mean catalog release year of each generation's GPUs (generations without years are left out)."""
    years: dict[str, list[int]] = {}
    for gpu in list_hardware():
        if gpu.release_year is not None:
            years.setdefault(gpu_generation(gpu), []).append(gpu.release_year)
    return {gen: float(np.mean(v)) for gen, v in years.items()}


def model_flops(configs: Sequence[RunConfig], timing_scopes: Sequence[str] | None = None) -> np.ndarray:
    """Model FLOPs of each config's measured time (see the module docstring), FLOPs; each
    distinct (model, fine-tuning, attention length, global batch) is counted once."""
    scopes = timing_scopes or ["step"] * len(configs)
    per_step: dict[tuple[int, object, int | None, int], float] = {}
    out = np.empty(len(configs))
    for i, (c, s) in enumerate(zip(configs, scopes, strict=True)):
        key = (id(c.model), c.parallel.finetune, c.parallel.document_tokens, c.parallel.global_batch)
        if key not in per_step:
            per_step[key] = model_flops_per_step(c)
        out[i] = per_step[key] * _FORWARD_SHARE[s]
    return out


def peak_flops(configs: Sequence[RunConfig]) -> np.ndarray:
    """Dense peak of each config's whole cluster at its dtype, FLOP/s; each distinct
    (cluster, dtype) is looked up once."""
    peaks: dict[tuple[int, object], float] = {}
    out = np.empty(len(configs))
    for i, c in enumerate(configs):
        key = (id(c.cluster), c.parallel.dtype)
        if key not in peaks:
            peaks[key] = c.cluster.gpu.peak_tflops(c.parallel.dtype) * 1e12 * c.cluster.num_gpus
        out[i] = peaks[key]
    return out


def measured_mfu(configs: Sequence[RunConfig], step_ms: Any, timing_scopes: Sequence[str] | None = None) -> np.ndarray:
    """MFU (fraction) of each config at the time ``step_ms`` (ms): the one home of MFU, for
    predictions as for measurements."""
    seconds = np.asarray(step_ms, dtype=float) / 1e3
    return model_flops(configs, timing_scopes) / (seconds * peak_flops(configs))


def floor_at(configs: Sequence[RunConfig], mfu: Any, timing_scopes: Sequence[str] | None = None) -> np.ndarray:
    """Time of each config at the MFU ``mfu`` (fraction, one per config), ms: its model FLOPs over that
    share of its cluster's dense peak."""
    return model_flops(configs, timing_scopes) / (np.asarray(mfu, dtype=float) * peak_flops(configs)) * 1e3


def tokens_per_second(configs: Sequence[RunConfig], step_ms: Any) -> np.ndarray:
    """Training tokens per second of each config at the step time ``step_ms`` (ms), whole cluster."""
    tokens = np.array([c.tokens_per_step for c in configs], dtype=float)
    return tokens / (np.asarray(step_ms, dtype=float) / 1e3)


class MFUCeiling:
    """Highest plausible MFU per (GPU generation, dtype), from measured runs (see the module docstring).

    Args:
        margin: relative margin over the best measured MFU (0.1 = +10%).
        max_mfu: the ceiling never exceeds this (and is this when nothing was fitted).

    Attributes:
        best_: ``{(generation, dtype class): best measured MFU}`` of the fitted runs (empty unfitted).
    """

    def __init__(self, *, margin: float = DEFAULT_MARGIN, max_mfu: float = 1.0) -> None:
        self.margin = margin
        self.max_mfu = max_mfu
        self.best_: dict[tuple[str, str], float] = {}

    def fit(
        self, configs: Sequence[RunConfig], measured_step_ms: Any, timing_scopes: Sequence[str] | None = None
    ) -> Self:
        """Record the best MFU of each (generation, dtype class) among runs timed as a step or fwd+bwd."""
        scopes = list(timing_scopes or ["step"] * len(configs))
        mfu = measured_mfu(configs, measured_step_ms, scopes)
        best: dict[tuple[str, str], float] = {}
        for config, scope, value in zip(configs, scopes, mfu, strict=True):
            if scope in _CEILING_SCOPES and np.isfinite(value):
                key = (gpu_generation(config.cluster.gpu), dtype_class(config.parallel.dtype.value))
                best[key] = max(best.get(key, 0.0), float(value))
        self.best_ = best
        return self

    def ceiling_of(self, generation: str, dtype: str) -> float:
        """MFU ceiling (fraction) of a generation and dtype: its class's, else the nearest fitted generation's."""
        cls = dtype_class(dtype)
        best = self.best_.get((generation, cls))
        if best is None:
            keys = [k for k in self.best_ if k[1] == cls]
            if not keys:
                return self.max_mfu
            years = _generation_years()
            year = years.get(generation, np.nan)
            gap = [abs(years.get(k[0], np.nan) - year) for k in keys]
            gap = [g if np.isfinite(g) else np.inf for g in gap]
            nearest = min(gap)
            best = max(self.best_[k] for k, g in zip(keys, gap, strict=True) if g == nearest)
        return float(min(self.max_mfu, best * (1.0 + self.margin)))

    def ceiling(self, configs: Sequence[RunConfig]) -> np.ndarray:
        """MFU ceiling (fraction) per config."""
        memo: dict[tuple[str, str], float] = {}
        out = np.empty(len(configs))
        for i, c in enumerate(configs):
            key = (gpu_generation(c.cluster.gpu), c.parallel.dtype.value)
            if key not in memo:
                memo[key] = self.ceiling_of(*key)
            out[i] = memo[key]
        return out

    def floor_ms(self, configs: Sequence[RunConfig], timing_scopes: Sequence[str] | None = None) -> np.ndarray:
        """Shortest plausible time of each config, ms: its model FLOPs at the ceiling MFU."""
        return floor_at(configs, self.ceiling(configs), timing_scopes)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able state (stored in a step model's bundle metadata)."""
        best = [{"generation": g, "dtype_class": d, "mfu": v} for (g, d), v in sorted(self.best_.items())]
        return {"margin": self.margin, "max_mfu": self.max_mfu, "best": best}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> MFUCeiling:
        """Rebuild from :meth:`to_dict`'s output."""
        out = cls(margin=float(state["margin"]), max_mfu=float(state["max_mfu"]))
        out.best_ = {(str(e["generation"]), str(e["dtype_class"])): float(e["mfu"]) for e in state["best"]}
        return out


MAX_MEASURED_MFU = 1.0 + DEFAULT_MARGIN
"""The highest MFU a measured step may show: the dense peak plus the ceiling's margin (NeuSight's MI210
fp32 runs reach 1.02 against the catalog's vector rate, module docstring). A measured step above it is
a wrong unit or timing scope, not a run of that config."""

AT_CEILING_COLUMN = "at_mfu_ceiling"
"""Step-prediction output column: True where the step is its MFU ceiling's floor (the model estimated it
faster, :func:`apply_floor` raised it), so the time is the physical bound, not a distinguishing estimate."""


def at_ceiling(mfu: Any, ceiling: Any) -> np.ndarray:
    """Whether each predicted ``mfu`` sits on its ``ceiling`` (fractions; within rounding)."""
    return np.asarray(mfu, dtype=float) >= np.asarray(ceiling, dtype=float) * (1.0 - 1e-9)


def apply_floor(
    step_ms: Any, lo_ms: Any, hi_ms: Any, floor_ms: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raise the median and interval bounds to ``floor_ms`` (NaN bounds stay NaN).

    Returns:
        ``(step_ms, lo_ms, hi_ms, capped)``, ``capped`` True where the median was raised.
    """
    floor = np.asarray(floor_ms, dtype=float)
    step = np.asarray(step_ms, dtype=float)
    capped = step < floor
    lo, hi = np.asarray(lo_ms, dtype=float), np.asarray(hi_ms, dtype=float)
    lo = np.where(np.isnan(lo), np.nan, np.maximum(lo, floor))
    hi = np.where(np.isnan(hi), np.nan, np.maximum(hi, floor))
    return np.maximum(step, floor), lo, hi, capped
