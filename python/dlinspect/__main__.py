"""``python -m dlinspect``: the ``dlinspect`` command (see :mod:`dlinspect.cli`)."""

from .cli import main

raise SystemExit(main())
