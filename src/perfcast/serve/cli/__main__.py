"""``python -m perfcast.serve.cli``: the ``perfcast`` command."""

import sys

from perfcast.serve.cli.main import app

sys.exit(app())
