"""`examples/torch_gpt.py`'s GPT with its dimensions as model arguments, for held-out PyTorch steps.

    flint extract bench/models/torch_gpt_sized.py --mesh 1 --backend gpu:h200 \\
        --model-arg d_model=1024 --model-arg heads=16 --model-arg d_ff=4096 --model-arg layers=24 \\
        --model-arg vocab=50304 --model-arg seq=1024 --model-arg batch=8 -o traces/

The example's code, unchanged (its own file is loaded): `model()` takes the module's dimensions and
`example_inputs()` the batch's, each defaulting to the example's. `bench/torch_steps.toml` names
the sizes that were run on a real GPU (`bench/measure_gpu.py`).
"""

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "torch_gpt_example", Path(__file__).resolve().parent.parent.parent / "examples" / "torch_gpt.py"
)
torch_gpt = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = torch_gpt  # importable by name, as torch.compile's tracer looks modules up
_spec.loader.exec_module(torch_gpt)
_DEFAULT = torch_gpt.CONFIG


def model(vocab=_DEFAULT.vocab, d_model=_DEFAULT.d_model, heads=_DEFAULT.heads, d_ff=_DEFAULT.d_ff,
          layers=_DEFAULT.layers):
    return torch_gpt.model(torch_gpt.Config(vocab=vocab, d_model=d_model, heads=heads, d_ff=d_ff, layers=layers))


def example_inputs(seq=_DEFAULT.seq, batch=_DEFAULT.batch):
    return torch_gpt.example_inputs(torch_gpt.Config(seq=seq, batch=batch))


loss_fn = torch_gpt.loss_fn
optimizer = torch_gpt.optimizer
optimizer_options = torch_gpt.optimizer_options
