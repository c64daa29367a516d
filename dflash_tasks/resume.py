"""``python -m dflash_tasks.resume``: entry point; the code is in :mod:`dflash_tasks.producer.resume`."""

import sys

from dflash_tasks.producer.resume import main

if __name__ == "__main__":
    sys.exit(main())
