"""`examples/pipeline_manual.py` (GPipe written by hand with shard_map and ppermute) on pp=4 x dp=2:
every rank's SENDs and RECVs against the traffic derived from the example's constants.

Rank r = p * dp + d (stage p, data position d). GPipe runs T = M + S - 1 ticks and moves the state
one stage on after every tick but the last: M + S - 2 forward permutes, each transposed into one
backward permute by `jax.grad`. A stage sends forward to p + 1 (p < S - 1) and receives from p - 1
(p > 0); backward the other way round. Each carries one microbatch's activation (or its gradient),
bf16 [mb, SEQ, D_MODEL] with mb = BATCH / dp / M sequences.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter

import pytest
from conftest import EXAMPLES, assert_sends_match_receives, extract, transfers

from flint.trace.contract import check_traces

S, DP = 4, 2
sys.path.insert(0, str(EXAMPLES))  # the example imports gpt.py beside it, as Flint lets it
_spec = importlib.util.spec_from_file_location("pipeline_manual", EXAMPLES / "pipeline_manual.py")
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)
sys.path.remove(str(EXAMPLES))
gpt = example.gpt
M = example.MICROBATCHES
PERMUTES = M + S - 2
ACTIVATION_BYTES = gpt.BATCH // DP // M * gpt.SEQ * gpt.D_MODEL * 2


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline_manual") / "traces"
    extract(EXAMPLES / "pipeline_manual.py", f"pp={S},dp={DP}", out)
    return out


def test_activation_bytes_by_hand():
    assert ACTIVATION_BYTES == 2 * 128 * 256 * 2


def test_each_stage_sends_and_receives_from_its_neighbours(traces):
    found = transfers(traces)
    assert sorted(found) == list(range(S * DP))
    for rank, ts in found.items():
        p, d = divmod(rank, DP)
        expected = Counter()
        if p < S - 1:  # forward to the next stage, gradients back from it
            expected[True, rank, rank + DP] += PERMUTES
            expected[False, rank + DP, rank] += PERMUTES
        if p > 0:  # forward from the previous stage, gradients back to it
            expected[False, rank - DP, rank] += PERMUTES
            expected[True, rank, rank - DP] += PERMUTES
        assert Counter((t.send, t.src, t.dst) for t in ts) == expected, rank
        assert {t.size for t in ts} == {ACTIVATION_BYTES}


def test_every_send_has_its_receive(traces):
    assert_sends_match_receives(transfers(traces))
    assert check_traces(traces) == []


def test_forward_permutes_come_before_backward_ones(traces):
    """On a middle stage the first M + S - 2 SENDs go forward, the rest backward."""
    rank = 1 * DP
    sends = [t for t in transfers(traces)[rank] if t.send]
    assert [t.dst for t in sends] == [rank + DP] * PERMUTES + [rank - DP] * PERMUTES
