"""``python -m specbench.gpu_check``: an entry point; the command lives in :mod:`specbench.cli.gpu_check`."""

from specbench.cli.gpu_check import main

if __name__ == "__main__":
    main()
