"""``python -m specbench.datastore``: an entry point; the command lives in :mod:`specbench.cli.datastore`."""

from specbench.cli.datastore import main

if __name__ == "__main__":
    main()
