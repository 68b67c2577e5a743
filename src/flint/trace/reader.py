"""Read Chakra execution traces: per-rank ``.et`` files and the comm-groups JSON file.

Anything ASTRA-sim reads is read, whoever wrote it: a GlobalMetadata without a version, a group
file under another name than Flint's (`groups_file`), a SEND without `comm_src` or a RECV without
`comm_dst` (ASTRA-sim takes the file's own rank: `transfer_peers`). Only what ASTRA-sim would
misread is refused here: a file whose first message is not a GlobalMetadata. `flint.trace.contract`
tells apart what ASTRA-sim tolerates (warnings) from what breaks it (errors).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import DecodeError, Message

from flint.schema import et_def_pb2
from flint.trace.errors import GroupsFileError, TraceFormatError, TraceLookupError
from flint.trace.framing import iter_delimited, load_bytes

_Message = TypeVar("_Message", bound=Message)
_TRACE_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<rank>[0-9]+)\.et(?:\.gz)?$")
GROUP_ID_DIGITS = 18
"""Group ids are decimal strings of at most this many digits, so that they fit 64 bits."""
_GROUP_ID = re.compile(rf"[0-9]{{1,{GROUP_ID_DIGITS}}}")
MANIFEST = "manifest.json"
RANK_FILES, ALL_RANK_FILES, ONE_PER_CLASS = "rank_files", "all", "classes"
"""The manifest key that says which rank files a set holds: every rank's (the Chakra trace ASTRA-sim
runs), or one per rank class (`flint extract --rank-files classes`), which Flint's estimator reads."""
RANK_FILE_CHOICES = (ALL_RANK_FILES, ONE_PER_CLASS)
INTEGER_KINDS = frozenset(
    f"{kind}_val"
    for kind in (
        "int32", "int64", "uint32", "uint64", "sint32", "sint64",
        "fixed32", "fixed64", "sfixed32", "sfixed64",
    )
)
_LIST_KINDS = frozenset(
    field.name
    for field in et_def_pb2.AttributeProto.DESCRIPTOR.oneofs_by_name["value"].fields
    if field.message_type is not None
)


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace, decoded in full."""

    path: Path
    rank: int
    metadata: et_def_pb2.GlobalMetadata
    nodes: list[et_def_pb2.Node]


def parse_trace_name(path: str | os.PathLike[str]) -> tuple[str, int] | None:
    """Split ``<prefix>.<rank>.et[.gz]`` into (prefix, rank); None for any other file name."""
    match = _TRACE_NAME.match(Path(path).name)
    return (match["prefix"], int(match["rank"])) if match else None


def decode_trace(
    buf: bytes,
) -> tuple[et_def_pb2.GlobalMetadata | None, list[et_def_pb2.Node]]:
    """Decode a framed trace leniently, for callers that report problems rather than stop.

    Metadata is None when the first message is a Node (recognised by its type: a
    GlobalMetadata never sets Node's field 3), which is then kept as the first node, as its
    writer intended. A versionless GlobalMetadata is returned as is for the caller to judge.
    """
    messages = iter_delimited(buf)
    first = next(messages, None)
    if first is None:
        return None, []
    metadata, first_node = _classify_first(first)
    nodes = [] if first_node is None else [first_node]
    nodes.extend(_parse(et_def_pb2.Node, data, index) for index, data in enumerate(messages, 1))
    return metadata, nodes


def _classify_first(
    data: bytes,
) -> tuple[et_def_pb2.GlobalMetadata | None, et_def_pb2.Node | None]:
    try:
        node = _parse(et_def_pb2.Node, data, 0)
    except TraceFormatError:
        node = None
    if node is not None and node.type != et_def_pb2.INVALID_NODE:
        return None, node
    return _parse(et_def_pb2.GlobalMetadata, data, 0), None


def _parse(message_type: type[_Message], data: bytes, index: int) -> _Message:
    message = message_type()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise TraceFormatError(
            f"message {index} is not a valid {message_type.__name__}: {exc}"
        ) from exc
    return message


def read_trace(path: str | os.PathLike[str], data: bytes | None = None) -> RankTrace:
    """Read one rank's trace (from `data`, its bytes, where they were already read); a file whose
    first message is not GlobalMetadata is rejected, because ASTRA-sim would silently swallow its
    first node. An empty version is read: ASTRA-sim never looks at it."""
    path = Path(path)
    parsed = parse_trace_name(path)
    if parsed is None:
        raise TraceFormatError(f"{path}: name is not <prefix>.<rank>.et[.gz]")
    try:
        metadata, nodes = decode_trace(load_bytes(path) if data is None else data)
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from exc
    if metadata is None:
        raise TraceFormatError(f"{path}: first message is not a GlobalMetadata")
    return RankTrace(path=path, rank=parsed[1], metadata=metadata, nodes=nodes)


def find_traces(
    directory: str | os.PathLike[str], prefix: str | None = None
) -> tuple[str, list[Path]]:
    """Locate one trace set in a directory: (prefix, files sorted by rank).

    Several prefixes in one directory are ambiguous, so the caller must then name one.
    Gaps in the rank sequence are not an error here; the contract checker reports them.
    """
    prefix, ranks = find_rank_files(directory, prefix)
    return prefix, [ranks[rank] for rank in sorted(ranks)]


def find_rank_files(
    directory: str | os.PathLike[str], prefix: str | None = None
) -> tuple[str, dict[int, Path]]:
    """`find_traces` as {rank: file}. The directory is scanned once, without a stat per file,
    since a trace can have a hundred thousand of them."""
    directory = Path(directory)
    by_prefix: dict[str, dict[int, Path]] = {}
    with os.scandir(directory) as entries:
        for entry in entries:
            match = _TRACE_NAME.match(entry.name)
            if match is None or not entry.is_file():
                continue
            ranks = by_prefix.setdefault(match["prefix"], {})
            rank = int(match["rank"])
            if rank in ranks:
                names = ", ".join(sorted((ranks[rank].name, entry.name)))
                raise TraceFormatError(f"rank {rank} has two files: {names}: keep one")
            ranks[rank] = directory / entry.name
    if prefix is None:
        if len(by_prefix) > 1:
            raise TraceFormatError(
                f"{directory}: several trace prefixes ({', '.join(sorted(by_prefix))}): pick one with --prefix"
            )
        prefix = next(iter(by_prefix), None)
    if prefix is None or prefix not in by_prefix:
        wanted = f"'{prefix}.<rank>.et'" if prefix else "'<prefix>.<rank>.et'"
        raise FileNotFoundError(f"{directory}: no {wanted} trace files")
    return prefix, by_prefix[prefix]


def comm_groups_path(
    directory: str | os.PathLike[str], prefix: str, groups_file: str | os.PathLike[str] | None = None
) -> Path:
    """Where a trace set's communicator groups live: `groups_file` where one is named (another
    producer's name for it), else Flint's ``<prefix>.comm_groups.json`` beside the rank files."""
    if groups_file is not None:
        return Path(groups_file)
    return Path(directory) / f"{prefix}.comm_groups.json"


def read_comm_groups(path: str | os.PathLike[str]) -> dict[int, tuple[int, ...]]:
    """Parse a comm-groups file into {group id: ranks}, checking only its shape.

    Semantic rules (id 0, singleton groups, rank range, duplicates) need the rank count and
    are left to the contract checker so that it can report all of them at once.
    """
    try:
        raw = _read_json(path, "comm groups")
    except TraceFormatError as exc:
        raise GroupsFileError(str(exc)) from exc
    if not isinstance(raw, dict):
        raise GroupsFileError(f"{path}: comm groups must be a JSON object")
    groups: dict[int, tuple[int, ...]] = {}
    for key, ranks in raw.items():
        if not _GROUP_ID.fullmatch(key):
            raise GroupsFileError(
                f"{path}: group id {key[:40]!r} is not a decimal string of {GROUP_ID_DIGITS} "
                "digits at most"
            )
        if not isinstance(ranks, list) or not all(_is_int(r) for r in ranks):
            raise GroupsFileError(f"{path}: group {key} must be a list of integer ranks")
        if int(key) in groups:
            raise GroupsFileError(f"{path}: group id {int(key)} appears twice")
        groups[int(key)] = tuple(ranks)
    return groups


def read_manifest(directory: str | os.PathLike[str], prefix: str) -> dict | None:
    """The Flint manifest of trace set `prefix`; None without one, or with one of another set
    (another producer's trace has none: its files must then do)."""
    path = Path(directory) / MANIFEST
    if not path.exists():
        return None
    recorded = _read_json(path, "manifest")
    if not isinstance(recorded, dict):
        raise TraceFormatError(f"{path}: a manifest is a JSON object, not {type(recorded).__name__}")
    return recorded if recorded.get("name", prefix) == prefix else None


def read_manifest_leniently(
    directory: str | os.PathLike[str], prefix: str
) -> tuple[dict | None, TraceFormatError | None]:
    """`read_manifest`, or the error that kept it from being read, for the reader to judge."""
    try:
        return read_manifest(directory, prefix), None
    except TraceFormatError as exc:
        return None, exc


def manifest_ranks(manifest: dict, directory: str | os.PathLike[str]) -> int:
    """The rank count a manifest (of the set in `directory`) records."""
    ranks = manifest.get("ranks")
    if not _is_int(ranks) or ranks < 1:
        path = Path(directory) / MANIFEST
        raise TraceFormatError(f"{path}: 'ranks' is {str(ranks)[:40]!r}, not a positive integer")
    return ranks


def per_class_ranks(manifest: dict | None, directory: str | os.PathLike[str]) -> int | None:
    """The whole mesh's rank count where the set's manifest says it holds one file per rank
    class, else None."""
    if manifest is None or manifest.get(RANK_FILES) != ONE_PER_CLASS:
        return None
    return manifest_ranks(manifest, directory)


def _read_json(path: str | os.PathLike[str], what: str) -> Any:
    """A JSON file's value; anything that makes it unreadable (bytes, syntax, nesting, a number
    too long to convert) is a format error of the file, not a crash."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        raise TraceFormatError(f"{path}: unreadable {what}: {exc}") from exc


@dataclass(frozen=True)
class TraceFiles:
    """One trace set, opened once (`locate_traces`): the files to read, with what their nodes
    refer to (the set's groups and rank count) and its manifest, so that a command lists the
    directory, reads the manifest and the groups once. A file's bytes or decoding that a reader
    has already made (`flint.trace.contract.check_traces` before a schedule) are `held` until the
    next reader takes them (`trace`), so each file is read from disk and decoded once."""

    paths: list[Path]
    groups: dict[int, tuple[int, ...]]
    num_ranks: int
    one_per_class: bool = False
    """The set holds one file per rank class (`per_class_ranks`), not every rank's."""
    directory: Path | None = None
    prefix: str | None = None
    manifest: dict | None = None
    """Flint's manifest of the set (`read_manifest`); None for another producer's trace."""
    manifest_problem: TraceFormatError | None = None
    """Why the manifest could not be read, where it could not."""
    groups_path: Path | None = None
    """The comm-groups file the groups were read from (`comm_groups_path`), or would be."""
    held: dict[Path, bytes | RankTrace] = field(default_factory=dict, repr=False, compare=False)

    def recorded(self) -> dict | None:
        """The manifest, or the error that kept it from being read."""
        if self.manifest_problem is not None:
            raise self.manifest_problem
        return self.manifest

    def trace(self, path: Path) -> RankTrace:
        """A file of the set, decoded: what a reader before held of it, else read from disk."""
        held = self.held.pop(path, None)
        return held if isinstance(held, RankTrace) else read_trace(path, held)

    def check_command(self) -> str:
        """The `flint check` command that judges this set as it was opened: with its groups file
        where that is not the one beside the rank files."""
        words = ["flint", "check", str(self.directory)]
        if self.groups_path is not None and self.groups_path != comm_groups_path(self.directory, self.prefix):
            words += ["--groups", str(self.groups_path)]
        return shlex.join(words)


def locate_traces(
    path: str | os.PathLike[str],
    prefix: str | None = None,
    rank: int | None = None,
    groups_file: str | os.PathLike[str] | None = None,
) -> TraceFiles:
    """A directory's trace set (or only its `rank`), or one ``.et`` file, with the groups, rank
    count and manifest of the whole set (groups from `groups_file` where one is named, see
    `comm_groups_path`)."""
    path = Path(path)
    chosen = None
    one_file = path.is_file()
    if one_file:
        parsed = parse_trace_name(path)
        if parsed is None:
            raise TraceLookupError(f"{path}: a rank file's name says its rank, as <prefix>.<rank>.et[.gz] "
                                   "(mlp.0.et): rename it so")
        prefix, chosen = parsed[0], [path]
        path = path.parent
    prefix, paths = find_traces(path, prefix)
    groups_path = comm_groups_path(path, prefix, groups_file)
    try:
        groups = read_groups_if_any(groups_path)
    except GroupsFileError as exc:  # a reader's user named it, or may name another: --groups
        raise GroupsFileError(f"{exc}: correct it, or name the trace's groups file with --groups") from exc
    manifest, problem = read_manifest_leniently(path, prefix)
    recorded = per_class_ranks(manifest, path)
    num_ranks = recorded or max(parse_trace_name(p)[1] for p in paths) + 1
    one_per_class = recorded is not None and len(paths) < recorded
    chosen = chosen or paths
    if rank is not None:
        picked = [p for p in chosen if parse_trace_name(p)[1] == rank]
        if not picked:  # what the path holds instead, named only when it is asked for
            held = sorted(parse_trace_name(p)[1] for p in chosen)
            if one_file:
                raise TraceLookupError(f"{chosen[0]} holds rank {held[0]}, not rank {rank}: drop --rank, or give "
                                       "the directory")
            which = (f"ranks {held[0]} to {held[-1]}" if held == list(range(held[0], held[-1] + 1)) else
                     f"rank{'s' * (len(held) > 1)} {', '.join(map(str, held[:8]))}{', ...' * (len(held) > 8)}")
            kind = (f"one file per rank class of {num_ranks:,} ranks (flint extract --rank-files classes), of "
                    if one_per_class else "")
            raise TraceLookupError(f"{path}: no trace file for rank {rank}; it holds {kind}{which}: choose one of "
                                   "those")
        chosen = picked
    return TraceFiles(chosen, groups, num_ranks, one_per_class, path, prefix, manifest, problem, groups_path)


def read_groups_if_any(path: Path) -> dict[int, tuple[int, ...]]:
    """The groups of a comm-groups file; none where there is no file (every collective of such a
    trace runs on all ranks, or `flint check` says which group is missing)."""
    return read_comm_groups(path) if path.exists() else {}


def read_trace_set(
    directory: str | os.PathLike[str],
    prefix: str | None = None,
    groups_file: str | os.PathLike[str] | None = None,
) -> tuple[list[RankTrace], dict[int, tuple[int, ...]]]:
    """Every rank's trace of one set, in rank order, and its groups (none without a groups file)."""
    files = locate_traces(directory, prefix, groups_file=groups_file)
    return [read_trace(path) for path in files.paths], files.groups


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def attributes(node: et_def_pb2.Node) -> dict[str, et_def_pb2.AttributeProto]:
    """A node's attributes by name, for callers that look up several of them.

    The first attribute of a name wins; writers should never repeat a name.
    """
    by_name: dict[str, et_def_pb2.AttributeProto] = {}
    for attr in node.attr:
        by_name.setdefault(attr.name, attr)
    return by_name


def attribute_value(attr: et_def_pb2.AttributeProto) -> Any:
    """The Python value of an attribute whatever its kind (lists as ``list``), or None."""
    kind = attr.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(attr, kind)
    return list(value.values) if kind in _LIST_KINDS else value


def integer_attr(node: et_def_pb2.Node, name: str) -> int | None:
    """Attribute ``name`` if it holds an integer, else None: a size stored as text or a double
    (which the contract rejects) counts as absent for tools that add sizes up."""
    attr = _find_attr(node, name)
    kind = attr.WhichOneof("value") if attr is not None else None
    return getattr(attr, kind) if kind in INTEGER_KINDS else None


def gemm_shape(node: et_def_pb2.Node) -> list[int] | None:
    """A GEMM kernel's `gemm` attribute, [batch, m, n, k, operand bits], or None where the node
    has none (or not of that form)."""
    attr = _find_attr(node, "gemm")
    values = list(attr.int64_list.values) if attr is not None and attr.HasField("int64_list") else []
    return values if len(values) == 5 else None


def _string_attr(node: et_def_pb2.Node, name: str) -> str | None:
    attr = _find_attr(node, name)
    return attr.string_val if attr is not None and attr.WhichOneof("value") == "string_val" else None


def kernel_kind(node: et_def_pb2.Node) -> str | None:
    """A compute node's `kernel` attribute (`gemm`, `conv`, `triton`, `transpose`, `fusion`), or None."""
    return _string_attr(node, "kernel")


def kernel_name(node: et_def_pb2.Node) -> str | None:
    """A compute node's `kernel_name` attribute: the GPU compiler's name for its instruction
    (`fusion.103`), or None."""
    return _string_attr(node, "kernel_name")


def enum_name(enum: Any, value: int) -> str:
    """A value's name in a schema enum (`NodeType`, ...), or `<Enum> <value>` for one the schema
    does not define (a corrupt file, or a newer producer's): tools show it rather than fail on it."""
    return enum.Name(value) if value in enum.values() else f"{enum.DESCRIPTOR.name} {value}"


def _find_attr(node: et_def_pb2.Node, name: str) -> et_def_pb2.AttributeProto | None:
    return next((attr for attr in node.attr if attr.name == name), None)


def transfer_peers(node: et_def_pb2.Node, rank: int) -> tuple[int | None, int | None]:
    """A SEND's or RECV's (source, destination) in rank `rank`'s file, as ASTRA-sim reads them:
    integer attributes, where a SEND without `comm_src` sends from `rank` and a RECV without
    `comm_dst` receives at it; None where ASTRA-sim has no peer (a missing or non-integer one)."""
    src, dst = integer_attr(node, "comm_src"), integer_attr(node, "comm_dst")
    if node.type == et_def_pb2.COMM_SEND_NODE and _find_attr(node, "comm_src") is None:
        src = rank
    if node.type == et_def_pb2.COMM_RECV_NODE and _find_attr(node, "comm_dst") is None:
        dst = rank
    return src, dst


def attr_kind(node: et_def_pb2.Node, name: str) -> str | None:
    """The oneof field holding attribute ``name`` (e.g. ``'int64_val'``), or None if unset."""
    attr = _find_attr(node, name)
    return attr.WhichOneof("value") if attr is not None else None


def attr_value(node: et_def_pb2.Node, name: str) -> Any:
    """The Python value of attribute ``name`` whatever its kind, or None if unset."""
    attr = _find_attr(node, name)
    return attribute_value(attr) if attr is not None else None
