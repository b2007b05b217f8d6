"""``python -m specbench <verb>``: the ``specbench`` command where it is not installed (:mod:`specbench.cli`)."""

from specbench.cli import main

if __name__ == "__main__":
    main()
