"""Check a directory of Chakra traces against the contract ASTRA-sim relies on.

The rules come from ``chakra-contract.md``: each one guards against a trace that ASTRA-sim
misreads, hangs on, or aborts on. Ranks are read one at a time; only compact per-rank
summaries (collective digests, unpaired SEND/RECVs) outlive a rank, so large rank counts fit.
A file that repeats an already checked clean file but for valid per-rank values is recognised
by its bytes rather than decoded (`flint.trace.shapes`); every other file is checked in full.

A finding is an error where ASTRA-sim misreads, hangs or aborts, a warning where it runs the trace
anyway (other producers' habits: an empty metadata version, an integer `is_cpu_op`, a SEND without
`comm_src`); warnings alike are reported once, with how often they occur.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from multiprocessing import get_context
from pathlib import Path

from flint.schema import et_def_pb2 as pb
from flint.trace.errors import TraceFormatError
from flint.trace.framing import load_bytes
from flint.trace.matching import (
    CollectiveLedger,
    PointToPointLedger,
    describe_divergence,
    group_digests,
    group_sequence,
)
from flint.trace.node_rules import (
    ALL_RANKS,
    Collective,
    PointToPoint,
    RankContext,
    check_node,
)
from flint.trace.reader import (
    MANIFEST,
    RankTrace,
    TraceFiles,
    comm_groups_path,
    decode_trace,
    find_rank_files,
    manifest_ranks,
    parse_trace_name,
    per_class_ranks,
    read_comm_groups,
    read_manifest_leniently,
)
from flint.trace.shapes import Shapes, shape_of
from flint.trace.timing import COMPUTE_TYPES
from flint.trace.violation import WARNING, Violation

__all__ = ["RULES", "Violation", "check_rank_files", "check_traces"]

RULES: dict[str, str] = {
    "rank-files": "a file for every rank 0..N-1 (ASTRA-sim opens each one)",
    "framing": "every file decodes as length-delimited protobuf messages",
    "metadata-first": "the first message is a GlobalMetadata, with a version (else a warning)",
    "unique-ids": "node ids are unique within a file",
    "dep-exists": "every ctrl/data dependency names a node of the same file",
    "dep-cycle": "dependencies form no cycle (its nodes would never run)",
    "no-metadata-node": "no METADATA_NODE (aborts this simulator build)",
    "no-invalid-node": "no INVALID_NODE or unknown node type",
    "num-ops": "COMP nodes have an integer num_ops > 0",
    "tensor-size": "COMP and MEM nodes have an integer tensor_size > 0",
    "comm-type": "collectives have an integer comm_type that ASTRA-sim simulates",
    "broadcast-duration": "BROADCAST has duration_micros > 0 (it is replayed, not simulated)",
    "comm-size": "communication nodes have an integer comm_size > 0",
    "pg-name": "pg_name is a decimal string naming all ranks or a defined group",
    "group-member": "a rank only uses groups it belongs to",
    "group-file": "the comm-groups file is well formed (ids >= 1, >= 2 distinct in-range ranks)",
    "involved-dim": "involved_dim, when present, is a bool_list",
    "comm-peer": "SEND/RECV peers are integer ranks in range, one of them the file's rank "
                 "(a SEND's missing comm_src or a RECV's comm_dst is that rank: a warning)",
    "comm-tag": "SEND/RECV have an integer comm_tag that fits int32",
    "collective-match": "all members of a group issue the same collectives, sizes and order",
    "send-recv-match": "every SEND has exactly one RECV with the same peers, tag and size",
    "integer-types": "sizes and counts are never doubles or floats (std::bad_cast)",
    "is-cpu-op": "is_cpu_op, when present, is a bool (an integer is read as one: a warning), "
                 "never true on a communication node",
}


SHAPE_BYTES = 64 << 20
"""Memory for the shapes of clean files: hundreds of rank classes of 100,000-node files."""
PROGRESS_EVERY = 64
"""Rank files between two progress reports."""
READ_AHEAD = 128
"""Rank files the kernel is asked to read before they are checked."""


@dataclass(frozen=True)
class _RankScan:
    """A rank's findings plus its communication (None where a bad node makes it unknown): the
    digest of its collective sequence on each group (`matching.group_digests`), its SEND/RECVs."""

    violations: list[Violation]
    digests: dict[int, bytes] | None
    point_to_point: list[PointToPoint] | None


@dataclass(frozen=True)
class _FileCheck:
    """Every single-file rule applied to one decoded rank file: what broke, the nodes, and the
    communication (None where a bad node makes it unknown)."""

    violations: list[Violation]
    nodes: list[pb.Node]
    collectives: list[Collective] | None
    point_to_point: list[PointToPoint] | None

    @property
    def clean(self) -> bool:
        return not self.violations and None not in (self.collectives, self.point_to_point)

    def scan(self) -> _RankScan:
        digests = None if self.collectives is None else group_digests(self.collectives)
        return _RankScan(self.violations, digests, self.point_to_point)


def check_traces(
    directory: str | os.PathLike[str],
    prefix: str | None = None,
    num_ranks: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    groups_file: str | os.PathLike[str] | None = None,
    opened: TraceFiles | None = None,
) -> list[Violation]:
    """Every contract violation of one trace set, errors and warnings (no errors: ASTRA-sim can
    run it).

    ``num_ranks`` is the rank count ASTRA-sim will be configured with; without it, the count
    that the set's manifest.json records, else the highest rank found (which catches gaps but
    not a missing last rank). ``progress(done, total)`` hears how many rank files are checked.
    ``groups_file`` is the comm-groups file where it is not ``<prefix>.comm_groups.json``.
    ``opened`` is the set as a reader already opened it (`locate_traces`, every rank's file): its
    listing, manifest and groups are used rather than read again, and each file's bytes are left
    `held` in it for the reader, which reads it next.
    """
    directory = Path(directory)
    if opened is None:
        prefix, files = find_rank_files(directory, prefix)
        manifest, problem = read_manifest_leniently(directory, prefix)
        raw_groups = None
    else:
        prefix = opened.prefix
        files = {parse_trace_name(path)[1]: path for path in opened.paths}
        manifest, problem, raw_groups = opened.manifest, opened.manifest_problem, opened.groups
        groups_file = opened.groups_path
    num_ranks, expected, violations = _rank_count(directory, manifest, problem, files, num_ranks)
    if not violations and per_class_ranks(manifest, directory) and len(files) < num_ranks:
        violations.append(Violation("rank-files", None, None, PER_CLASS_SET))  # as `locate_traces` tells such a set
    else:
        violations += _rank_file_violations(prefix, files, num_ranks, expected)
    groups_file = comm_groups_path(directory, prefix, groups_file)
    groups, group_violations = _load_groups(groups_file, num_ranks, raw_groups)
    violations += group_violations
    label = groups_file.name if groups_file.exists() else f"{groups_file.name} (absent)"
    contexts = {rank: RankContext(rank, num_ranks, groups, label) for rank in files}

    collectives, point_to_point = CollectiveLedger(), PointToPointLedger()
    missing = set(range(num_ranks)) - set(files)
    coll_unknown, p2p_unknown = set(missing), set(missing)
    shapes = Shapes(SHAPE_BYTES)
    held = None if opened is None else opened.held
    for done, rank in enumerate(_read_ahead(files), 1):
        scan = _scan_known(shapes, files[rank], contexts[rank], held)
        if progress and (done % PROGRESS_EVERY == 0 or done == len(files)):
            progress(done, len(files))
        violations += scan.violations
        if scan.digests is None:
            coll_unknown.add(rank)
        else:
            collectives.add_rank(rank, scan.digests)
        if scan.point_to_point is None:
            p2p_unknown.add(rank)
        else:
            point_to_point.add_rank(rank, scan.point_to_point)

    members = {ALL_RANKS: range(num_ranks), **(groups or {})}
    checkable = {
        group: ranks
        for group, ranks in members.items()
        if all(rank in files and rank not in coll_unknown for rank in ranks)
    }
    violations += _collective_mismatches(collectives, checkable, files, contexts)
    violations += point_to_point.unmatched(p2p_unknown)
    return _fold_warnings(violations)


def contract_breach(files: TraceFiles) -> str | None:
    """What a reader says of an opened trace set (`locate_traces`, every rank's file) that breaks
    the contract: its errors' count, the first and the check that lists them all; None for one that
    keeps it. Each file is left `held` in the set for the reader."""
    errors = [v for v in check_traces(files.directory, opened=files) if v.is_error]
    if not errors:
        return None
    return (f"{files.directory} breaks the trace contract ({len(errors)} violations, first: {errors[0]}): "
            f"run `{files.check_command()}`")


PER_CLASS_SET = (
    "the set holds one file per rank class (flint extract --rank-files classes), which Flint's estimator "
    "reads; ASTRA-sim needs every rank's: extract again with --rank-files all"
)


def _fold_warnings(violations: list[Violation]) -> list[Violation]:
    """Each warning once, where it first occurs, counted: a producer's habit repeats on every
    node of every rank, where errors are each a fault of its own."""
    counts: dict[tuple[str, str], int] = {}
    for v in violations:
        if not v.is_error:
            counts[v.rule, v.message] = counts.get((v.rule, v.message), 0) + 1
    folded = []
    for v in violations:
        if v.is_error:
            folded.append(v)
        elif (v.rule, v.message) in counts:
            folded.append(replace(v, count=counts.pop((v.rule, v.message))))
    return folded


def check_rank_files(
    directory: str | os.PathLike[str], prefix: str, num_ranks: int, ranks: Iterable[int], workers: int = 1
) -> list[Violation]:
    """Every single-file rule for the files of ``ranks``, and the comm-groups file's rules.

    For a writer that makes many files from one template: checking some of them fully costs a
    fraction of reading every file back, and the cross-rank rules (collective and SEND/RECV
    matching) are left to the caller, who can derive them from what it wrote.

    With `workers` above one, the files are checked in that many processes: a pipelined trace's
    files hold millions of nodes, and checking them holds the GIL.
    """
    directory = Path(directory)
    groups_file = comm_groups_path(directory, prefix)
    groups, violations = _load_groups(groups_file, num_ranks)
    label = groups_file.name if groups_file.exists() else f"{groups_file.name} (absent)"
    ranks = sorted(set(ranks))
    setting = (directory, prefix, num_ranks, groups, label)
    if workers > 1 and len(ranks) > 1:  # spawned: the caller may run JAX's threads, which forking breaks
        with ProcessPoolExecutor(min(workers, len(ranks)), get_context("spawn"), _settle, (setting,)) as pool:
            for found in pool.map(_check_settled, ranks):
                violations += found
        return violations
    for rank in ranks:
        violations += _check_rank(setting, rank)
    return violations


def _check_rank(setting: tuple, rank: int) -> list[Violation]:
    """Every single-file rule on one rank's file; `setting`: where, how many ranks, which groups."""
    directory, prefix, num_ranks, groups, label = setting
    path = directory / f"{prefix}.{rank}.et"
    return _check_file(path, RankContext(rank, num_ranks, groups, label), _read(path)).violations


_settled: tuple = ()
"""A worker process's `setting`, given once when it starts (`_settle`) rather than with each rank."""


def _settle(setting: tuple) -> None:
    global _settled
    _settled = setting


def _check_settled(rank: int) -> list[Violation]:
    return _check_rank(_settled, rank)


def _rank_count(
    directory: Path, manifest: dict | None, problem: TraceFormatError | None, files: dict[int, Path],
    given: int | None,
) -> tuple[int, str, list[Violation]]:
    """How many ranks ASTRA-sim will run, what says so, and what is wrong with the manifest
    (`problem`: why it could not be read)."""
    if given is not None:
        return given, f"{given} ranks expected", []
    try:
        if problem is not None:
            raise problem
        recorded = None if manifest is None else manifest_ranks(manifest, directory)
    except TraceFormatError as exc:
        message = f"{exc}: fix or delete it (ranks are counted from the files meanwhile)"
        problem = Violation("rank-files", None, None, message)
        return max(files) + 1, "the highest rank file", [problem]
    if recorded is None:
        return max(files) + 1, "the highest rank file", []
    return recorded, f"{MANIFEST} records {recorded} ranks", []


def _rank_file_violations(
    prefix: str, files: dict[int, Path], num_ranks: int, expected: str
) -> list[Violation]:
    """Missing ranks, and files beyond the rank count (removed from ``files``)."""
    violations = [
        Violation("rank-files", rank, None, f"{prefix}.{rank}.et is missing ({expected})")
        for rank in range(num_ranks)
        if rank not in files
    ]
    for rank in sorted(rank for rank in files if rank >= num_ranks):
        message = f"{files.pop(rank).name} is beyond rank {num_ranks - 1} ({expected})"
        violations.append(Violation("rank-files", rank, None, message))
    return violations


def _read_ahead(files: dict[int, Path]) -> Iterator[int]:
    """The ranks of `files` in order, each once the kernel has been asked to read the files of
    the `READ_AHEAD` ranks after it: a disk serves many reads at once several times faster than
    one after another. (Reading in threads is slower where files are cached: checking holds the
    GIL.)"""
    ranks = sorted(files)
    for rank in ranks[:READ_AHEAD]:
        _will_need(files[rank])
    for index, rank in enumerate(ranks):
        if index + READ_AHEAD < len(ranks):
            _will_need(files[ranks[index + READ_AHEAD]])
        yield rank


def _will_need(path: Path) -> None:
    """Start reading a file into the page cache, where the system has a way to ask for it."""
    if not hasattr(os, "posix_fadvise"):
        return
    try:
        handle = os.open(path, os.O_RDONLY)
    except OSError:
        return  # reading it will report why
    try:
        os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(handle)


def _read(path: Path) -> bytes | Exception:
    """A file's bytes, or the error that kept them from being read."""
    try:
        return load_bytes(path)
    except (OSError, TraceFormatError) as exc:
        return exc


def _scan_known(
    shapes: Shapes, path: Path, ctx: RankContext, held: dict[Path, bytes | RankTrace] | None
) -> _RankScan:
    """A file of a known shape with valid values is clean; any other is checked in full, and
    becomes a known shape if it is clean. Its bytes go into `held`, where given."""
    loaded = _read(path)
    if held is not None and isinstance(loaded, bytes):
        held[path] = loaded
    known = shapes.match(loaded, ctx) if isinstance(loaded, bytes) else None
    if known is not None:
        return _RankScan([], *known)
    check = _check_file(path, ctx, loaded)
    if check.clean:  # so it was read
        shape = shape_of(loaded, check.nodes, check.collectives, check.point_to_point)
        if shape is not None:
            shapes.add(shape)
    return check.scan()


def _collective_mismatches(
    ledger: CollectiveLedger,
    members: dict[int, range | frozenset[int]],
    files: dict[int, Path],
    contexts: dict[int, RankContext],
) -> list[Violation]:
    """Pinpoint each divergent rank; ranks are re-read because only digests were kept."""
    violations = []
    for group, reference_rank, ranks in ledger.divergent(members):
        reference = group_sequence(_rescan(files, contexts, reference_rank), group)
        for rank in ranks:
            sequence = group_sequence(_rescan(files, contexts, rank), group)
            violations.append(
                describe_divergence(group, rank, sequence, reference_rank, reference)
            )
    return violations


def _rescan(
    files: dict[int, Path], contexts: dict[int, RankContext], rank: int
) -> list[Collective]:
    """A rank's collectives, read again (only after its digest disagreed)."""
    collectives = _check_file(files[rank], contexts[rank], _read(files[rank])).collectives
    assert collectives is not None, "only ranks with known collectives are compared"
    return collectives


def _check_file(path: Path, ctx: RankContext, loaded: bytes | Exception) -> _FileCheck:
    """Every single-file rule on a rank file, given its bytes (or the error that kept them from
    being read)."""
    decoded = _decode(loaded)
    if isinstance(decoded, Exception):
        failure = Violation("framing", ctx.rank, None, f"{path.name}: {decoded}")
        return _FileCheck([failure], [], None, None)
    metadata, nodes = decoded
    if metadata is None and not nodes:
        empty = Violation("metadata-first", ctx.rank, None, "the file is empty")
        return _FileCheck([empty], [], None, None)
    violations: list[Violation] = []
    if metadata is None:
        message = "first message is a Node, not GlobalMetadata; ASTRA-sim would swallow it"
        violations.append(Violation("metadata-first", ctx.rank, None, message))
    elif not metadata.version:
        message = "GlobalMetadata has an empty version, which ASTRA-sim does not read"
        violations.append(Violation("metadata-first", ctx.rank, None, message, WARNING))
    violations += _dependency_violations(ctx.rank, nodes)
    collectives: list[Collective] | None = []
    point_to_point: list[PointToPoint] | None = []
    clean_kernels: set[tuple] = set()
    for node in nodes:
        kernel = _kernel_key(node)
        if kernel in clean_kernels:
            continue
        check = check_node(node, ctx)
        if kernel is not None and not check.violations:
            clean_kernels.add(kernel)
        violations += check.violations
        if node.type == pb.COMM_COLL_NODE and not check.trusted:
            collectives = None
        elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE) and not check.trusted:
            point_to_point = None
        elif isinstance(check.comm, Collective) and collectives is not None:
            collectives.append(check.comm)
        elif isinstance(check.comm, PointToPoint) and point_to_point is not None:
            point_to_point.append(check.comm)
    return _FileCheck(violations, nodes, collectives, point_to_point)


def _kernel_key(node: pb.Node) -> tuple | None:
    """What the rules see of a compute or memory node: its type and attributes (not its id, name,
    dependencies or duration). A pipelined trace repeats each kernel in every microbatch's copy,
    so a file's nodes of one key are checked once while they are clean; None for communication,
    whose rules also read the rank's groups and feed the cross-rank matching."""
    if node.type not in COMPUTE_TYPES:
        return None
    return (node.type, *(attr.SerializeToString() for attr in node.attr))


def _decode(
    loaded: bytes | Exception,
) -> tuple[pb.GlobalMetadata | None, list[pb.Node]] | Exception:
    """A file's metadata and nodes, or why it could not be read or decoded."""
    if isinstance(loaded, Exception):
        return loaded
    try:
        return decode_trace(loaded)
    except TraceFormatError as exc:
        return exc


def _dependency_violations(rank: int, nodes: list[pb.Node]) -> list[Violation]:
    violations: list[Violation] = []
    position: dict[int, int] = {}
    for index, node in enumerate(nodes):
        if node.id in position:
            message = f"node id {node.id} appears more than once"
            violations.append(Violation("unique-ids", rank, node.id, message))
        else:
            position[node.id] = index
    forward = True  # every dependency comes earlier in the file, as a writer in program order puts it
    for index, node in enumerate(nodes):
        for kind, ids in (("ctrl", node.ctrl_deps), ("data", node.data_deps)):
            for dep in ids:
                at = position.get(dep)
                if at is None:
                    message = f"{kind} dependency {dep} does not exist"
                    violations.append(Violation("dep-exists", rank, node.id, message))
                elif at >= index:
                    forward = False
    if not forward and len(position) == len(nodes):  # with duplicate ids the graph itself is ambiguous
        cyclic, blocked = _find_cycle({node.id: {*node.ctrl_deps, *node.data_deps} for node in nodes})
        if cyclic is not None:
            message = f"node is on a dependency cycle; {blocked} nodes can never run"
            violations.append(Violation("dep-cycle", rank, cyclic, message))
    return violations


def _find_cycle(deps: dict[int, set[int]]) -> tuple[int | None, int]:
    """(a node on a cycle or None, how many nodes the cycles block), by Kahn's algorithm."""
    known = {node: {d for d in node_deps if d in deps} for node, node_deps in deps.items()}
    waiting = {node: len(node_deps) for node, node_deps in known.items()}
    dependents: dict[int, list[int]] = defaultdict(list)
    for node, node_deps in known.items():
        for dep in node_deps:
            dependents[dep].append(node)
    ready = [node for node, count in waiting.items() if count == 0]
    while ready:
        for dependent in dependents[ready.pop()]:
            waiting[dependent] -= 1
            if waiting[dependent] == 0:
                ready.append(dependent)
    blocked = {node for node, count in waiting.items() if count}
    if not blocked:
        return None, 0
    # Every blocked node waits on another blocked node, so walking back must revisit one.
    node, seen = min(blocked), set()
    while node not in seen:
        seen.add(node)
        node = min(known[node] & blocked)
    return node, len(blocked)


def _load_groups(
    path: Path, num_ranks: int, raw: dict[int, tuple[int, ...]] | None = None
) -> tuple[dict[int, frozenset[int]] | None, list[Violation]]:
    """The groups of a comm-groups file (None if unreadable), and what is wrong with it; `raw`
    is the file as a reader already read it."""
    if not path.exists():
        return {}, []
    violations: list[Violation] = []

    def fail(message: str) -> None:
        violations.append(Violation("group-file", None, None, f"{path.name}: {message}"))

    if "empty" in path.name:
        fail("ASTRA-sim ignores comm-group files whose path contains 'empty'")
    if raw is None:
        try:
            raw = read_comm_groups(path)
        except TraceFormatError as exc:
            violations.append(Violation("group-file", None, None, str(exc)))
            return None, violations
    groups: dict[int, frozenset[int]] = {}
    for group, ranks in sorted(raw.items()):
        if group == ALL_RANKS:
            fail('group id "0" is rejected by ASTRA-sim (pg_name "0" already means all ranks)')
            continue
        members = frozenset(ranks)
        if len(members) != len(ranks):
            fail(f"group {group} lists a rank more than once")
        if len(members) < 2:
            fail(f"group {group} has fewer than two ranks; a collective on it needs no group")
        outside = sorted(rank for rank in members if not 0 <= rank < num_ranks)
        if outside:
            fail(f"group {group} has ranks {outside} outside 0..{num_ranks - 1}")
        groups[group] = members
    return groups, violations
