"""`examples/gpt.py` written as Megatron-LM writes its step: `step(params, opt, tokens, targets)`,
the batch as two arguments, for pipelining every batch input."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gpt  # noqa: E402

sys.path.pop(0)

LAYERS, VOCAB, BATCH = 4, 256, 16


def step(params, opt, tokens, targets):
    return gpt.step(params, opt, {"tokens": tokens, "targets": targets})


def workload(mesh):
    _, (params, opt, batch) = gpt.workload(mesh, layers=LAYERS, vocab=VOCAB, batch=BATCH)
    return step, (params, opt, batch["tokens"], batch["targets"])


logical_rules = gpt.logical_rules
