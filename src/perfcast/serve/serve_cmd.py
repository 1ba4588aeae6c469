"""``perfcast serve``: run the HTTP service (:mod:`perfcast.serve.api`) with uvicorn.

Predictions are CPU-bound, so one worker process answers about one request per core at
a time; ``--workers N`` runs N processes (each loads the predictors once), which is how
the service uses more than one core.
"""

from __future__ import annotations

import os

import typer

from perfcast.errors import PerfcastError

EXIT_USER_ERROR = 2
MODEL_ENV = "PERFCAST_SERVE_MODEL"
"""How ``--model`` reaches worker processes (empty: the shipped default)."""


def app_from_env():  # type: ignore[no-untyped-def]
    """The app factory uvicorn's worker processes call: the predictors named by ``$PERFCAST_SERVE_MODEL``."""
    from perfcast.serve.api import create_app

    return create_app(model=os.environ.get(MODEL_ENV) or None)


def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; 0.0.0.0 exposes the service."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    model: str | None = typer.Option(
        None, "--model", help="Predictor: 'analytic', a bundle folder or an MLflow URI; default: shipped."
    ),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes (predictions are CPU-bound)."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve predictions over HTTP: POST /v1/predict/ops, /v1/predict/steps, /v1/search; GET /v1/hardware."""
    import uvicorn

    os.environ[MODEL_ENV] = model or ""
    try:
        app_from_env()  # fail here, with a clear error, rather than in every worker
    except PerfcastError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USER_ERROR) from None
    typer.echo(f"perfcast serving on http://{host}:{port} with {workers} worker(s) (OpenAPI: /docs)", err=True)
    uvicorn.run("perfcast.serve.serve_cmd:app_from_env", factory=True, host=host, port=port, log_level=log_level,
                workers=workers)  # fmt: skip
