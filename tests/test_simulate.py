"""`flint simulate`: ASTRA-sim's inputs for a trace, its run, and its results read back.

The tests that run the real simulator take its path from ASTRA_SIM (see .ci/run) and skip where
it is unset; those that check the inputs, the command printed without a simulator, and how a
simulator's exit is judged run everywhere (the last with a stand-in script).

By hand, ASTRA-sim's ring all-reduce of S bytes over n ranks on one Ring dimension of bandwidth B
and latency L, one chunk in flight (`preferred-dataset-splits` and `active-chunks-per-dimension`
1): 2(n-1) steps, each sending S/n bytes to a neighbour, so 2(n-1) * (L + S / (n B)). ASTRA-sim
reads B in GB/s as 2^30 bytes/s (astra-network-analytical's NetworkFunction.cpp). On top it adds
endpoint delays and a reduction per step, measured here at 2.4% for 16 MiB steps: the bandwidth
term is asserted within 3%, and the latency term exactly, from two runs that differ only in L.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, extract, flint
from test_trace_contract import TraceSet, make_node, valid_trace

from flint.schema import et_def_pb2 as pb

SIMULATOR = os.environ.get("ASTRA_SIM", "")
needs_simulator = pytest.mark.skipif(
    not (SIMULATOR and os.path.isfile(SIMULATOR) and os.access(SIMULATOR, os.X_OK)),
    reason="needs ASTRA-sim: set ASTRA_SIM to its astra-sim wrapper",
)
ONE_CHUNK = {"preferred-dataset-splits": 1, "active-chunks-per-dimension": 1}


def without_simulator() -> dict[str, str]:
    """The environment with no ASTRA_SIM and a PATH that holds only Python's directory."""
    env = {k: v for k, v in os.environ.items() if k != "ASTRA_SIM"}
    env["PATH"] = str(Path(os.sys.executable).parent)
    return env


