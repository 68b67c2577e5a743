"""Cross-rank rules: collectives agree within each group, and every SEND meets one RECV.

Ranks are streamed one at a time, so per (group, rank) only a digest of the collective
sequence is kept, and for point-to-point only the operations still waiting for a partner.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping

from flint.schema import et_def_pb2 as pb
from flint.trace.node_rules import ALL_RANKS, Collective, PointToPoint
from flint.trace.violation import Violation

_DIGEST_BYTES = 16


def record(op: Collective) -> bytes:
    """What the members of a group must agree on for one collective: its type and size."""
    return struct.pack("<QQ", op.comm_type, op.comm_size)


def sequence_digest(records: Iterable[bytes]) -> bytes:
    """The digest of one rank's sequence of collective `record`s on one group."""
    hasher = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for item in records:
        hasher.update(item)
    return hasher.digest()


_EMPTY_DIGEST = sequence_digest(())


def group_digests(collectives: list[Collective]) -> dict[int, bytes]:
    """The digest of a rank's collective sequence on each group it uses."""
    return {
        group: sequence_digest(map(record, group_sequence(collectives, group)))
        for group in {op.group for op in collectives}
    }


def group_sequence(collectives: Iterable[Collective], group: int) -> list[Collective]:
    """A rank's collectives on one group in the order ASTRA-sim matches them: by node id."""
    return sorted((op for op in collectives if op.group == group), key=lambda op: op.node_id)


class CollectiveLedger:
    """Digests of each rank's (comm_type, comm_size) sequence per communicator group."""

    def __init__(self) -> None:
        self._digests: dict[int, dict[int, bytes]] = {}

    def add_rank(self, rank: int, digests: dict[int, bytes]) -> None:
        """Record a rank's `group_digests`."""
        for group, digest in digests.items():
            self._digests.setdefault(group, {})[rank] = digest

    def divergent(
        self, members: Mapping[int, Collection[int]]
    ) -> Iterator[tuple[int, int, list[int]]]:
        """Yield (group, reference rank, members that differ from it) per mismatched group.

        The reference is the sequence most members share (ties: lowest rank), so a single
        faulty rank is the one reported.
        """
        for group in sorted(members):
            ranks = sorted(members[group])
            known = self._digests.get(group, {})
            digests = {rank: known.get(rank, _EMPTY_DIGEST) for rank in ranks}
            counts = Counter(digests.values())
            if len(counts) < 2:
                continue
            top = max(counts.values())
            reference = next(rank for rank in ranks if counts[digests[rank]] == top)
            yield group, reference, [r for r in ranks if digests[r] != digests[reference]]


def describe_divergence(
    group: int,
    rank: int,
    sequence: list[Collective],
    reference_rank: int,
    reference: list[Collective],
) -> Violation:
    """Locate the first collective where ``rank`` departs from the reference rank."""
    index = next(
        (
            i
            for i, (mine, theirs) in enumerate(zip(sequence, reference))
            if (mine.comm_type, mine.comm_size) != (theirs.comm_type, theirs.comm_size)
        ),
        min(len(sequence), len(reference)),
    )
    group_name = "the all-ranks group" if group == ALL_RANKS else f"group {group}"
    where = f"collective #{index} of {group_name}"
    if index < len(sequence) and index < len(reference):
        mine, theirs = sequence[index], reference[index]
        message = (
            f"{where} is {_describe(mine)}, but rank {reference_rank} issues "
            f"{_describe(theirs)} (node {theirs.node_id})"
        )
        return Violation("collective-match", rank, mine.node_id, message)
    if index < len(reference):
        theirs = reference[index]
        message = (
            f"{where} is missing: rank {reference_rank} issues {_describe(theirs)} "
            f"(node {theirs.node_id}); {len(sequence)} vs {len(reference)} collectives"
        )
        return Violation("collective-match", rank, None, message)
    mine = sequence[index]
    message = f"{where} ({_describe(mine)}) is not issued by rank {reference_rank}"
    return Violation("collective-match", rank, mine.node_id, message)


def _describe(op: Collective) -> str:
    return f"{pb.CollectiveCommType.Name(op.comm_type)} of {op.comm_size} bytes"


class PointToPointLedger:
    """SEND/RECV operations not yet paired, keyed by (src, dst, tag, size).

    Each key holds [balance, rank, node id]: the balance is SENDs minus RECVs and the rank
    and node are those of the operation that opened the entry, which is on the side in
    excess because the balance moves one step at a time and the entry closes at zero.
    """

    def __init__(self) -> None:
        self._open: dict[tuple[int, int, int, int], list[int]] = {}

    def add_rank(self, rank: int, operations: list[PointToPoint]) -> None:
        for op in operations:
            key = (op.src, op.dst, op.tag, op.size)
            step = 1 if op.is_send else -1
            entry = self._open.get(key)
            if entry is None:
                self._open[key] = [step, rank, op.node_id]
                continue
            entry[0] += step
            if entry[0] == 0:
                del self._open[key]

    def unmatched(self, unverifiable: Collection[int]) -> Iterator[Violation]:
        """Report open entries, except those touching a rank whose operations are unknown."""
        for (src, dst, tag, size), (balance, rank, node_id) in sorted(self._open.items()):
            if src in unverifiable or dst in unverifiable:
                continue
            if balance > 0:
                message = (
                    f"{balance} SEND(s) to rank {dst} (tag {tag}, {size} bytes) "
                    f"lack a matching RECV on rank {dst}"
                )
            else:
                message = (
                    f"{-balance} RECV(s) from rank {src} (tag {tag}, {size} bytes) "
                    f"lack a matching SEND on rank {src}"
                )
            yield Violation("send-recv-match", rank, node_id, message)
