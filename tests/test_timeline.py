"""`flint timeline`: a hand-built two-rank trace is scheduled exactly as worked out by hand.

Device: 1 TFLOP/s and 1 GB/s, so a COMP node takes max(ops / 1e6, bytes / 1e3) µs rounded up;
link: 1 GB/s (1,000 bytes per µs) and alpha = 2 µs per step. Groups: {"1": [0, 1]}.

    rank 0                                   rank 1
    1 COMP 3e6 ops, 1e3 B   -> 3 µs  [0, 3]  1 COMP 1e6 ops, 6e3 B -> 6 µs  [0, 6]
    2 COMP 1e7 ops (no deps) -> 10 µs [3, 13] (waits for the compute stream)
    3 ALL_REDUCE 4,000 B on group 1 after 1    3 ALL_REDUCE after 1: starts when both are there,
      n = 2: 2(n-1) alpha + 2(n-1)/n S/bw = 4 + 4 = 8 µs, [6, 14] on both ranks
    4 SEND 0->1 2,000 B after 3: 2 + 2 = 4 µs  5 RECV after 1, ready at 6 but its SEND starts at
      [14, 18]                                   14: [14, 18]
                                               6 COMP 1e6 ops, 1e3 B after 5: 1 µs [18, 19]
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest
from conftest import flint
from test_trace_contract import TraceSet, make_node, set_attr

from flint.analysis.timeline import to_trace_events
from flint.devices import Device
from flint.errors import FlintError
from flint.schema import et_def_pb2 as pb
from flint.step.models import reader_collectives
from flint.step.schedule import AS_ASTRA_SIM, COMM, COMPUTE, READY_FIRST, RankTime, Slice, Timeline, load_timeline
from flint.trace.timing import Compute, Link, NodeTimer

DEVICE = Device("test", peak_tflops=1.0, mem_bw_gbps=1.0)
LINK = Link(bandwidth_gbps=1.0, latency_us=2.0)

# (rank, node id) -> (stream, start, duration), all by hand (module docstring)
EXPECTED = {
    (0, 1): (COMPUTE, 0, 3), (0, 2): (COMPUTE, 3, 10), (0, 3): (COMM, 6, 8), (0, 4): (COMM, 14, 4),
    (1, 1): (COMPUTE, 0, 6), (1, 3): (COMM, 6, 8), (1, 5): (COMM, 14, 4), (1, 6): (COMPUTE, 18, 1),
}


def compute(node_id: int, ops: int, nbytes: int, deps: tuple[int, ...] = ()) -> pb.Node:
    return make_node(node_id, pb.COMP_NODE, deps, num_ops=("int64_val", ops),
                     tensor_size=("uint64_val", nbytes))


def all_reduce(node_id: int, deps: tuple[int, ...]) -> pb.Node:
    return make_node(node_id, pb.COMM_COLL_NODE, deps, comm_type=("int64_val", pb.ALL_REDUCE),
                     comm_size=("int64_val", 4000), pg_name=("string_val", "1"))


def point_to_point(node_id: int, send: bool, deps: tuple[int, ...]) -> pb.Node:
    return make_node(node_id, pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, deps,
                     comm_src=("int32_val", 0), comm_dst=("int32_val", 1),
                     comm_tag=("int32_val", 7), comm_size=("int64_val", 2000))


def two_ranks() -> TraceSet:
    trace = TraceSet(groups={"1": [0, 1]})
    trace.nodes[0] = [compute(1, 3_000_000, 1000), compute(2, 10_000_000, 1000),
                      all_reduce(3, (1,)), point_to_point(4, True, (3,))]
    trace.nodes[1] = [compute(1, 1_000_000, 6000), all_reduce(3, (1,)),
                      point_to_point(5, False, (1,)), compute(6, 1_000_000, 1000, (5,))]
    for rank in trace.nodes:
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
    return trace


def timer_for(groups, num_ranks: int) -> NodeTimer:
    return NodeTimer(Compute(DEVICE, "roofline"), LINK, groups, num_ranks)


def test_schedule_matches_hand_derivation(tmp_path: Path) -> None:
    timeline = load_timeline(two_ranks().write(tmp_path), None, timer_for)
    got = {(s.rank, s.node_id): (s.stream, s.start, s.duration) for s in timeline.slices}
    assert got == EXPECTED  # every time here is exact in binary floating point
    assert timeline.step == pytest.approx(19)
    rank0, rank1 = timeline.ranks
    # rank 0: communication in flight [6, 18] = 12 µs, of which [6, 13] hides behind node 2
    assert (rank0.step, rank0.compute, rank0.communication, rank0.exposed) == pytest.approx((18, 13, 12, 5))
    assert (rank1.step, rank1.compute, rank1.communication, rank1.exposed) == pytest.approx((19, 7, 12, 12))


def test_an_estimate_keeps_times_without_names_or_attributes(tmp_path: Path) -> None:
    """What `flint simulate` schedules (`detail=False`): the hand-derived times of every slice and
    rank, with no node names or serialized nodes held for millions of slices."""
    from flint.step.schedule import schedule_trace_set
    from flint.trace.reader import locate_traces

    lean = schedule_trace_set(locate_traces(two_ranks().write(tmp_path), None), timer_for, detail=False)
    assert {(s.rank, s.node_id): (s.stream, s.start, s.duration) for s in lean.slices} == EXPECTED
    assert {(s.name, s.message) for s in lean.slices} == {("", None)}
    rank0, rank1 = lean.ranks
    assert (rank0.step, rank0.compute, rank0.communication, rank0.exposed) == pytest.approx((18, 13, 12, 5))
    assert (rank1.step, rank1.compute, rank1.communication, rank1.exposed) == pytest.approx((19, 7, 12, 12))


def test_trace_event_json_busy_time_is_the_sum_of_node_times(tmp_path: Path) -> None:
    timeline = load_timeline(two_ranks().write(tmp_path), None, timer_for)
    data = json.loads(json.dumps(to_trace_events(timeline, {"device": "test"})))
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {k for e in slices for k in e} >= {"name", "ph", "ts", "dur", "pid", "tid"}
    for rank, hand_total in ((0, 3 + 10 + 8 + 4), (1, 6 + 8 + 4 + 1)):
        assert sum(e["dur"] for e in slices if e["pid"] == rank) == pytest.approx(hand_total)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in data["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {(0, 0): "compute", (0, 1): "comm", (1, 0): "compute", (1, 1): "comm"}
    assert data["otherData"]["step_us"] == pytest.approx(19)


def test_overlapping_transfers_get_their_own_thread(tmp_path: Path) -> None:
    """A RECV never waits for the communication stream: on rank 1 it runs alongside a collective
    that rank 0 joins late, each on a thread of its own."""
    trace = two_ranks()
    # rank 0 joins all-reduce 7 after its SEND (14-18); rank 1 issues it at 14, after all-reduce 3,
    # while its RECV (14-18) runs
    trace.nodes[0].append(all_reduce(7, (4,)))
    trace.nodes[1].append(all_reduce(7, (3,)))
    timeline = load_timeline(trace.write(tmp_path), None, timer_for)
    got = {(s.rank, s.node_id): (s.start, s.end) for s in timeline.slices}
    assert got[1, 5] == (14, 18) and got[1, 7] == (18, 26)
    events = to_trace_events(timeline, {})["traceEvents"]
    comm = [e for e in events if e["ph"] == "X" and e["pid"] == 1 and e["cat"] == COMM]
    lanes = {e["args"]["id"]: e["tid"] for e in comm}
    assert lanes[3] == lanes[5] == lanes[7]  # back to back: one thread
    # a RECV beside a collective (its SEND from a rank outside the collective): two threads
    beside = Timeline([Slice(1, 5, "recv", COMM, 14, 4), Slice(1, 7, "all-reduce", COMM, 15, 8)],
                      [RankTime(1, 23, 0, 9, 9)])
    lanes = {e["args"].get("id", e["name"]): e["tid"] for e in to_trace_events(beside, {})["traceEvents"]
             if e["ph"] == "X"}
    assert lanes == {"recv": 1, "all-reduce": 2}


def test_collectives_waiting_on_each_other_in_a_cycle_are_reported(tmp_path: Path) -> None:
    trace = TraceSet(groups={"1": [0, 1], "2": [0, 1]})
    for rank, order in ((0, ("1", "2")), (1, ("2", "1"))):
        trace.nodes[rank] = [
            make_node(1, pb.COMM_COLL_NODE, (), comm_type=("int64_val", pb.ALL_REDUCE),
                      comm_size=("int64_val", 64), pg_name=("string_val", order[0])),
            make_node(2, pb.COMM_COLL_NODE, (1,), comm_type=("int64_val", pb.ALL_REDUCE),
                      comm_size=("int64_val", 64), pg_name=("string_val", order[1])),
        ]
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
    with pytest.raises(FlintError, match="never finishes node 1"):
        load_timeline(trace.write(tmp_path), None, timer_for)


def test_cli_writes_json_and_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    directory = two_ranks().write(tmp_path)
    device = tmp_path / "device.json"
    device.write_text(json.dumps({"name": "test", "peak_tflops": 1.0, "mem_bw_gbps": 1.0}))
    out, png = tmp_path / "step.json", tmp_path / "step.png"
    run = flint("timeline", directory, "-o", out, "--plot", png, "--device", device,
                "--link-gbps", "1", "--link-latency-us", "2", "--collectives", "astra-sim", "--json")
    assert run.returncode == 0, run.stderr
    # --link-gbps/--link-latency-us: one fully connected link, timed as ASTRA-sim times it, reducing
    # at the memory bandwidth of --device
    collectives = reader_collectives(None, None, 2, 1.0, 2.0, model="astra-sim", device=DEVICE)
    expected = load_timeline(directory, None, lambda groups, n: NodeTimer(Compute(DEVICE, "roofline"), LINK, groups,
                                                                          n, collectives), issue=AS_ASTRA_SIM)
    assert [r["step_us"] for r in json.loads(run.stdout)["ranks"]] == pytest.approx([r.step for r in expected.ranks])
    # by hand: the 4,000-byte all-reduce in 4 chunks of 1,000 bytes, 2 at a time, each 2 steps of
    # 500 bytes at 2^30 B/s and 2 µs a hop, 10 ns endpoint delay a step, the one step that reduces
    # also 3 x 500 bytes at the device's 1 GB/s: from 6 µs on rank 0; then its SEND of 2,000 bytes
    step = 2 * (0.01 + 2.0 + 500 / 2**30 * 1e6) + 3 * 500 / 1e3
    send = 2.0 + 2000 / 2**30 * 1e6  # a SEND has no endpoint delay
    assert expected.ranks[0].step == pytest.approx(6 + 2 * step + send)
    assert json.loads(out.read_text())["traceEvents"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_through_a_link_and_into_a_pipe(tmp_path: Path) -> None:
    """-o is written through a link (its target replaced, the link kept) and into a named pipe as a
    stream. Before, the rename that keeps a file whole replaced the link, and the pipe, with a
    regular file: the pipe's reader got nothing."""
    directory = two_ranks().write(tmp_path)
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("{}")
    link.symlink_to(target)
    run = flint("timeline", directory, "-o", link)
    assert run.returncode == 0, run.stderr
    assert link.is_symlink() and json.loads(target.read_text())["traceEvents"]
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: got.update(data=pipe.read_bytes()), daemon=True)
    reader.start()
    run = flint("timeline", directory, "-o", pipe)
    reader.join(timeout=60)
    assert run.returncode == 0, run.stderr
    assert stat.S_ISFIFO(pipe.stat().st_mode) and json.loads(got["data"])["traceEvents"]


