"""``python -m dflash_tasks.enqueue``: entry point; the code is in :mod:`dflash_tasks.producer.enqueue`."""

import sys

from dflash_tasks.producer.enqueue import main

if __name__ == "__main__":
    sys.exit(main())
