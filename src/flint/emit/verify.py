"""The trace contract, checked at extraction time at any rank count.

Reading every file back costs as much as writing it, so the files are not all re-read (`flint check`
does that). Instead:

- the first and the last rank of every rank class are read back and checked with every single-file
  rule: all ranks of a class are rendered from one template, these two with different group ids;
- every rank's file must exist (one per class's, for a set of one file per class);
- the cross-rank rules follow from what the files were rendered from, checked against the
  communicator-group file as written: for each collective, the ranks that name a group in their
  files are exactly that group's members (`group-member`, `collective-match`), and each
  point-to-point transfer's pairs give every SEND exactly one RECV (`send-recv-match`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from flint.emit.chakra import ChakraEmitter
from flint.trace.contract import check_rank_files
from flint.trace.reader import comm_groups_path, read_comm_groups
from flint.trace.violation import Violation

CHECK_APART_BYTES = 2**26
"""Sampled files of more bytes than this are checked in a process per core (a pipelined trace's
run to gigabytes); below it, starting the processes would cost more than it saves."""


def check_emitted(
    directory: Path, prefix: str, emitter: ChakraEmitter, one_per_class: bool = False
) -> list[Violation]:
    """Every contract violation found in the trace `emitter` wrote into `directory` (with
    `one_per_class`: each class's first rank's file only)."""
    classes = emitter.classes
    num_ranks = emitter.plan.num_ranks
    written = classes.first_ranks() if one_per_class else range(num_ranks)
    sample = set(classes.first_ranks()) | (set() if one_per_class else set(classes.last_ranks()))
    sampled = sum(os.path.getsize(directory / f"{prefix}.{rank}.et") for rank in sample
                  if os.path.exists(directory / f"{prefix}.{rank}.et"))
    workers = len(os.sched_getaffinity(0)) if sampled > CHECK_APART_BYTES else 1
    violations = check_rank_files(directory, prefix, num_ranks, sample, workers)
    violations += _missing_files(directory, prefix, written)
    written = read_comm_groups(comm_groups_path(directory, prefix))
    violations += _group_use(emitter, written)
    violations += _pair_violations(emitter)
    return violations


def _missing_files(directory: Path, prefix: str, ranks) -> list[Violation]:
    names = set(os.listdir(directory))
    return [
        Violation("rank-files", rank, None, f"{prefix}.{rank}.et is missing")
        for rank in ranks
        if f"{prefix}.{rank}.et" not in names
    ]


def _group_use(emitter: ChakraEmitter, written: dict[int, tuple[int, ...]]) -> list[Violation]:
    """Ranks naming each group, per collective partition, against the group's written members."""
    violations = []
    for partition, node in enumerate(emitter.groups.first_node):
        named = emitter.groups.ids_of_rank[:, partition]
        order = np.argsort(named, kind="stable")
        ids, starts = np.unique(named[order], return_index=True)
        for gid, ranks in zip(ids.tolist(), np.split(order, starts[1:])):
            if gid == 0:
                continue  # ranks of other pipeline stages, which do not run the node
            members = np.sort(np.asarray(written.get(gid, ()), dtype=np.int64))
            if np.array_equal(ranks, members):
                continue
            outside = np.setdiff1d(ranks, members)
            if len(outside):
                message = f"rank {outside[0]} names group {gid} but is not a member"
                violations.append(Violation("group-member", int(outside[0]), node, message))
            silent = np.setdiff1d(members, ranks)
            if len(silent):
                message = f"member {silent[0]} of group {gid} does not issue node {node} on it"
                violations.append(Violation("collective-match", int(silent[0]), node, message))
    return violations


def _pair_violations(emitter: ChakraEmitter) -> list[Violation]:
    """A permute whose pairs repeat a source or target leaves a SEND or RECV without its match."""
    violations = []
    num_ranks = emitter.plan.num_ranks
    for node, pairs in emitter.plan.pair_sets():
        pairs = np.asarray(pairs, dtype=np.int64)
        for side, column in (("source", pairs[:, 0]), ("target", pairs[:, 1])):
            ranks, counts = np.unique(column, return_counts=True)
            if (counts > 1).any():
                rank = int(ranks[counts > 1][0])
                message = f"rank {rank} is a {side} of node {node} more than once"
                violations.append(Violation("send-recv-match", rank, node, message))
        bad = (pairs[:, 0] == pairs[:, 1]) | (pairs < 0).any(axis=1) | (pairs >= num_ranks).any(axis=1)
        if bad.any():
            src, dst = pairs[bad][0].tolist()
            message = f"pair {src}->{dst} of node {node} is not two distinct ranks in range"
            violations.append(Violation("comm-peer", None, node, message))
    return violations
