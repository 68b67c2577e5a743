"""`flint --help` and each command's help: whole summaries, PyTorch model files, exit codes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from flint.cli import main

COMMANDS = ("calibrate", "check", "extract", "graph", "inspect", "simulate", "sweep", "timeline", "validate")


def help_text(*args: str, columns: int) -> str:
    # Click's help formatter (through shutil) reads the terminal width from COLUMNS.
    result = CliRunner().invoke(main, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("columns", [50, 80, 200])
def test_every_command_summary_is_a_whole_sentence(columns):
    """Click cuts a summary that does not fit (`Check a trace directory against every rule
    ASTRA-sim depends...`); at 50 columns, its narrowest layout, it leaves 36 characters."""
    lines = help_text(columns=columns).split("Commands:\n", 1)[1].splitlines()
    summaries = dict(line.split(None, 1) for line in lines if line.strip())
    assert sorted(summaries) == sorted(COMMANDS) == sorted(main.commands)
    for command, summary in summaries.items():
        assert summary.endswith(".") and not summary.endswith("..."), (command, summary)
        # The summary is the first line of the command's own help, whole.
        assert help_text(command, columns=200).splitlines()[2].strip() == summary


def test_help_mentions_pytorch_model_files():
    group = " ".join(help_text(columns=80).split())
    assert "PyTorch" in group and "model()" in group and "example_inputs()" in group
    extract = " ".join(help_text("extract", columns=80).split())
    assert "workload(mesh)" in extract
    assert "PyTorch model defines `model()`" in extract and "`example_inputs()`" in extract
    assert "flint-traces[torch]" in extract
    assert "PyTorch" in help_text("validate", columns=80)


def test_group_help_lists_the_exit_codes():
    text = help_text(columns=80)
    codes = text.split("Exit codes:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in codes] == ["0", "1", "2", "130", "143"]
    assert "check" in codes[1] and "validate" in codes[1]
    assert "Ctrl-C" in codes[3] and "SIGTERM" in codes[4]
