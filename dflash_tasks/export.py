"""``python -m dflash_tasks.export``: entry point; the code is in :mod:`dflash_tasks.output.export`."""

import sys

from dflash_tasks.output.export import main

if __name__ == "__main__":
    sys.exit(main())
