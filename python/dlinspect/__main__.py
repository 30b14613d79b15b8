"""``python -m dlinspect``: the ``dlinspect`` command (see :mod:`dlinspect.cli`)."""

import sys

from .cli import main

sys.exit(main())
