"""``python -m cep.cli``: the ``vigil`` command."""

from __future__ import annotations

import sys

from cep.cli.main import main

sys.exit(main())