@pytest.mark.parametrize("name", ["flint.0.et", "flint.comm_groups.json", "manifest.json"])
def test_cli_refuses_to_write_over_its_own_trace(tmp_path: Path, name: str) -> None:
    """-o DIR/manifest.json (or a rank's file, or the groups) overwrote the trace it was written
    from, and every later command refused the broken set."""
    directory = two_ranks().write(tmp_path)
    before = {path.name: path.read_bytes() for path in directory.iterdir()}
    run = flint("timeline", directory, "-o", directory / name)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "is a file of the trace it is written from: write it elsewhere" in run.stderr
    assert {path.name: path.read_bytes() for path in directory.iterdir()} == before


def test_cli_refuses_a_trace_that_breaks_the_contract(tmp_path: Path) -> None:
    trace = two_ranks()
    set_attr(trace.node(1, 5), "comm_tag", "int32_val", 8)  # rank 0's SEND has no partner
    run = flint("timeline", trace.write(tmp_path), "-o", tmp_path / "step.json")
    assert run.returncode == 2
    assert "breaks the trace contract" in run.stderr and "send-recv-match" in run.stderr
    assert run.stderr.rstrip().endswith(f"run `flint check {tmp_path}`")


def test_the_json_and_the_plot_are_written_both_or_neither(tmp_path: Path) -> None:
    directory = two_ranks().write(tmp_path)
    same = tmp_path / "step.png"
    run = flint("timeline", directory, "-o", same, "--plot", same)
    assert run.returncode == 2 and "-o and --plot both name" in run.stderr and not same.exists()
    if Path("/proc/self").is_dir():  # a directory no one may create files in
        run = flint("timeline", directory, "-o", tmp_path / "step.json", "--plot", "/proc/step.png")
        assert run.returncode == 2 and "cannot write '/proc/step.png'" in run.stderr
        assert not (tmp_path / "step.json").exists()


