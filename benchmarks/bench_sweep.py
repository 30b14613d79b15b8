"""Entry point for the ``sweep`` benchmark suite (the code: python/dlinspect/bench/sweep.py).

The same as ``dlinspect bench sweep [options]``; options: --quick, --repeat N,
--json FILE, --check (exit 1 when a target fails), --no-progress. See
``dlinspect bench --help``.
"""

import sys

from dlinspect.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "sweep", *sys.argv[1:]]))
