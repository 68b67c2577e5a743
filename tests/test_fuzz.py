"""Mutated traces get an answer from every reading command, never a traceback.

Seeded random mutations of two small traces: a real one (`examples/mlp.py` on a 2x4 mesh: COMP nodes
and all-reduces over two kinds of group) and the hand-built one of the contract tests (SEND/RECV, MEM
nodes, BROADCAST). A mutation hits one rank file (bit flips, a truncation, inserted or deleted bytes,
an out-of-range node type or comm_type, an attribute of the wrong kind, a huge length prefix) or the
group or manifest file (bytes flipped or removed). Each mutated trace goes through `inspect`, `check`, `timeline` and `graph`
in-process; every outcome must be exit 0, exit 1 (only `check`, which found problems) or exit 2 with
one line on stderr. Case `i` uses `random.Random(i)`, so a failure names the case that reproduces it.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_trace_contract import valid_trace

from flint.cli import main
from flint.schema import et_def_pb2 as pb
from flint.trace.framing import encode_delimited, iter_delimited

CASES = {"mlp": 200, "hand-built": 100}
HUGE = (2**31, 2**32 - 1, 2**40, 2**63)
"""Length prefixes and enum values far beyond what a file or the schema holds."""


def flip_bits(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def insert_bytes(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.randbytes(rng.randint(1, 8)) + data[at:]


def delete_bytes(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 8) :]


def _messages(data: bytes) -> tuple[bytes, list[pb.Node]]:
    """The metadata message and the nodes of an intact rank file."""
    metadata, *nodes = iter_delimited(data)
    return metadata, [pb.Node.FromString(node) for node in nodes]


def _frame(metadata: bytes, nodes: list[pb.Node]) -> bytes:
    return encode_delimited(metadata) + b"".join(encode_delimited(n.SerializeToString()) for n in nodes)


def bad_node_type(data: bytes, rng: random.Random) -> bytes:
    metadata, nodes = _messages(data)
    rng.choice(nodes).type = rng.choice([8, 82, 2**31 - 1, -1])
    return _frame(metadata, nodes)


def bad_comm_type(data: bytes, rng: random.Random) -> bytes:
    metadata, nodes = _messages(data)
    collectives = [n for n in nodes if n.type == pb.COMM_COLL_NODE]
    attr = next(a for a in rng.choice(collectives).attr if a.name == "comm_type")
    attr.int64_val = rng.choice([10, 82, -1, 2**62])
    return _frame(metadata, nodes)


def varint(value: int) -> bytes:
    """Protobuf's varint, written out here because framing's refuses what does not fit 32 bits."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    return bytes(out + bytes([value]))


def wrong_kind(data: bytes, rng: random.Random) -> bytes:
    """An attribute's value replaced by one of another kind: text, a double, a list."""
    metadata, nodes = _messages(data)
    attr = rng.choice([a for n in nodes for a in n.attr])
    value = rng.choice([("string_val", "x"), ("double_val", 1.5), ("int64_list", [1, 2])])
    name = attr.name
    attr.Clear()
    attr.name = name
    if value[0].endswith("_list"):
        getattr(attr, value[0]).values.extend(value[1])
    else:
        setattr(attr, *value)
    return _frame(metadata, nodes)


def huge_length(data: bytes, rng: random.Random) -> bytes:
    """One message's length prefix replaced by a huge varint (over 32 bits for some)."""
    framed = [encode_delimited(m) for m in iter_delimited(data)]
    index = rng.randrange(len(framed))
    framed[index] = varint(rng.choice(HUGE)) + list(iter_delimited(framed[index]))[0]
    return b"".join(framed)


RANK_MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [
    flip_bits, truncate, insert_bytes, delete_bytes, bad_node_type, bad_comm_type, wrong_kind,
    huge_length,
]
FILE_MUTATIONS = [flip_bits, truncate, delete_bytes]


@pytest.fixture(scope="module")
def clean(mlp_traces, tmp_path_factory) -> dict[str, Path]:
    """The two traces the mutations start from."""
    hand_built = valid_trace().write(tmp_path_factory.mktemp("hand-built"))
    return {"mlp": mlp_traces("2x4"), "hand-built": hand_built}


def mutate(source: Path, target: Path, rng: random.Random) -> tuple[int, str]:
    """Copy `source` to `target` with one file mutated; (a rank to draw, what was done)."""
    shutil.copytree(source, target)
    ranks = sorted(target.glob("*.et"), key=lambda p: int(p.name.split(".")[-2]))
    rank = rng.randrange(len(ranks))
    others = sorted(p for p in target.iterdir() if p.suffix == ".json" and "graph" not in p.name)
    if rng.random() < 0.15 and others:
        path, mutation = rng.choice(others), rng.choice(FILE_MUTATIONS)
    else:
        path, mutation = ranks[rank], rng.choice(RANK_MUTATIONS)
    path.write_bytes(mutation(path.read_bytes(), rng))
    return rank, f"{mutation.__name__} of {path.name}"


def problem(command: str, result: Result) -> str | None:
    """What is wrong with a command's outcome, or None."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        return f"traceback: {type(result.exception).__name__}: {result.exception}"
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        return None if len(lines) == 1 else f"exit 2 with {len(lines)} lines on stderr: {lines[:3]}"
    if result.exit_code == 0 or (result.exit_code == 1 and command == "check"):
        return None
    return f"exit {result.exit_code}"


@pytest.mark.parametrize("trace", list(CASES))
def test_mutated_traces_never_crash_a_command(clean, tmp_path: Path, trace: str) -> None:
    runner = CliRunner()
    failures = []
    for case in range(CASES[trace]):
        directory = tmp_path / f"case{case}"
        rank, what = mutate(clean[trace], directory, random.Random(case))
        commands = {
            "inspect": ["inspect", directory],
            "check": ["check", directory],
            "timeline": ["timeline", directory, "-o", tmp_path / "t.json"],
            "graph": ["graph", directory, "--rank", rank, "-o", tmp_path / "g.dot"],
        }
        for command, args in commands.items():
            found = problem(command, runner.invoke(main, [str(a) for a in args]))
            if found:
                failures.append(f"case {case} ({what}), {command}: {found}")
        shutil.rmtree(directory)
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)
