"""specbench entry point: ``python run.py [group=choice ...] [key=value ...]`` (``--help`` lists them)."""

import sys

import hydra
from omegaconf import DictConfig

from specbench.errors import one_line_errors
from specbench.run.config import check_overrides


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> dict:
    from specbench.run.jobs import run_job

    return run_job(cfg)  # in a sweep a failed job is recorded and the others go on


if __name__ == "__main__":
    with one_line_errors():
        sys.argv[1:] = check_overrides(sys.argv[1:])
    main()
