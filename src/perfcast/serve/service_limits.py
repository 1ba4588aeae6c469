"""What one request may ask of the HTTP service (``perfcast serve``), with its defaults.

Kept apart from :mod:`perfcast.serve.api` so the CLI can show the defaults without
importing the web stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

MAX_ROWS = 100_000
"""Default most rows one request may carry; larger sweeps belong to ``perfcast predict`` on a file."""


@dataclass(frozen=True)
class ServiceLimits:
    """What one request may ask of the service.

    Attributes:
        max_body_bytes: largest request body, bytes; larger is a 413.
        max_rows: most rows in one predict request.
        max_search_layouts: most layouts one search may enumerate (all GPU types together).
        prediction_threads: requests parsed and predicted at once (the rest wait their turn).
        model_dirs: folders whose model config files a request's ``model`` may name.
    """

    max_body_bytes: int = 16 << 20
    max_rows: int = MAX_ROWS
    max_search_layouts: int = 20_000
    prediction_threads: int = 2
    model_dirs: tuple[Path, ...] = field(default_factory=tuple)
