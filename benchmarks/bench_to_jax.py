"""Entry point for the ``to_jax`` benchmark suite (the code: python/dlinspect/bench/to_jax.py).

The same as ``dlinspect bench to_jax [options]``; options: --quick, --repeat N,
--json FILE, --check (exit 1 when a target fails), --no-progress. See
``dlinspect bench --help``.
"""

import sys

from dlinspect.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "to_jax", *sys.argv[1:]]))
