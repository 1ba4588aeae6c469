"""``perfcast serve``: run the HTTP service (:mod:`perfcast.serve.api`) with uvicorn.

Predictions are CPU-bound, so one worker process answers about one request per core at
a time; ``--workers N`` runs N processes (each loads the predictors once), which is how
the service uses more than one core.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from perfcast._optional import require
from perfcast.serve.cli._guard import user_errors
from perfcast.serve.service_limits import ServiceLimits

MODEL_ENV = "PERFCAST_SERVE_MODEL"
"""How ``--model`` reaches worker processes (empty: the shipped default)."""
_DEFAULTS = ServiceLimits()
LIMITS_ENV = "PERFCAST_SERVE_LIMITS"
"""How the request limits reach worker processes: JSON of :class:`~perfcast.serve.api.ServiceLimits` fields."""


def app_from_env():  # type: ignore[no-untyped-def]
    """The app factory uvicorn's worker processes call: the predictors named by ``$PERFCAST_SERVE_MODEL``
    under the limits in ``$PERFCAST_SERVE_LIMITS``."""
    from perfcast.serve.api import create_app

    fields = json.loads(os.environ.get(LIMITS_ENV) or "{}")
    fields["model_dirs"] = tuple(Path(d) for d in fields.get("model_dirs", ()))
    return create_app(model=os.environ.get(MODEL_ENV) or None, limits=ServiceLimits(**fields))


def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; 0.0.0.0 exposes the service."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    model: str | None = typer.Option(
        None, "--model", help="Predictor: 'analytic', a bundle folder or an MLflow URI; default: shipped."
    ),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (predictions are CPU-bound)."),
    threads: int = typer.Option(
        _DEFAULTS.prediction_threads, "--threads", min=1, help="Requests each worker parses and predicts at once."
    ),
    model_dir: list[Path] = typer.Option(
        [],
        "--model-dir",
        help="Folder whose model config files a request's `model` may name (repeatable; "
        "default none: presets and inline configs only).",
        exists=True,
        file_okay=False,
        dir_okay=True,
    ),
    max_body_mb: float = typer.Option(
        _DEFAULTS.max_body_bytes / (1 << 20), "--max-body-mb", min=0.001, help="Largest request body, MiB (413)."
    ),
    max_rows: int = typer.Option(_DEFAULTS.max_rows, "--max-rows", min=1, help="Most rows in one predict request."),
    max_search_layouts: int = typer.Option(
        _DEFAULTS.max_search_layouts, "--max-search-layouts", min=1, help="Most layouts one search may enumerate."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve predictions over HTTP: POST /v1/predict/ops, /v1/predict/steps, /v1/search; GET /v1/hardware,
    /v1/models. The service reads no file a request names unless it lies in a --model-dir folder."""
    with user_errors():
        require("fastapi", "uvicorn", purpose="perfcast serve")
    import uvicorn

    os.environ[MODEL_ENV] = model or ""
    os.environ[LIMITS_ENV] = json.dumps({
        "max_body_bytes": int(max_body_mb * (1 << 20)), "max_rows": max_rows,
        "max_search_layouts": max_search_layouts, "prediction_threads": threads,
        "model_dirs": [str(d.resolve()) for d in model_dir],
    })  # fmt: skip
    with user_errors():
        app_from_env()  # fail here, with a clear error, rather than in every worker
    typer.echo(f"perfcast serving on http://{host}:{port} with {workers} worker(s) (OpenAPI: /docs)", err=True)
    uvicorn.run("perfcast.serve.cli.serve_cmd:app_from_env", factory=True, host=host, port=port, log_level=log_level,
                workers=workers)  # fmt: skip
