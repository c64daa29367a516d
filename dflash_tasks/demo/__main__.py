"""``python -m dflash_tasks.demo``: see :mod:`dflash_tasks.demo`."""

import sys

from dflash_tasks.demo.run import main

if __name__ == "__main__":
    sys.exit(main())
