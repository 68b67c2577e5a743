"""Without the torch extra, a PyTorch model file is refused in one line naming the extra.

Runs without torch installed: the import of torch or torch-mlir is made to fail either way.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import EXAMPLES


@pytest.mark.parametrize("module", ["torch", "torch_mlir"])
def test_missing_extra_is_one_line(tmp_path, module):
    """As if the extra were not installed: the import of `module` fails. Torch is imported first,
    so a missing torch-mlir can be told apart only where torch itself is installed."""
    if module != "torch":
        pytest.importorskip("torch")
    code = f"import sys; sys.modules[{module!r}] = None; from flint.cli import main; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "extract", str(EXAMPLES / "torch_mlp.py"), "--mesh", "2x4",
         "-o", str(tmp_path / "t")],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"error: torch_mlp.py is a PyTorch model and {module} is not installed: "
        "pip install 'flint-traces[torch]'"
    ]
