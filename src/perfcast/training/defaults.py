"""Training defaults every front door shares (the CLI, the training functions, the benchmarks).

A module of constants only, so the CLI can read them at import without loading the models.
"""

from __future__ import annotations

__all__ = ["DEFAULT_CORRECTION_SCALE"]

DEFAULT_CORRECTION_SCALE = 0.75
"""Share of the step GBDT's log correction applied by default (``correction_scale``), chosen among
0, 0.25, 0.5, 0.75 and 1 on leave-one-source-out MAPE (benchmarks/results/step_transfer_eval.md)."""
