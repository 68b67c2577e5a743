"""A pipelined step's trace, planned stage by stage from its piece and its units.

Each stage's file is its units in order: a unit's RECV (what it receives), its start node, copies
of the piece's nodes of its regions, and its SEND. Node ids count up through each file; a transfer's
SEND and RECV share a tag computed from what it carries (`Transfer.tag`), so no file needs another's
ids. Only the copies of units that later ones read (a forward until its backward, each chunk's last
backward for its update) are held, as maps from piece node to the ids standing for it. An update
copies its chunk's gradient syncs first, reading that last backward, and its own nodes wait for them.

Within a stage, ranks differ only where the piece's own permutes pair them unevenly, so a class is
a stage and a class of the piece's ranks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cached_property

import numpy as np

from flint.emit.classes import RankClasses, Role, rank_classes
from flint.emit.groups import GroupTable
from flint.emit.plan import COLLECTIVE, RECV, SEND, Planned, planned_compute
from flint.pipelining.compose import UNIT_START, PipelinedStep, Transfer, Unit
from flint.pipelining.schedules import BACKWARD

ACCUMULATE = "accumulate"
"""The `op` of the node that adds a backward's weight gradient to the earlier microbatches' sum."""
ELEMENTWISE = "fusion"
"""The kernel kind of an element-wise kernel (`flint.ir.costs.kernel_of`)."""

UNIT_START_DATA = {"op": UNIT_START, "kind": "compute", "flops": 0, "transcendentals": 0, "bytes": 0}
"""A unit's start node does nothing (one FLOP, one byte: a simulator's roofline gives it no time)."""


class PipelinedPlan:
    """The trace plan of a pipelined step (`flint.emit.plan.TracePlan`)."""

    def __init__(self, step: PipelinedStep):
        self.step = step
        self.num_ranks = step.num_ranks
        self.piece_classes = piece = rank_classes(step.piece)
        count = len(piece.roles)
        keys = np.empty(self.num_ranks, dtype=np.int64)  # stage * count + the piece's class
        for stage, row in enumerate(step.ranks):
            keys[row] = stage * count + piece.of_rank
        found, first_rank = np.unique(keys, return_index=True)
        in_order = found[np.argsort(first_rank)]  # classes numbered in order of their first rank
        number = np.empty(step.request.stages * count, dtype=np.int64)
        number[in_order] = np.arange(len(in_order))
        of_rank = number[keys]
        self._of_class = [divmod(int(key), count) for key in in_order]
        self.tag_base = 2 * step.request.microbatches * step.request.stages * step.request.virtual_stages
        """Tags below it are transfers between stages (`Transfer.tag`); the piece's permutes' are above."""
        roles = tuple(Role(piece.roles[p].sends, piece.roles[p].receives, s) for s, p in self._of_class)
        self.classes = RankClasses(piece.permutes, roles, of_rank)
        self._on_stage: dict[tuple, tuple] = {}
        self.groups = GroupTable(self._group_uses(), self.num_ranks)

    def on_stage(self, ranks_of_piece: tuple[tuple[int, ...], ...], stage: int) -> tuple:
        """Groups (or the sources and targets of pairs) of the piece's ranks as `stage`'s ranks."""
        key = (ranks_of_piece, stage)
        if key not in self._on_stage:
            row = self.step.ranks[stage].tolist()
            self._on_stage[key] = tuple(tuple(row[q] for q in group) for group in ranks_of_piece)
        return self._on_stage[key]

    def _group_uses(self) -> Iterator[tuple[tuple[int, int], tuple]]:
        piece, regions = self.step.piece.graph, self.step.regions
        for stage, copied in enumerate(self.step.regions_on):
            for node in sorted(n for r in copied for n in regions.nodes(r)):
                groups = piece.nodes[node].get("groups")
                if groups is not None:
                    yield (stage, node), self.on_stage(groups, stage)

    @cached_property
    def peers(self) -> dict[tuple[int, int], dict[int, int]]:
        """(source stage, target stage) -> each rank's peer there, and back."""
        ranks = self.step.ranks.tolist()
        return {(a, b): dict(zip(ranks[a], ranks[b])) for a in range(len(ranks)) for b in range(len(ranks))
                if a != b}

    def pair_sets(self) -> Iterator[tuple[int, Sequence[tuple[int, int]]]]:
        """The transfers' pairs (one set per pair of stages, with the tag of a transfer between
        them) and the piece's permutes' pairs on each stage."""
        seen = set()
        for stage in range(self.step.request.stages):
            for unit in self.step.units(stage):
                t = unit.sends
                if t is not None and (t.source, t.target) not in seen:
                    seen.add((t.source, t.target))
                    yield t.tag, tuple(self.peers[t.source, t.target].items())
            for node in self.classes.permutes:
                pairs = self.step.piece.graph.nodes[node]["pairs"]
                yield node, tuple(zip(*self.on_stage(tuple(zip(*pairs)), stage)))

    def planned(self, cls: int) -> Iterator[Planned]:
        stage, piece_class = self._of_class[cls]
        return _StageFile(self, stage, piece_class).planned()


