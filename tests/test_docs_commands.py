"""Every `flint ...` command that README.md and docs/*.md show stays true.

Each command is collected from the fenced code blocks (a line starting with `flint`, `$ flint` or
`.venv/bin/flint`, or such a part of a `&&` chain, with backslash continuations joined) and from
inline code spans that start with `flint <command>`. Every one is parsed against the command line
itself (`flint.cli.main`): the command exists, every option it uses exists on that command, it
gives no more positional arguments than the command takes, and the files it names under
`examples/`, `tests/models/` and `bench/` exist; so a renamed option or a moved example breaks this
test. A handful of fast ones (the bundled MLP extracted, and inspect/check/timeline/graph read
back) run as written in a temporary directory prepared as the README's first command prepares
the repository; the slow ones (big meshes, large models, ASTRA-sim, sweeps, calibration) are only
parsed.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from flint.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FLINT = Path(sys.executable).with_name("flint")
# the README's first command, after its set-up
PREPARE = "flint extract examples/mlp.py --mesh 8x8 -o traces/mlp --force"
# commands that run for real: reading back the prepared MLP trace, and extracting the MLP
READERS = {"inspect", "check", "timeline", "graph"}
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`]+)`")
PLACEHOLDER = re.compile(r"[\[\]|]|\.\.\.|…|\b[A-Z][A-Z_]+\b")
REPO_PATH = re.compile(r"^(examples|tests/models|bench)/")


def _commands_in(text: str) -> list[tuple[str, bool]]:
    """(command, shown as a whole command) pairs, in order; placeholders make a synopsis."""
    found: list[tuple[str, bool]] = []
    for lang, body in FENCE.findall(text):
        if lang.strip() in ("python", "toml", "text"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            for part in line.split("&&"):
                part = part.strip()
                part = re.sub(r"^\.venv/bin/flint ", "flint ", part)
                if part.startswith("flint "):
                    command = re.sub(r"\s+#.*$", "", part).strip()
                    found.append((command, not PLACEHOLDER.search(command)))
    for span in INLINE.findall(FENCE.sub("", text)):
        command = re.sub(r"^/usr/bin/time -v ", "", " ".join(span.split()))
        words = command.split()
        if len(words) >= 2 and words[0] == "flint" and words[1] in main.commands:
            found.append((command, len(words) > 2 and not PLACEHOLDER.search(command)))
    return found


def _all_commands() -> list[tuple[str, str, bool]]:
    seen: dict[str, tuple[str, str, bool]] = {}
    for page in PAGES:
        for command, whole in _commands_in(page.read_text()):
            seen.setdefault(command, (page.relative_to(ROOT).as_posix(), command, whole))
    return list(seen.values())


COMMANDS = _all_commands()


def _options(command: click.Command) -> dict[str, click.Option]:
    return {opt: p for p in command.params if isinstance(p, click.Option) for opt in (*p.opts, *p.secondary_opts)}


def _parse(command_line: str) -> tuple[click.Command, list[str], dict[str, str]]:
    """The click command, its positional arguments and its options, or an AssertionError."""
    words = [w.strip("[]") for w in shlex.split(command_line)]
    assert words[0] == "flint", command_line
    words = words[1:]
    while words and words[0] in _options(main):
        words = words[1:]
    if words == ["--help"] or words == ["-h"]:
        return main, [], {"--help": ""}
    assert words and words[0] in main.commands, f"{command_line!r}: no command {words[:1]}"
    command = main.commands[words[0]]
    options = _options(command)
    positional: list[str] = []
    given: dict[str, str] = {}
    rest = words[1:]
    while rest:
        word = rest.pop(0)
        if word.startswith("-") and word != "-" and not re.fullmatch(r"-[0-9.]+", word):
            name, _, value = word.partition("=")
            if name in ("--help", "-h"):
                given[name] = ""
                continue
            assert name in options, f"{command_line!r}: flint {command.name} has no option {name}"
            param = options[name]
            if not param.is_flag and not param.count and not value:
                assert rest, f"{command_line!r}: {name} needs a value"
                value = rest.pop(0)
            given[name] = value
        elif word:
            positional.append(word)
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    takes = float("inf") if any(p.nargs == -1 for p in arguments) else sum(p.nargs for p in arguments)
    assert len(positional) <= takes, f"{command_line!r}: {len(positional)} arguments, flint {command.name} takes {takes}"
    for word in (*positional, *given.values()):
        if REPO_PATH.match(word) and not PLACEHOLDER.search(word):
            assert (ROOT / word).exists(), f"{command_line!r}: {word} does not exist"
    return command, positional, given


def _runs(command_line: str, whole: bool) -> bool:
    """Fast enough to run for real: the MLP extracted, the prepared MLP trace read back, --help."""
    if not whole:
        return False
    command, positional, given = _parse(command_line)
    if "--help" in given or "-h" in given:
        return True
    if command.name == "extract":
        return positional == ["examples/mlp.py"] and given.get("--backend", "cpu") == "cpu" and "--dump-ir" not in given
    return command.name in READERS and all(p.rstrip("/").startswith("traces/mlp") for p in positional) and all(
        not p.startswith("traces/mlp-") for p in positional)


def test_the_pages_show_commands():
    """The collection finds the manual's commands (a change in how pages write them shows here)."""
    assert len(COMMANDS) > 50
    shown = {c for _, c, _ in COMMANDS}
    assert PREPARE in shown
    assert "flint simulate traces/mlp" in shown
    assert "flint sweep examples/sweep-mlp.toml -o traces/sweep-mlp --jobs 2" in shown
    assert sum(_runs(c, w) for _, c, w in COMMANDS) >= 5


