"""``python -m specbench.report`` (and the ``specbench`` command): an entry point; the command lives in
:mod:`specbench.cli.report`."""

from specbench.cli.report import main

if __name__ == "__main__":
    main()
