"""Resolve ``--model`` references to predictors.

A reference is ``analytic`` (roofline and alpha-beta, no learning), a bundle directory
(see :mod:`perfcast.models.bundle`), or an MLflow model URI (``models:/name/3``,
``models:/m-<id>``, ``runs:/<run>/model``) of a model logged by ``perfcast train``.
Without a reference the shipped default bundle is used.

For steps, a bundle with a step model predicts steps with it; a bundle without one
composes its op predictions (``composed``), and ``analytic`` composes roofline op times.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from perfcast.errors import BundleError
from perfcast.models.analytic import NAME as ANALYTIC
from perfcast.models.analytic import AnalyticOpPredictor

logger = logging.getLogger(__name__)

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
COMPOSED = "composed"


def default_bundle_path() -> Path:
    """Folder of the op predictor shipped inside the package."""
    return Path(str(resources.files("perfcast.models").joinpath("default_bundle")))


def load_op_predictor(ref: str | None = None) -> Any:
    """The op predictor named by ``ref`` (see the module docstring).

    Raises:
        BundleError: a path that is not a bundle, or an MLflow URI that cannot be loaded.
    """
    if ref is None:
        if not (default_bundle_path() / "manifest.json").is_file():
            logger.warning("no default op predictor is shipped in this build; using the analytic model")
            return AnalyticOpPredictor()
        ref = str(default_bundle_path())
    if ref == ANALYTIC:
        return AnalyticOpPredictor()
    if ref.startswith(MLFLOW_SCHEMES):
        return _load_mlflow(ref)
    from perfcast.models.bundle import load_bundle

    path = Path(ref)
    if not path.is_dir():
        schemes = ", ".join(MLFLOW_SCHEMES)
        raise BundleError(f"--model {ref!r}: not 'analytic', a bundle folder or an MLflow URI ({schemes})")
    return load_bundle(path)


def _load_mlflow(uri: str) -> Any:
    """Load a perfcast pyfunc model from the tracking store in force and return its bundle."""
    import mlflow

    from perfcast.training.tracking import tracking_uri

    mlflow.set_tracking_uri(tracking_uri())
    try:
        model = mlflow.pyfunc.load_model(uri)
    except Exception as exc:  # MLflow raises several types (MlflowException, OSError ...)
        raise BundleError(f"cannot load MLflow model {uri!r} from {tracking_uri()}: {exc}") from None
    python_model = model.unwrap_python_model()
    bundle = getattr(python_model, "bundle", None)
    if bundle is None:
        raise BundleError(f"{uri!r} is not a perfcast op predictor")
    return bundle


def load_step_predictor(ref: str | None = None) -> Any:
    """The step predictor named by ``ref``: ``analytic``, ``composed`` (the default op
    bundle composed, no step model), a bundle folder or an MLflow URI; None is the
    shipped default bundle.

    Raises:
        BundleError: as :func:`load_op_predictor`.
    """
    from perfcast.models.step_predictor import StepPredictor

    if ref == ANALYTIC:
        return StepPredictor.analytic()
    if ref == COMPOSED:
        bundle = load_op_predictor(None)
        return StepPredictor(bundle, getattr(bundle, "collective_model", None), name=f"composed:{bundle.name}")
    predictor = load_op_predictor(ref)
    if isinstance(predictor, AnalyticOpPredictor):  # no default bundle shipped
        return StepPredictor.analytic()
    return predictor.step_predictor()


def load_calibrated_predictor(kind: str, ref: str | None, calibration: bool = True) -> Any:
    """The ``steps`` or ``ops`` predictor of ``ref``, with the stored calibrations applied when asked."""
    from perfcast.serve.calibrate_cmd import calibration_dir
    from perfcast.serve.calibrate_steps_cmd import step_calibration_dir

    if kind == "steps":
        from perfcast.models.step_calibration import CalibratedStepPredictor, load_step_corrections

        steps = load_step_predictor(ref)
        corrections = load_step_corrections(step_calibration_dir()) if calibration else {}
        return CalibratedStepPredictor(steps, corrections) if corrections else steps
    from perfcast.models.calibration import CalibratedPredictor, load_corrections

    ops = load_op_predictor(ref)
    op_corrections = load_corrections(calibration_dir()) if calibration else {}
    return CalibratedPredictor(ops, op_corrections) if op_corrections else ops
