"""The ``specbench`` command: its verbs listed, each verb's own help, a misspelt verb answered in one line with
the nearest verb, and ``python -m specbench`` the same command where nothing is installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from specbench.cli import VERBS, main


def test_help_lists_every_verb(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    assert all(f"  {verb} " in out for verb in VERBS) and "python run.py" in out


def test_a_misspelt_verb_is_answered_with_the_nearest(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["datastor", "info"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err and "did you mean 'datastore'?" in err


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_verb_has_its_own_help(verb, capsys):
    with pytest.raises(SystemExit) as stop:
        main([verb, "--help"])
    assert stop.value.code == 0 and f"specbench {verb}" in capsys.readouterr().out


def test_python_dash_m_runs_the_same_command():
    out = subprocess.run([sys.executable, "-m", "specbench", "--help"], capture_output=True, text=True, check=True)
    assert all(verb in out.stdout for verb in VERBS)
