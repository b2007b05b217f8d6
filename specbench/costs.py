"""``python -m specbench.costs``: an entry point; the command lives in :mod:`specbench.cli.costs`."""

from specbench.cli.costs import main

if __name__ == "__main__":
    main()
