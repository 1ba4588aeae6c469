"""Where stored calibrations live: one folder for every front door (CLI, HTTP, pyfunc, Dask).

The folder is ``$PERFCAST_CALIBRATION_DIR`` when that is set, else
``~/.config/perfcast/calibration`` (:data:`DEFAULT_CALIBRATION_DIR`). Op corrections
(``perfcast calibrate``) lie directly in it, step corrections (``perfcast calibrate
steps``) in its ``steps`` folder. Which of them apply to a predictor is decided where they
are loaded (:func:`perfcast.serve.predictors.with_calibrations`).
"""

from __future__ import annotations

import os
from pathlib import Path

CALIBRATION_ENV = "PERFCAST_CALIBRATION_DIR"
DEFAULT_CALIBRATION_DIR = "~/.config/perfcast/calibration"
STEPS_FOLDER = "steps"
FOLDER_HELP = f"${CALIBRATION_ENV} if set, else {DEFAULT_CALIBRATION_DIR}"
"""How help texts name the calibration folder."""


def calibration_dir() -> Path:
    """The folder of op corrections: ``$PERFCAST_CALIBRATION_DIR``, else ``~/.config/perfcast/calibration``."""
    return Path(os.environ.get(CALIBRATION_ENV) or Path(DEFAULT_CALIBRATION_DIR).expanduser())


def step_calibration_dir(base: str | Path | None = None) -> Path:
    """The folder of step corrections: ``steps`` in ``base`` (default :func:`calibration_dir`)."""
    return Path(base if base is not None else calibration_dir()) / STEPS_FOLDER
