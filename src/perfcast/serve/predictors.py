"""Resolve ``--model`` references to predictors.

A reference is ``analytic`` (roofline and alpha-beta, no learning), a bundle directory
(see :mod:`perfcast.models.bundle`), or an MLflow model URI (``models:/name/3``,
``models:/m-<id>``, ``runs:/<run>/model``) of a model logged by ``perfcast train``.
Without a reference the shipped default bundle is used.

For steps, a bundle with a step model predicts steps with it; a bundle without one
composes its op predictions (``composed``), and ``analytic`` composes roofline op times.

:func:`load_calibrated_predictor` adds the stored calibrations fitted for the predictor
loaded (:func:`with_calibrations`); every front door loads through it.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from perfcast.errors import BundleError, SpecError
from perfcast.models.analytic import NAME as ANALYTIC
from perfcast.models.analytic import AnalyticOpPredictor
from perfcast.models.predictor_protocol import OpPredictor, StepTimePredictor
from perfcast.serve.calibration_store import calibration_dir, step_calibration_dir

logger = logging.getLogger(__name__)

MLFLOW_SCHEMES = ("models:/", "runs:/", "mlflow-artifacts:/")
COMPOSED = "composed"
KINDS = ("ops", "steps")


def default_bundle_path() -> Path:
    """Folder of the op predictor shipped inside the package."""
    return Path(str(resources.files("perfcast.models").joinpath("default_bundle")))


def load_op_predictor(ref: str | None = None) -> OpPredictor:
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
        model = mlflow.pyfunc.load_model(uri, model_config={"calibration": False})  # the bare bundle
    except Exception as exc:  # MLflow raises several types (MlflowException, OSError ...)
        raise BundleError(f"cannot load MLflow model {uri!r} from {tracking_uri()}: {exc}") from None
    python_model = model.unwrap_python_model()
    bundle = getattr(python_model, "bundle", None)
    if bundle is None:
        raise BundleError(f"{uri!r} is not a perfcast op predictor")
    return bundle


def load_step_predictor(ref: str | None = None) -> StepTimePredictor:
    """The step predictor named by ``ref``: ``analytic``, ``composed`` (the default op
    bundle composed, no step model), a bundle folder or an MLflow URI; None is the
    shipped default bundle.

    Raises:
        BundleError: as :func:`load_op_predictor`.
    """
    from perfcast.models.bundle import PredictorBundle
    from perfcast.models.step_predictor import StepPredictor

    if ref == ANALYTIC:
        return StepPredictor.analytic()
    if ref == COMPOSED:
        ops = load_op_predictor(None)
        collective = ops.collective_model if isinstance(ops, PredictorBundle) else None
        return StepPredictor(ops, collective, name=f"composed:{ops.name}")
    predictor = load_op_predictor(ref)
    if not isinstance(predictor, PredictorBundle):  # no default bundle shipped
        return StepPredictor.analytic()
    return predictor.step_predictor()


def with_calibrations(
    predictor: OpPredictor | StepTimePredictor, kind: str, calibration: bool = True, *, folder: str | Path | None = None
) -> OpPredictor | StepTimePredictor:
    """``predictor`` (an ``ops`` or ``steps`` predictor) with the stored corrections fitted for it.

    The corrections are read from ``folder`` (default: :func:`calibration_dir`; step
    corrections from its ``steps`` folder) and only those keyed by this predictor's
    identity apply (:func:`perfcast.models.calibration.predictor_identity`). Returns
    ``predictor`` itself when ``calibration`` is False (nothing is read) or none applies;
    otherwise a calibrated wrapper whose rows name the correction applied.

    Raises:
        SpecError: an unknown ``kind``.
        BundleError: a stored correction that is not valid (the file and field named).
    """
    if kind not in KINDS:
        raise SpecError(f"kind={kind!r} unknown; allowed: {', '.join(KINDS)}")
    if not calibration:
        return predictor
    from perfcast.models.calibration import predictor_identity

    base = Path(folder) if folder is not None else calibration_dir()
    identity = predictor_identity(predictor)
    if kind == "steps":
        from perfcast.models.step_calibration import CalibratedStepPredictor, load_step_corrections

        where = step_calibration_dir(base)
        wrapped: Any = CalibratedStepPredictor(predictor, load_step_corrections(where, identity), where=str(where))
    else:
        from perfcast.models.calibration import CalibratedPredictor, load_corrections

        where = base
        wrapped = CalibratedPredictor(predictor, load_corrections(where, identity), where=str(where))
    if not wrapped.corrections:
        return predictor
    logger.info(
        "applying the stored %s corrections of %s (fitted for %s) from %s",
        kind,
        ", ".join(sorted(wrapped.corrections)),
        identity,
        where,
    )
    return wrapped


def load_calibrated_predictor(
    kind: str, ref: str | None, calibration: bool = True, *, folder: str | Path | None = None
) -> OpPredictor | StepTimePredictor:
    """The ``steps`` or ``ops`` predictor of ``ref`` (:func:`load_step_predictor`,
    :func:`load_op_predictor`) with its stored calibrations applied when ``calibration``
    (:func:`with_calibrations`). The one loader of the CLI, the HTTP service, the MLflow
    pyfunc and Dask workers.

    Raises:
        SpecError: an unknown ``kind``.
        BundleError: a reference that cannot be loaded, or an invalid stored correction.
    """
    if kind not in KINDS:
        raise SpecError(f"kind={kind!r} unknown; allowed: {', '.join(KINDS)}")
    predictor = load_step_predictor(ref) if kind == "steps" else load_op_predictor(ref)
    return with_calibrations(predictor, kind, calibration, folder=folder)
