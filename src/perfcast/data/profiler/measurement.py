"""What timing one row yields: the repeat policy, the statistics of the repeats, and the
skip a row raises instead.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from perfcast.errors import SpecError

MIN_FLOOR_REPEATS = 3
"""Calls a row still gets once ``max_time_s`` of measured time passed."""


@dataclass(frozen=True)
class Measurement:
    """Statistics of the repeats of one op, ms."""

    median_ms: float
    min_ms: float
    max_ms: float
    std_ms: float
    n_repeats: int

    @classmethod
    def from_samples(cls, samples_ms: list[float]) -> Measurement:
        """Summarise per-repeat times (ms); the standard deviation uses ``ddof=1``."""
        if not samples_ms:
            raise ValueError("no samples")
        std = statistics.stdev(samples_ms) if len(samples_ms) > 1 else 0.0
        return cls(
            median_ms=float(statistics.median(samples_ms)),
            min_ms=float(min(samples_ms)),
            max_ms=float(max(samples_ms)),
            std_ms=float(std),
            n_repeats=len(samples_ms),
        )


@dataclass(frozen=True)
class RepeatPolicy:
    """How many times an op runs (see :mod:`perfcast.data.profiler.timing`, "Repeats")."""

    warmup: int = 3
    min_repeats: int = 5
    max_repeats: int = 100
    min_time_s: float = 0.1
    max_time_s: float = 1.0

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.min_repeats < 1 or self.max_repeats < self.min_repeats:
            raise SpecError(
                f"repeat policy warmup={self.warmup}, min_repeats={self.min_repeats}, "
                f"max_repeats={self.max_repeats}: need warmup >= 0 and 1 <= min_repeats <= max_repeats"
            )

    def describe(self) -> str:
        return (
            f"repeat until >= {self.min_repeats} calls and >= {self.min_time_s:g} s measured, or "
            f"{self.max_repeats} calls; after {self.max_time_s:g} s measured stop at {MIN_FLOOR_REPEATS} calls"
        )


class OpSkipped(Exception):  # noqa: N818  (a skip, not an error)
    """A row that cannot or should not run here; ``reason`` is a short code, ``detail`` says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
