"""``python -m dflash_tasks.page``: entry point; the code is in :mod:`dflash_tasks.monitoring.page`."""

import sys

from dflash_tasks.monitoring.page.command import main

if __name__ == "__main__":
    sys.exit(main())
