"""``perfcast serve``: run the HTTP service (:mod:`perfcast.serve.api`) with uvicorn."""

from __future__ import annotations

import typer

from perfcast.errors import PerfcastError

EXIT_USER_ERROR = 2


def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind; 0.0.0.0 exposes the service."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="TCP port."),
    model: str | None = typer.Option(
        None, "--model", help="Predictor: 'analytic', a bundle folder or an MLflow URI; default: shipped."
    ),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve predictions over HTTP: POST /v1/predict/ops and /v1/predict/steps, GET /v1/hardware."""
    import uvicorn

    from perfcast.serve.api import create_app

    try:
        app = create_app(model=model)
    except PerfcastError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=EXIT_USER_ERROR) from None
    typer.echo(f"perfcast serving on http://{host}:{port} (OpenAPI: /docs)", err=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
