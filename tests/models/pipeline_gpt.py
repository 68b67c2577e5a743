"""`examples/gpt.py` with 16 layers and a 256-word vocabulary, for pipelining tests.

16 layers make 4 per stage on 4 stages (2 per chunk with 2 virtual stages). The small vocabulary
keeps the embedding and the head light next to the layers, so every stage does about the same work
and GPipe's bubble is close to its textbook value.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gpt  # noqa: E402

sys.path.pop(0)

LAYERS, VOCAB = 16, 256


def workload(mesh):
    return gpt.workload(mesh, layers=LAYERS, vocab=VOCAB)


logical_rules = gpt.logical_rules