@pytest.mark.parametrize("page,command_line,whole", COMMANDS, ids=[c for _, c, _ in COMMANDS])
def test_command_parses(page, command_line, whole):
    _parse(command_line)


def test_a_renamed_option_is_caught():
    with pytest.raises(AssertionError, match="no option --meshes"):
        _parse("flint extract examples/mlp.py --meshes 8x8 -o traces/mlp")
    with pytest.raises(AssertionError, match="does not exist"):
        _parse("flint extract examples/no_such_model.py --mesh 8x8 -o traces/x")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory like the repository after the README's first command: traces/mlp extracted."""
    work = tmp_path_factory.mktemp("docs")
    for name in ("examples", "tests", "bench"):
        (work / name).symlink_to(ROOT / name)
    (work / "traces").mkdir()
    _run(work, PREPARE)
    return work


def _run(work: Path, command_line: str) -> None:
    env = dict(os.environ, COLUMNS="120", MPLBACKEND="Agg")
    words = shlex.split(command_line)
    result = subprocess.run([str(FLINT), *words[1:]], cwd=work, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, f"{command_line!r} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"


RUN = [(page, c) for page, c, w in COMMANDS if _runs(c, w)]


@pytest.mark.parametrize("page,command_line", RUN, ids=[c for _, c in RUN])
def test_command_runs(workdir, page, command_line):
    if "--plot" in command_line:
        pytest.importorskip("matplotlib")
    _run(workdir, command_line)


def test_the_site_home_is_the_readme():
    """docs/index.md is README.md with the links into docs/ made relative to it."""
    readme = (ROOT / "README.md").read_text().replace("](docs/", "](")
    index = (ROOT / "docs" / "index.md").read_text()
    assert index.split("\n\n", 1)[1] == readme


def test_docs_pages_are_in_the_site():
    """Every page of docs/ is in mkdocs.yml's nav, and every page the nav names exists."""
    nav = re.findall(r":\s*([\w-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert sorted(nav) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))


def test_ci_runs_the_readme_test_command():
    """`.ci/run` sets up and tests with the README's second command, character for character."""
    readme = (ROOT / "README.md").read_text()
    command = readme.split("# set up and run the tests\n", 1)[1].split("\n", 1)[0]
    assert command.startswith("python3 -m venv .venv && ") and command.endswith("pytest -q")
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_manual_builds_without_a_warning(tmp_path):
    """`mkdocs build --strict` fails on a broken link or anchor, or a page left out of the nav."""
    pytest.importorskip("mkdocs", reason="needs the manual's site builder (flint-traces[docs])")
    built = subprocess.run(
        [str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "--quiet", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr
