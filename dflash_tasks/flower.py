"""``python -m dflash_tasks.flower``: entry point; the code is in :mod:`dflash_tasks.monitoring.flower`."""

import sys

from dflash_tasks.monitoring.flower import main

if __name__ == "__main__":
    sys.exit(main())
