"""`examples/torch_gpt.py` at 1.5B parameters, to show that PyTorch models extract from shapes alone.

D_MODEL 2048, 16 heads, D_FF 8192, 26 layers, vocabulary 50,304: 26 · (4·D² + 2·D·D_FF + 4·D) +
2·V·D + 2·D = 1,514,885,120 parameters (3 GB of bf16 weights plus 12 GB of f32 AdamW moments, none allocated:
the module is built on the meta device and traced over fake tensors). Batch 8 of 1,024 tokens.

    /usr/bin/time -v flint extract bench/torch_big.py --mesh 8x8 --strategy dp+tp -o traces/
"""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "torch_gpt_example", Path(__file__).resolve().parent.parent / "examples" / "torch_gpt.py"
)
torch_gpt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_gpt)

BIG = torch_gpt.Config(vocab=50304, d_model=2048, heads=16, d_ff=8192, layers=26, seq=1024, batch=8)


def model():
    return torch_gpt.model(BIG)


def example_inputs():
    return torch_gpt.example_inputs(BIG)


loss_fn = torch_gpt.loss_fn
optimizer = torch_gpt.optimizer
optimizer_options = torch_gpt.optimizer_options
tp_plan = torch_gpt.tp_plan