def simulate(directory: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    run = flint("simulate", directory, "--json", *args, env=env)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def write_ring(path: Path, npus: int, bandwidth: float, latency: float) -> Path:
    path.write_text(f"topology: [ Ring ]\nnpus_count: [ {npus} ]\nbandwidth: [ {bandwidth} ]\nlatency: [ {latency} ]\n")
    return path


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


def all_reduce_trace(directory: Path, ranks: int, size: int) -> Path:
    """Every rank: one ALL_REDUCE of `size` bytes on group 1, which holds every rank."""
    trace = TraceSet(groups={"1": list(range(ranks))}, prefix="ar")
    for rank in range(ranks):
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
        trace.nodes[rank] = [make_node(1, pb.COMM_COLL_NODE, (), comm_type=("int64_val", pb.ALL_REDUCE),
                                       comm_size=("int64_val", size), pg_name=("string_val", "1"))]
    directory.mkdir()
    return trace.write(directory)


def chain_trace(directory: Path, durations: dict[int, list[int]]) -> Path:
    """Each rank: a chain of COMP nodes of the given `duration_micros`, each with the FLOPs an
    H100 (989 TFLOP/s) does in that time and 1 KiB of memory traffic."""
    trace = TraceSet(groups={}, prefix="chain")
    for rank, micros in durations.items():
        trace.metadata[rank] = pb.GlobalMetadata(version="0.0.4")
        nodes = [make_node(i + 1, pb.COMP_NODE, (i,) if i else (), is_cpu_op=("bool_val", False),
                           num_ops=("int64_val", us * 989_000_000), tensor_size=("uint64_val", 1024))
                 for i, us in enumerate(micros)]
        for node, duration in zip(nodes, micros):
            node.duration_micros = duration
        trace.nodes[rank] = nodes
    directory.mkdir()
    return trace.write(directory)


# -- with the real simulator ------------------------------------------------------------------------


@needs_simulator
def test_one_all_reduce_on_a_ring_takes_the_ring_time(tmp_path):
    n, size, bandwidth = 4, 64 * 2**20, 50.0
    traces = all_reduce_trace(tmp_path / "ar", n, size)
    system = write_json(tmp_path / "system.json", ONE_CHUNK)
    steps = {}
    for latency in (500.0, 1500.0):
        ring = write_ring(tmp_path / f"ring{latency:g}.yml", n, bandwidth, latency)
        result = simulate(traces, "--network", ring, "--system", system, "--engine", "astra-sim",
                          "-o", tmp_path / f"sim{latency:g}")
        assert [r["rank"] for r in result["per_rank"]] == list(range(n))
        assert len({r["step_us"] for r in result["per_rank"]}) == 1  # one collective: all end together
        assert all(r["compute_us"] == 0 for r in result["per_rank"])
        steps[latency] = result["step_us"]
    # the latency term, exactly: 2(n-1) steps of 1,000 ns more
    assert steps[1500.0] - steps[500.0] == pytest.approx(2 * (n - 1) * 1000 / 1e3, abs=1e-9)
    # the bandwidth term: 2(n-1) messages of S/n bytes at B * 2^30 bytes/s
    by_hand_us = 2 * (n - 1) * (500e-3 + size / n / (bandwidth * 2**30) * 1e6)
    assert steps[500.0] == pytest.approx(by_hand_us, rel=0.03)


@needs_simulator
def test_a_compute_chain_takes_the_sum_of_its_durations(tmp_path):
    traces = chain_trace(tmp_path / "chain", {0: [3, 5, 7], 1: [11, 2]})
    result = simulate(traces, "--network", write_ring(tmp_path / "ring.yml", 2, 100.0, 500.0))
    ranks = {r["rank"]: r for r in result["per_rank"]}
    assert ranks[0]["step_us"] == ranks[0]["compute_us"] == 15.0
    assert ranks[1]["step_us"] == ranks[1]["compute_us"] == 13.0
    assert all(r["exposed_communication_us"] == 0 for r in ranks.values())
    # rank 1 waits 2 µs for rank 0, the slowest, to end the step
    assert (ranks[0]["idle_us"], ranks[1]["idle_us"]) == (0.0, 2.0)
    assert result["step_us"] == 15.0 and result["slowest_rank"] == 0
    # flint timeline times the same nodes by the roofline, which their FLOPs were chosen to match
    assert result["timeline_estimate_us"] == pytest.approx(15.0)


@needs_simulator
def test_tensor_parallel_traffic_ignores_the_outer_dimension(tmp_path):
    """examples/decode.py on 2x4 is inference: its only collectives are on tensor groups of 4
    consecutive ranks, which sit on dimension 0. Changing dimension 1's bandwidth changes nothing;
    changing dimension 0's does."""
    traces = tmp_path / "decode"
    extract(EXAMPLES / "decode.py", "2x4", traces, "--backend", "gpu:h100")
    groups = json.loads((traces / "decode.comm_groups.json").read_text())
    assert sorted(map(sorted, groups.values())) == [[0, 1, 2, 3], [4, 5, 6, 7]]

    def step(inner: float, outer: float) -> float:
        path = tmp_path / f"net-{inner:g}-{outer:g}.yml"
        path.write_text(f"topology: [ Switch, Switch ]\nnpus_count: [ 4, 2 ]\nbandwidth: [ {inner}, {outer} ]\n"
                        "latency: [ 500.0, 2000.0 ]\n")
        return simulate(traces, "--network", path, "-o", tmp_path / path.stem)["step_us"]

    assert step(400.0, 50.0) == step(400.0, 5.0)
    assert step(40.0, 50.0) > step(400.0, 50.0)


@needs_simulator
def test_a_data_and_tensor_parallel_step_is_near_the_estimator(tmp_path):
    """examples/mlp.py on 2x4 (gpu:h100, hgx: one NVLink node): the step is at least the compute and
    within 10% of Flint's estimator (flint timeline's step) on the same network, collectives timed as
    ASTRA-sim times them."""
    traces = tmp_path / "mlp"
    extract(EXAMPLES / "mlp.py", "2x4", traces, "--backend", "gpu:h100")
    result = simulate(traces, "--engine", "astra-sim", "--collectives", "astra-sim")
    assert [d["npus"] for d in result["network"]["dimensions"]] == [8]
    for rank in result["per_rank"]:
        assert rank["step_us"] >= rank["compute_us"] > 0
        assert rank["exposed_communication_us"] > 0  # three all-reduces, only partly overlapped
    assert result["engine"] == "astra-sim"
    assert result["timeline_estimate_us"] == pytest.approx(result["step_us"], rel=0.10)
    # the inputs stay beside the trace, with the report
    assert json.loads((traces / "astra-sim" / "result.json").read_text())["step_us"] == result["step_us"]


# -- without it -------------------------------------------------------------------------------------


def test_without_a_simulator_it_writes_the_inputs_and_the_command(tmp_path, mlp_traces):
    traces = mlp_traces("4x4")
    out = tmp_path / "inputs"
    result = simulate(traces, "-o", out, "--roofline", "--engine", "astra-sim", env=without_simulator())
    assert result["simulator"] is None and result["step_us"] is None and result["per_rank"] == []
    # 16 ranks, tensor 4: a node of 8 holds tensor and half of data, two nodes
    network = [line for line in (out / "network.yml").read_text().splitlines() if not line.startswith("#")]
    assert network[1] == "npus_count: [ 8, 2 ]"
    system = json.loads((out / "system.json").read_text())
    assert system["roofline-enabled"] == 1 and system["peak-perf"] == 989.0 and system["local-mem-bw"] == 3350.0
    assert system["all-reduce-implementation"] == ["ring", "ring"]
    assert f"--workload-configuration={traces.resolve() / 'mlp'}" in result["command"]
    assert f"--network-configuration={out.resolve() / 'network.yml'}" in result["command"]
    text = flint("simulate", traces, "-o", out, "--engine", "astra-sim", env=without_simulator())
    assert text.returncode == 0 and "ASTRA-sim not found" in text.stdout
    # by default, without ASTRA-sim, the estimator gives the step and says so
    auto = simulate(traces, "-o", out, env=without_simulator())
    assert auto["engine"] == "flint" and auto["step_us"] == auto["timeline_estimate_us"] > 0
    assert len(auto["per_rank"]) == 16
    text = flint("simulate", traces, "-o", out, env=without_simulator())
    assert "engine: Flint's estimator" in text.stdout


def test_groups_under_another_name(tmp_path, mlp_traces):
    """--groups names the communicator groups when they are not PREFIX.comm_groups.json: ASTRA-sim
    and the estimate both read that file (mlp 2x4: the estimate needs the tensor and data groups)."""
    traces = tmp_path / "traces"
    shutil.copytree(mlp_traces("2x4"), traces)
    groups = tmp_path / "groups.json"
    (traces / "mlp.comm_groups.json").rename(groups)
    result = simulate(traces, "-o", tmp_path / "inputs", "--groups", groups, env=without_simulator())
    assert f"--comm-group-configuration={groups.resolve()}" in result["command"]
    assert result["timeline_estimate_us"] > 0


def stand_in(tmp_path: Path, ranks: int, exit_signal: str, last_wall: int = 5000) -> Path:
    """A script that prints what ASTRA-sim prints for `ranks` ranks (the last finishing at
    `last_wall` ns, the others at 5,000), then dies of `exit_signal`."""
    walls = [5000] * (ranks - 1) + [last_wall]
    lines = "".join(
        f"echo 'sys[{r}] finished, {walls[r]} cycles, exposed communication 2000 cycles.'\n"
        f"echo 'sys[{r}], Wall time: {walls[r]}'\necho 'sys[{r}], GPU time: 3000'\n"
        f"echo 'sys[{r}], Comm time: 2500'\necho 'sys[{r}], Total compute-communication overlap: 500'\n"
        for r in range(ranks)
    )
    script = tmp_path / "astra-sim"
    script.write_text(f"#!/bin/sh\n{lines}echo 'malloc_consolidate(): unaligned fastbin chunk detected' >&2\n"
                      f"kill -{exit_signal} $$\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_a_crash_at_teardown_after_every_rank_finished_is_the_known_issue(tmp_path, mlp_traces):
    """mlp on 2x4: every rank is in a tensor group and a data group, where the upstream build may
    abort at exit. All eight ranks printed their results: they count, with a note."""
    result = simulate(mlp_traces("2x4"), "--astra-sim", stand_in(tmp_path, 8, "ABRT"), "-o", tmp_path / "sim",
                      "--no-estimate")
    assert "known upstream issue" in result["known_issue"]
    assert result["step_us"] == 5.0 and result["timeline_estimate_us"] is None
    # compute 3,000 ns; 2,500 ns of communication, 500 of it hidden; the rest idle
    assert result["per_rank"][7] == {"rank": 7, "step_us": 5.0, "compute_us": 3.0, "communication_us": 2.5,
                                     "exposed_communication_us": 2.0, "idle_us": 0.0}


def test_idle_lasts_until_the_slowest_rank_finishes(tmp_path, mlp_traces):
    """Rank 7 finishes at 9,000 ns, the others at 5,000: the step is 9 µs, and a rank that computed
    3 µs and waited 2 µs on communication idles the other 4 µs of it, as in flint timeline."""
    result = simulate(mlp_traces("2x4"), "--astra-sim", stand_in(tmp_path, 8, "ABRT", last_wall=9000),
                      "-o", tmp_path / "sim", "--no-estimate")
    assert result["step_us"] == 9.0 and result["slowest_rank"] == 7
    assert result["per_rank"][0]["step_us"] == 5.0 and result["per_rank"][0]["idle_us"] == 4.0
    assert result["per_rank"][7]["idle_us"] == 4.0


def test_a_run_that_loses_ranks_is_an_error(tmp_path, mlp_traces):
    run = flint("simulate", mlp_traces("2x4"), "--astra-sim", stand_in(tmp_path, 5, "SEGV"), "-o", tmp_path / "sim",
                env=temp_dir(tmp_path))
    assert run.returncode == 2
    assert run.stderr.startswith("error: ASTRA-sim stopped with 5 of 8 ranks finished")
    assert len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "sim").exists()


# -- all or nothing, and --timeout ------------------------------------------------------------------


def temp_dir(tmp_path: Path) -> dict[str, str]:
    """The environment with TMPDIR in tmp_path, where a failed run's files are kept."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp_path / "tmp")}


def slow_simulator(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for an ASTRA-sim that takes 60 s: a script that starts `sleep 60` and waits for
    it; and the file where it writes the sleep's process id once it runs."""
    pid = tmp_path / "sleep.pid"
    script = tmp_path / "slow-astra-sim"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {pid}\nwait\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, pid


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a killed orphan may linger unreaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def tree(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (hidden ones too) by relative path, with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_the_timeout_stops_astra_sim_and_what_it_started(tmp_path, mlp_traces):
    """--timeout 1 on a simulator that takes 60 s: stopped after 1 s, not when its output closes
    (before, the limit applied only after ASTRA-sim's output closed: the run took the 60 s and gave
    a result), its child killed with it, one line saying what to do, and nothing written."""
    script, pid = slow_simulator(tmp_path)
    started = time.monotonic()
    run = flint("simulate", mlp_traces("2x4"), "--astra-sim", script, "--timeout", "1", "-o", tmp_path / "sim",
                env=temp_dir(tmp_path))
    assert time.monotonic() - started < 20
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == ("error: ASTRA-sim ran past --timeout 1 s with 0 of 8 ranks finished, and was stopped: "
                          "raise --timeout, or leave it out to wait for the end\n")
    assert not running(int(pid.read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sleep.pid", "slow-astra-sim", "tmp"]
    assert not any((tmp_path / "tmp").iterdir())


def test_a_failed_run_leaves_the_earlier_output_as_it_was(tmp_path, mlp_traces):
    """An earlier simulation on the flat network in O; ASTRA-sim on hgx-a100 fails (exit 1): O is
    as it was (before, it held hgx-a100's network.yml beside flat's result.json), and the failed
    run's files are kept where the error line says. A run that succeeds replaces O whole: nothing
    of the one before it stays (here ASTRA-sim's output, which the estimator does not write)."""
    traces, out = mlp_traces("2x4"), tmp_path / "O"
    simulate(traces, "--network", "flat", "-o", out)
    before = tree(out)
    failing = tmp_path / "failing-astra-sim"
    failing.write_text("#!/bin/sh\necho 'cannot read the workload' >&2\nexit 1\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    run = flint("simulate", traces, "--network", "hgx-a100", "--engine", "astra-sim", "--astra-sim", failing,
                "-o", out, env=temp_dir(tmp_path))
    assert run.returncode == 2 and len(run.stderr.splitlines()) == 1
    assert run.stderr.startswith("error: ASTRA-sim stopped with 0 of 8 ranks finished (exit 1: cannot read the "
                                 "workload): its inputs and output are kept in ")
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["O", "failing-astra-sim", "tmp"]  # no staging left
    (kept,) = (tmp_path / "tmp").iterdir()
    assert f"kept in {kept};" in run.stderr
    assert (kept / "stderr.txt").read_text() == "cannot read the workload\n"
    assert "hgx-a100" in (kept / "network.yml").read_text()
    simulate(traces, "--astra-sim", stand_in(tmp_path, 8, "ABRT"), "-o", out)
    assert (out / "stdout.txt").exists()
    result = simulate(traces, "--network", "flat", "-o", out)
    assert set(tree(out)) == {"system.json", "network.yml", "memory.json", "logging.toml", "result.json"}
    assert json.loads((out / "result.json").read_text()) == result


def test_a_directory_holding_other_files_is_not_replaced(tmp_path, mlp_traces):
    """A simulation replaces its directory whole, so -o at one that holds anything it does not
    write is refused up front, the directory as it was (before, the inputs joined its files)."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    run = flint("simulate", mlp_traces("2x4"), "-o", out)
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "holds 'notes.txt', which flint simulate does not write" in run.stderr
    assert tree(out) == {"notes.txt": b"mine\n"}


@pytest.mark.parametrize("signum, earlier", [(signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["sigint-new", "sigterm-earlier"])
def test_an_interrupted_run_leaves_nothing(tmp_path, mlp_traces, signum, earlier):
    """SIGINT or SIGTERM while ASTRA-sim runs: it stops within seconds (the simulator's process
    group killed), exit 128 + the signal, and -o is as it was: absent, or an earlier simulation's
    (before, a new directory was left with the inputs and ASTRA-sim's half-written output)."""
    traces, out = mlp_traces("2x4"), tmp_path / "out"
    if earlier:
        simulate(traces, "-o", out)
    before = tree(out) if earlier else None
    script, pid = slow_simulator(tmp_path)
    run = subprocess.Popen([sys.executable, "-m", "flint", "simulate", str(traces), "--astra-sim", str(script),
                            "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=temp_dir(tmp_path))
    try:
        deadline = time.monotonic() + 60
        while not (pid.exists() and pid.read_text().strip()):  # ASTRA-sim runs, in the staging directory
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.01)
        run.send_signal(signum)
        _, stderr = run.communicate(timeout=10)
    finally:
        run.kill()
        run.communicate()
    assert run.returncode == 128 + signum, stderr
    assert not running(int(pid.read_text()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] * earlier + ["sleep.pid", "slow-astra-sim", "tmp"]
    assert not any((tmp_path / "tmp").iterdir())
    if earlier:
        assert tree(out) == before


def test_a_set_of_one_file_per_class_gets_no_astra_sim_command(tmp_path):
    """mlp on 2x4 with --rank-files classes holds one rank file (one class), which ASTRA-sim cannot
    run: the estimator's result says why in one line instead of printing a command that reads
    mlp.1.et, which is not there."""
    traces = tmp_path / "classes"
    extract(EXAMPLES / "mlp.py", "2x4", traces, "--rank-files", "classes")
    assert not (traces / "mlp.1.et").exists()
    for engine in ("flint", "auto"):
        run = flint("simulate", traces, "--engine", engine, "-o", tmp_path / "sim", env=without_simulator())
        assert run.returncode == 0, run.stderr
        assert "--workload-configuration" not in run.stdout and "; run" not in run.stdout
        assert ("note: the set holds one file per rank class (flint extract --rank-files classes), which Flint's "
                "estimator reads; ASTRA-sim needs every rank's: extract again with --rank-files all\n") in run.stdout
        assert run.stdout.endswith(f"ASTRA-sim's inputs and result.json are in {(tmp_path / 'sim').resolve()}\n")
    result = simulate(traces, "-o", tmp_path / "sim", env=without_simulator())
    assert result["command"] is None and "--rank-files all" in result["notes"][-1]


def test_a_trace_that_breaks_the_contract_is_refused_with_nothing_written(tmp_path):
    """Group 1 names a rank the set lacks; neither -o nor the trace's own astra-sim/ is written."""
    trace = valid_trace()
    trace.groups["1"] = [0, 9]
    directory = trace.write(tmp_path)
    for options in (("-o", tmp_path / "sim"), ()):
        run = flint("simulate", directory, *options)
        assert run.returncode == 2 and "breaks the trace contract" in run.stderr
    assert not (tmp_path / "sim").exists() and not (directory / "astra-sim").exists()


def test_a_missing_simulator_path_is_one_line(tmp_path, mlp_traces):
    run = flint("simulate", mlp_traces("2x4"), "--astra-sim", tmp_path / "nowhere", "-o", tmp_path / "sim")
    assert run.returncode == 2 and "is not an executable file" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    run = flint("simulate", mlp_traces("2x4"), "--astra-sim", tmp_path / "nowhere", "--engine", "flint")
    assert run.returncode == 2 and "which --engine flint does not run" in run.stderr


def test_auto_leaves_traces_beyond_the_cap_to_the_estimator(tmp_path, mlp_traces, monkeypatch):
    """--engine auto runs ASTRA-sim only up to ASTRA_SIM_MAX_RANKS ranks (2,048): beyond, even with
    ASTRA-sim at hand, the estimator gives the step (here with the cap lowered to 4 for 8 ranks)."""
    from flint.simulation import driver

    simulator = stand_in(tmp_path, 8, "ABRT")
    request = driver.SimulateRequest(directory=mlp_traces("2x4"), simulator=str(simulator), output=tmp_path / "sim",
                                     engine="auto")
    assert driver.simulate(request).engine == "astra-sim"
    monkeypatch.setattr(driver, "ASTRA_SIM_MAX_RANKS", 4)
    result = driver.simulate(request).as_json()
    assert result["engine"] == "flint" and result["step_us"] == result["timeline_estimate_us"] > 0
    assert json.loads((tmp_path / "sim" / "result.json").read_text())["engine"] == "flint"


def test_the_estimator_says_when_the_system_asks_for_what_it_does_not_model(tmp_path, mlp_traces):
    system = write_json(tmp_path / "system.json", {"all-to-all-implementation": ["direct"]})
    result = simulate(mlp_traces("2x4"), "--engine", "flint", "--collectives", "astra-sim", "--system", system,
                      "-o", tmp_path / "sim")
    assert result["notes"] == ["the estimator times ring collectives; the system file asks ASTRA-sim for "
                               "all-to-all-implementation: ['direct']"]
    assert simulate(mlp_traces("2x4"), "--engine", "flint", "--collectives", "astra-sim",
                    "-o", tmp_path / "plain")["notes"] == []


def test_system_keys_where_nothing_reads_them_are_refused(tmp_path):
    """As NCCL runs them (the default), the estimator's collectives read no ASTRA-sim system key:
    an endpoint delay of 10^9 ns left the step as it was, without a word. Refused there in one
    line; read by ASTRA-sim's model of collectives: one 1 MiB all-reduce over an 8-GPU node is 4
    chunks, 2 at a time, each a ring of 2 x 7 messages, so the delay adds 2 x 14 x 10^9 ns; and
    written for ASTRA-sim itself (--engine astra-sim, here without one to run)."""
    traces = all_reduce_trace(tmp_path / "ar", 8, 2**20)
    delay, none = (write_json(tmp_path / f"{name}.json", {"endpoint-delay": ns}) for name, ns in (("d", 1e9), ("z", 0)))
    run = flint("simulate", traces, "--system", delay, "-o", tmp_path / "nccl")
    assert run.returncode == 2 and not (tmp_path / "nccl").exists()
    assert run.stderr == ("error: --system sets ASTRA-sim's system keys, which NCCL's model does not use: add "
                          "--collectives astra-sim, or --engine astra-sim to run ASTRA-sim, or leave --system out\n")
    steps = [simulate(traces, "--collectives", "astra-sim", "--system", system, "-o", tmp_path / system.stem)["step_us"]
             for system in (delay, none)]
    assert steps[0] - steps[1] == pytest.approx(2 * 14 * 1e9 / 1e3)
    simulate(traces, "--engine", "astra-sim", "--system", delay, "-o", tmp_path / "astra", env=without_simulator())
    assert json.loads((tmp_path / "astra" / "system.json").read_text())["endpoint-delay"] == 1e9


@pytest.mark.parametrize("key, value, least", [
    ("endpoint-delay", math.nan, 0), ("endpoint-delay", math.inf, 0), ("endpoint-delay", -100, 0),
    ("endpoint-delay", 2.5, 0), ("preferred-dataset-splits", "four", 1), ("preferred-dataset-splits", math.nan, 1),
    ("preferred-dataset-splits", 0, 1), ("preferred-dataset-splits", -4, 1), ("preferred-dataset-splits", 2.5, 1),
    ("active-chunks-per-dimension", math.nan, 1), ("active-chunks-per-dimension", 0, 1),
    ("collective-optimization", "fast", None), ("local-mem-bw", 0, None),
], ids=["delay-nan", "delay-inf", "delay-negative", "delay-fraction", "splits-text", "splits-nan", "splits-0",
        "splits-negative", "splits-fraction", "chunks-nan", "chunks-0", "optimization", "memory-bandwidth"])
def test_a_system_key_neither_the_estimator_nor_astra_sim_can_run_with_is_one_line(tmp_path, key, value, least):
    """Before, NaN hung the estimator, Infinity reached the result (not JSON), text and NaN counts
    were tracebacks, and a negative delay (faster than none) or a count of 0 was taken; ASTRA-sim
    finishes no rank with any of them, nor reads NaN or Infinity (JSON has neither). A fraction
    ASTRA-sim would cut to its whole part (Sys.hh reads ints), the estimator not always. Refused
    before anything is written."""
    expected = {"collective-optimization": f"{key} is {value!r}, not one of baseline, localBWAware",
                "local-mem-bw": f"{key} is {value!r}, not a finite number above 0"}.get(
        key, f"{key} is {value!r}, not a whole number of at least {least} (ASTRA-sim reads an integer)")
    system = {key: value}
    path = write_json(tmp_path / "system.json", system)
    run = flint("simulate", all_reduce_trace(tmp_path / "ar", 8, 2**20), "--json", "--collectives", "astra-sim",
                "--system", path, "-o", tmp_path / "sim")
    assert run.returncode == 2 and run.stdout == "" and not (tmp_path / "sim").exists()
    assert run.stderr == f"error: system file {path}: {expected}\n"


def test_local_memory_bandwidth_from_the_system_file_times_the_estimators_reductions(tmp_path):
    """ASTRA-sim reduces each received message at `local-mem-bw`: 3 x floor(bytes / (GB/s)) ns for
    each of the n - 1 reduce-scatter steps. One 64 MiB all-reduce over 4 ranks, one chunk: messages
    of 16 MiB; at 100 GB/s against 1,000 GB/s, 3 x 3 x (167,772 - 16,777) ns longer. The estimator
    read the device's bandwidth whatever the file said, which ASTRA-sim obeys."""
    traces = all_reduce_trace(tmp_path / "ar", 4, 64 * 2**20)
    steps = [simulate(traces, "--collectives", "astra-sim", "-o", tmp_path / f"sim{bandwidth}", "--system",
                      write_json(tmp_path / f"s{bandwidth}.json", {**ONE_CHUNK, "local-mem-bw": bandwidth}))["step_us"]
             for bandwidth in (100, 1000)]
    assert steps[0] - steps[1] == pytest.approx(3 * 3 * (167_772 - 16_777) / 1e3)


def test_system_keys_are_read_as_astra_sim_reads_them(tmp_path):
    """A whole number written as a float (JSON's 2.0) is the integer ASTRA-sim reads, and an endpoint
    delay of 0 is taken: each times as its integer."""
    traces = all_reduce_trace(tmp_path / "ar", 8, 2**20)
    for written, whole in (({"preferred-dataset-splits": 2.0}, {"preferred-dataset-splits": 2}),
                           ({"active-chunks-per-dimension": 1.0}, {"active-chunks-per-dimension": 1}),
                           ({"endpoint-delay": 0.0}, {"endpoint-delay": 0})):
        steps = [simulate(traces, "--collectives", "astra-sim", "--system", write_json(tmp_path / "s.json", system),
                          "-o", tmp_path / "sim")["step_us"] for system in (written, whole)]
        assert steps[0] == steps[1]