def test_the_contract_refusal_names_the_groups_file_it_was_given(tmp_path: Path) -> None:
    """`flint check DIR` alone would read the groups beside the rank files and find no fault."""
    directory = two_ranks().write(tmp_path)
    other = tmp_path.parent / f"{tmp_path.name}-groups.json"
    other.write_text("{}")
    run = flint("timeline", directory, "--groups", other, "-o", tmp_path / "step.json")
    assert run.returncode == 2 and "[pg-name]" in run.stderr
    assert run.stderr.rstrip().endswith(f"run `flint check {directory} --groups {other}`")
    assert flint("check", directory).returncode == 0


def two_stages() -> TraceSet:
    """Ranks 0, 1 (stage 0): compute, all-reduce on their pair, SEND to rank + 2, all-gather on all;
    ranks 2, 3 (stage 1): RECV from rank - 2, compute, all-reduce on their pair, all-gather on all."""
    trace = TraceSet(groups={"1": [0, 1], "2": [2, 3], "3": [0, 1, 2, 3]})

    def coll(node_id, kind, size, group, deps):
        return make_node(node_id, pb.COMM_COLL_NODE, deps, comm_type=("int64_val", kind),
                         comm_size=("int64_val", size), pg_name=("string_val", group))

    def transfer(node_id, send, src, dst, deps):
        return make_node(node_id, pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE, deps,
                         comm_src=("int32_val", src), comm_dst=("int32_val", dst), comm_tag=("int32_val", 5),
                         comm_size=("int64_val", 1 << 20))

    for rank in range(4):
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
        if rank < 2:
            trace.nodes[rank] = [compute(1, 3_000_000, 1000), coll(2, pb.ALL_REDUCE, 1 << 22, "1", (1,)),
                                 transfer(3, True, rank, rank + 2, (2,)), coll(4, pb.ALL_GATHER, 1 << 16, "3", (3,))]
        else:
            trace.nodes[rank] = [transfer(1, False, rank - 2, rank, ()), compute(2, 5_000_000, 1000, (1,)),
                                 coll(3, pb.ALL_REDUCE, 1 << 22, "2", (2,)), coll(4, pb.ALL_GATHER, 1 << 16, "3", (3,))]
    return trace


