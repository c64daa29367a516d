"""``python -m dflash_tasks.report``: entry point; the code is in :mod:`dflash_tasks.output.report`."""

import sys

from dflash_tasks.output.report import main

if __name__ == "__main__":
    sys.exit(main())
