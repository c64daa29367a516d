"""``python -m workers.node``: see :mod:`workers.node.main`."""

import sys

from workers.node.main import main

if __name__ == "__main__":
    sys.exit(main())
