"""``python -m hostler``: the CLI, for an environment without the ``hostler`` console script."""

from __future__ import annotations

import sys

from hostler.cli import main

if __name__ == "__main__":
    sys.exit(main())
