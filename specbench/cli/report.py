"""``specbench report`` (also the ``specbench`` command): the paper's tables and figures from results/."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from specbench.errors import ConfigError, one_line_errors
from specbench.tables.paper import MODEL_CODES
from specbench.tables.report import write_report


def _compare(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        model, sep, code = item.partition("=")
        if not sep or code not in MODEL_CODES.values():
            raise ConfigError(
                f"--compare-model {item!r}: write <our model>=<paper code>, code one of "
                f"{', '.join(sorted(set(MODEL_CODES.values())))}"
            )
        out[model] = code
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="specbench report",
        description="Tables and figures of the SPECTRA paper from results/, beside the published numbers.",
    )
    parser.add_argument("what", nargs="*", default=["all"],
                        help="table1 … table7, figure3, figure4, figure6, tables, figures or all (default); "
                             "memory_scopes, spec_bench (Spec-Bench's leaderboard layout; not paper tables); "
                             "site (the results site: one folder, opens from file://; --out default reports/site); "
                             "summary (every run under --results, each preset against its own job's baseline: "
                             "summary.md, .csv, .png in --out)")
    parser.add_argument("--results", default="results", help="results folder (default: results)")
    parser.add_argument("--out", default="reports", help="output folder (default: reports)")
    parser.add_argument("--paper-dir", default=None,
                        help="folder of the paper's CSV files (default: paper_dir in conf/config.yaml)")
    parser.add_argument("--spec-bench-dir", default=None,
                        help="folder of Spec-Bench's leaderboard.csv (default: spec_bench_dir in conf/config.yaml)")
    parser.add_argument("--compare-model", action="append", default=[], metavar="MODEL=CODE",
                        help="set a model of ours beside a paper model, e.g. smollm2-135m=L2-7B")
    parser.add_argument("--limit", type=int, default=None,
                        help="site: how many generations the token view carries (default 400)")
    args = parser.parse_args(argv)
    if "summary" in args.what:
        if args.what != ["summary"]:
            parser.error("summary is written alone: specbench report summary --results <folder>")
        from specbench.tables.summary import write_summary

        with one_line_errors():
            if not Path(args.results).exists():
                raise ConfigError(f"no results at {args.results}: run a sweep first, or point --results at one")
            paths = write_summary(args.results, args.out, args.paper_dir)
        print(paths[0].read_text().split("\n", 2)[2].split("\n![")[0].rstrip())
        print("\n" + "\n".join(f"wrote {p}" for p in paths), file=sys.stderr)
        return
    if "site" in args.what:
        if args.what != ["site"]:
            parser.error("site is written alone: specbench report site --results <folder> --out <folder>")
        from specbench.tables.site import MAX_GENERATIONS, write_site

        out = args.out if args.out != "reports" else "reports/site"
        with one_line_errors():
            print(write_site(args.results, out, args.paper_dir, args.spec_bench_dir, _compare(args.compare_model),
                             args.limit or MAX_GENERATIONS))
        return
    with one_line_errors():
        paths = write_report(args.what, args.results, args.out, args.paper_dir, _compare(args.compare_model),
                             args.spec_bench_dir)
    for p in paths:
        print(p)
