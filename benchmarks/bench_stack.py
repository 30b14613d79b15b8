"""Entry point for the ``stack`` benchmark suite (the code: python/dlinspect/bench/stack.py).

The same as ``dlinspect bench stack [options]``; options: --quick, --repeat N,
--json FILE, --check (exit 1 when a target fails), --no-progress. See
``dlinspect bench --help``.
"""

import sys

from dlinspect.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "stack", *sys.argv[1:]]))