def test_one_rank_per_class_gives_every_rank_its_full_schedule(tmp_path: Path) -> None:
    """With the manifest's rank classes (the two stages), scheduling ranks 0 and 2 alone gives each
    rank the times the full schedule gives it."""
    directory = two_stages().write(tmp_path)
    (directory / "manifest.json").write_text(json.dumps({
        "name": "flint", "ranks": 4, "mesh": {"shape": [2, 2], "axis_names": ["pp", "data"]},
        "rank_totals": [{"ranks": [[0, 1]]}, {"ranks": [[2, 3]]}],
    }))
    collectives = reader_collectives("hgx", None, 4)

    def timer(groups, n):
        return NodeTimer(Compute(DEVICE, "roofline"), LINK, groups, n, collectives)

    full = load_timeline(directory, None, timer, by_class=False)
    by_class = load_timeline(directory, None, timer, by_class=True)
    assert by_class.represents == {0: [0, 1], 2: [2, 3]} and len(by_class.ranks) == 2
    def times(ranks):
        return [value for r in ranks for value in (r.rank, r.step, r.compute, r.communication, r.exposed)]

    assert times(by_class.every_rank()) == pytest.approx(times(full.ranks))
    assert by_class.step == pytest.approx(full.step) and full.step > 8  # waits on the RECV's compute
    # a class whose first and last files differ in shape is not trusted: every rank is scheduled
    (directory / "manifest.json").write_text(json.dumps({"name": "flint", "ranks": 4,
                                                         "rank_totals": [{"ranks": [[0, 3]]}]}))
    assert load_timeline(directory, None, timer, by_class=True).represents is None


