"""``python -m dflash_tasks.verify``: entry point; the code is in :mod:`dflash_tasks.output.verify`."""

import sys

from dflash_tasks.output.verify import main

if __name__ == "__main__":
    sys.exit(main())
