"""``python -m specbench.eagle_head``: an entry point; the command lives in :mod:`specbench.cli.eagle_head`."""

from specbench.cli.eagle_head import run

if __name__ == "__main__":
    run()