def test_simulate_reads_each_file_of_the_set_once(tmp_path: Path, monkeypatch) -> None:
    """`flint simulate` (and `flint timeline`, the same schedule) opens the set once: the check
    before the schedule leaves each rank file's bytes for it, and the manifest and groups are read
    once, where each reader used to read them again (the rank files twice, the manifest four times)."""
    import flint.trace.contract as contract
    import flint.trace.reader as reader
    from flint.simulation import SimulateRequest, simulate

    directory = two_ranks().write(tmp_path)
    (directory / "manifest.json").write_text(json.dumps({"name": "flint", "ranks": 2}))
    reads: list[str] = []
    for module in (reader, contract):
        monkeypatch.setattr(module, "load_bytes", lambda path, load=module.load_bytes: reads.append(Path(path).name)
                            or load(path))
    monkeypatch.setattr(reader, "_read_json", lambda path, what, load=reader._read_json: reads.append(Path(path).name)
                        or load(path, what))
    result = simulate(SimulateRequest(directory=directory, output=tmp_path / "out"))
    assert result.ran and result.engine == "flint"
    assert sorted(reads) == ["flint.0.et", "flint.1.et", "flint.comm_groups.json", "manifest.json"]


def test_every_reader_reduces_at_the_memory_bandwidth_of_the_device_asked_for(tmp_path: Path) -> None:
    """With --collectives astra-sim, a reduction costs 3 x floor(bytes / local-mem-bw) ns, at the
    memory bandwidth of the device compute is timed on (docs/simulate.md). One 64 MiB all-reduce over
    the 4 NPUs of a Ring: 4 chunks of 16 MiB, 2 at a time, so 2 rounds of a ring phase whose n - 1 = 3
    reducing steps each reduce a 4 MiB message. An H100 (3,350 GB/s) against a B200 (8,000 GB/s):
    2 x 3 x 3 x (floor(4,194,304 / 3,350) - floor(4,194,304 / 8,000)) = 18 x (1,252 - 524) ns longer.
    simulate took --device; timeline and inspect kept the manifest's device (an H100's), so their
    step with --device b200 was the H100's."""
    from test_simulate import all_reduce_trace, write_ring

    traces = all_reduce_trace(tmp_path / "ar", 4, 64 * 2**20)
    ring = write_ring(tmp_path / "ring.yml", 4, 50, 500)
    common = ("--network", ring, "--collectives", "astra-sim")
    simulated, timed, inspected = {}, {}, {}
    for device in ("h100", "b200"):
        run = flint("simulate", traces, "--json", "--roofline", "--device", device, *common,
                    "-o", tmp_path / f"sim-{device}")
        assert run.returncode == 0, run.stderr
        simulated[device] = json.loads(run.stdout)["step_us"]
        run = flint("timeline", traces, "--json", "--durations", "roofline", "--device", device, *common,
                    "-o", tmp_path / f"{device}.json")
        assert run.returncode == 0, run.stderr
        timed[device] = json.loads(run.stdout)["step_us"]
        run = flint("inspect", traces, "--json", "--durations", "roofline", "--device", device, *common)
        assert run.returncode == 0, run.stderr
        [collective] = json.loads(run.stdout)[0]["heaviest"]
        inspected[device] = collective["micros"]
    assert simulated["h100"] - simulated["b200"] == pytest.approx(2 * 3 * 3 * (1252 - 524) / 1e3)
    assert timed == pytest.approx(simulated) and inspected == pytest.approx(simulated)


def test_a_class_scheduled_plot_has_a_labelled_bar_per_class() -> None:
    """Two classes scheduled by ranks 0 and 4 (of 0-3 and 4-7), and one of ranks 8, 10 and 12: a bar
    each, side by side, labelled with its ranks. Before, bars stood at ranks 0, 4 and 8 of an axis
    whose other ranks looked as if they took no time."""
    from flint.analysis.plot import bars

    times = [RankTime(rank, 10.0, 6.0, 4.0, 4.0) for rank in (0, 4, 8)]
    timeline = Timeline([], times, represents={0: [0, 1, 2, 3], 4: [4, 5, 6, 7], 8: [8, 10, 12]})
    assert bars(timeline) == ([0, 1, 2], ["0-3", "4-7", "8 +2"], "the ranks of a class (one scheduled for each)")
    assert bars(Timeline([], times)) == ([0, 4, 8], None, "rank")
