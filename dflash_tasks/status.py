"""``python -m dflash_tasks.status``: entry point; the code is in :mod:`dflash_tasks.monitoring.status`."""

import sys

from dflash_tasks.monitoring.status import main

if __name__ == "__main__":
    sys.exit(main())