class _StageFile:
    """One class's file, planned unit by unit."""

    def __init__(self, plan: PipelinedPlan, stage: int, piece_class: int):
        self.plan = plan
        self.stage = stage
        self.step = plan.step
        self.piece = plan.step.piece.graph
        self.region_of = plan.step.regions.region_of
        role = plan.piece_classes.roles[piece_class]
        self.sends, self.receives = role.sends, role.receives
        self.column = {node: i for i, node in enumerate(plan.classes.permutes)}
        self.next_id = 0
        self.ends: list[int] = []
        self.contexts: dict = {}
        self._nodes_of: dict[tuple[str, ...], list[int]] = {}
        self._transfer_data: dict[int, dict] = {}

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def nodes_of(self, regions: tuple[str, ...]) -> list[int]:
        """The piece's nodes of `regions`, in the piece's order."""
        if regions not in self._nodes_of:
            self._nodes_of[regions] = sorted(n for r in regions for n in self.step.regions.nodes(r))
        return self._nodes_of[regions]

    def transfer_node(self, kind: str, transfer: Transfer, deps: tuple[int, ...]) -> Planned:
        data = self._transfer_data.get(transfer.nbytes)
        if data is None:
            data = self._transfer_data[transfer.nbytes] = {
                "op": "collective_permute", "kind": "collective", "collective": "collective_permute",
                "flops": 0, "transcendentals": 0, "bytes": 2 * transfer.nbytes, "comm_bytes": transfer.nbytes,
            }
        pair = (transfer.source, transfer.target) if kind == SEND else (transfer.target, transfer.source)
        return Planned(kind, self.take_id(), deps, (), data, transfer.name, peer_of=self.plan.peers[pair],
                       tag=transfer.tag)

    def planned(self) -> Iterator[Planned]:
        for index, unit in enumerate(self.step.units(self.stage)):
            yield from self.unit(index, unit)

    def unit(self, index: int, unit: Unit) -> Iterator[Planned]:
        context = dict(self.contexts[unit.reads]) if unit.reads is not None else {}
        waits = list(self.ends)
        if unit.receives is not None:
            recv = self.transfer_node(RECV, unit.receives, ())
            yield recv
            context[unit.stands_in] = (recv.id,)
            waits.append(recv.id)
        start = None
        if waits:
            start = self.take_id()
            yield planned_compute(start, (), tuple(sorted(waits)), UNIT_START_DATA, f"{unit.label} start")
        first = self.next_id
        followed: set[int] = set()
        for region in {self.region_of[node] for node in unit.syncs}:
            context[region] = dict(context[region])  # the backward's own copies stay as they were
        for region in unit.regions:
            context[region] = {}
        entry = () if start is None else (start,)
        if unit.syncs:
            yield from self.copies(index, unit, unit.syncs, context, first, entry, followed)
            entry = tuple(i for n in unit.syncs for i in context[self.region_of[n]][n])  # then the update
        yield from self.copies(index, unit, self.nodes_of(unit.regions), context, first, entry, followed)
        sources: set[int] = set()
        if unit.sends is not None:
            regions = self.step.regions
            for node in regions.sends_backward if unit.sends.key[0] == BACKWARD else regions.sends_forward:
                sources.update(context[self.region_of[node]].get(node, ()))
        if unit.accumulates:
            yield from self.accumulate(unit, context, followed)
        self.ends = [n for n in range(first, self.next_id) if n not in followed]
        if unit.sends is not None:
            yield self.transfer_node(SEND, unit.sends, tuple(sorted(sources)))
        if unit.work is not None:
            if unit.reads is not None and unit.reads in self.contexts:
                del self.contexts[unit.reads]  # a forward's copies are read by its backward only
            if unit.work.kind != BACKWARD or unit.work.microbatch == self.step.request.microbatches - 1:
                self.contexts[unit.work] = context

    def accumulate(self, unit: Unit, context: dict, followed: set[int]) -> Iterator[Planned]:
        """Add each weight gradient the backward computed to the sum of the chunk's earlier
        microbatches (read, read, write: one element-wise kernel); the update reads the sum. A
        gradient that only another virtual stage's update reads (the embedding's) is not summed."""
        ran = set(unit.regions)
        for node, handed in self.step.regions.accumulated.items():
            region = self.region_of[node]
            types = tuple(kind for runs_with, kind in handed if runs_with & ran)
            if region not in ran or not types:
                continue
            copied = context[region][node]
            planned = planned_compute(self.take_id(), copied, (), self.accumulate_data(node, types),
                                      f"{unit.label} accumulate {self.piece.nodes[node]['name']}")
            yield planned
            followed.update(copied)
            context[region][node] = (planned.id,)

    def accumulate_data(self, node: int, types: tuple) -> dict:
        data = {"op": ACCUMULATE, "kind": "compute", "flops": sum(t.elements for t in types),
                "transcendentals": 0, "bytes": 3 * sum(t.nbytes for t in types)}
        if "kernel" in self.piece.nodes[node]:
            data["kernel"] = ELEMENTWISE
        return data

    def copies(self, index: int, unit: Unit, nodes: Sequence[int], context: dict, first: int,
               entry: tuple[int, ...], followed: set[int]) -> Iterator[Planned]:
        """Plan copies of `nodes` for `unit`, whose ids begin at `first`: each reads the copies
        `context` holds, and one that reads none of the unit's waits for `entry`. Records each
        copy in `context` and what the unit's later nodes follow in `followed`."""
        label = unit.label + " "
        for node in nodes:
            copied = context[self.region_of[node]]
            data_deps: set[int] = set()
            ctrl_deps: set[int] = set()
            for pred, edge in self.piece.pred[node].items():
                where = context.get(self.region_of[pred], ())
                found = where if isinstance(where, tuple) else where.get(pred, ())
                if edge.get("ctrl"):
                    ctrl_deps.update(n for n in found if n >= first)  # the compiler's order, inside a copy
                else:
                    data_deps.update(found)
            if node in unit.skip:
                copied[node] = tuple(sorted(data_deps | ctrl_deps))
                continue
            inside = {n for n in data_deps | ctrl_deps if n >= first}
            followed |= inside
            ctrl_deps -= data_deps
            if not inside:
                ctrl_deps.update(entry)  # a first node of the unit: it starts as a whole
                followed.update(n for n in entry if n >= first)
            deps, ctrl = tuple(sorted(data_deps)), tuple(sorted(ctrl_deps))
            copied[node] = yield from self.copy(index, node, deps, ctrl, label)

    def copy(self, index: int, node: int, deps: tuple, ctrl: tuple, label: str):
        """Plan one copy of a piece node; the ids that stand for it in this file."""
        data = self.piece.nodes[node]
        name = label + data["name"]
        if data["kind"] != "collective":
            planned = planned_compute(self.take_id(), deps, ctrl, data, name)
            yield planned
            return (planned.id,)
        column = self.column.get(node)
        if column is None:
            partition = self.plan.groups.partition_of[self.stage, node]
            planned = Planned(COLLECTIVE, self.take_id(), deps, ctrl, data, name, partition)
            yield planned
            return (planned.id,)
        stands_for = tuple(sorted(set(deps) | set(ctrl)))  # a rank outside the pairs does nothing
        tag = self.plan.tag_base + index * len(self.column) + column
        pairs = self.plan.on_stage(tuple(zip(*data["pairs"])), self.stage)
        if self.sends[column]:
            planned = Planned(SEND, self.take_id(), deps, ctrl, data, name, peer_of=dict(zip(*pairs)), tag=tag)
            yield planned
            stands_for = (planned.id,)
        if self.receives[column]:
            planned = Planned(RECV, self.take_id(), deps, ctrl, data, name,
                              peer_of=dict(zip(pairs[1], pairs[0])), tag=tag)
            yield planned
            stands_for = (planned.id,)  # the data has arrived: what dependents wait for
        return stands_for
