"""Entry point for the ``copies`` benchmark suite (the code: python/dlinspect/bench/copies.py).

The same as ``dlinspect bench copies [options]``; options: --quick, --repeat N,
--json FILE, --check (exit 1 when a target fails), --no-progress. See
``dlinspect bench --help``.
"""

import sys

from dlinspect.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "copies", *sys.argv[1:]]))
