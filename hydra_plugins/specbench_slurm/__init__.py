"""Hydra finds launchers only in the ``hydra_plugins`` namespace: this one is :mod:`specbench.run.slurm`'s.

Hydra imports every plugin at start-up; without the ``slurm`` extra (submitit) there is nothing to define.
"""

try:
    from specbench.run.slurm import SurvivingSlurmLauncher
except ImportError:  # pip install -e ".[slurm]" for hydra/launcher=slurm
    SurvivingSlurmLauncher = None

if SurvivingSlurmLauncher is not None:

    class SlurmLauncher(SurvivingSlurmLauncher):
        """``hydra/launcher=slurm``: the submitit SLURM launcher whose sweep outlives any one task."""
