"""Entry point for the ``instructions`` benchmark suite (the code:
python/dlinspect/bench/instructions.py): instructions per call under valgrind's callgrind.

The same as ``dlinspect bench instructions [options]``; options: --quick, --json FILE,
--check (exit 1 when a target fails), --no-progress. Needs valgrind.
"""

import sys

from dlinspect.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "instructions", *sys.argv[1:]]))
