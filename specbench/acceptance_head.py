"""``python -m specbench.acceptance_head``: an entry point; the command lives in :mod:`specbench.cli.acceptance_head`."""

from specbench.cli.acceptance_head import run

if __name__ == "__main__":
    run()
