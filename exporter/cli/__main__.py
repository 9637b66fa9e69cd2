"""`python -m exporter.cli`, the same command as the `topowatch` console script: what the tests
and benchmarks run, with the interpreter they choose."""

from __future__ import annotations

import sys

from exporter.cli import main

if __name__ == "__main__":
    sys.exit(main())
