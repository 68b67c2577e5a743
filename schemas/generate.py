"""Regenerate the Python code in ``src/flint/schema/`` from every ``schemas/*.proto``.

Usage: ``python schemas/generate.py [OUTPUT_DIR]`` (default: ``src/flint/schema``).

Each proto is compiled from a staging tree at ``flint/schema/<name>.proto`` so that the
generated classes record ``flint.schema.<name>_pb2`` as their module (messages then pickle,
e.g. across worker processes) and the descriptor file names cannot clash with another
package's ``et_def.proto`` in the same descriptor pool; the protos' own packages (``flint.chakra``,
``flint.xla``) keep their message names apart likewise. The output depends only on the
proto text and the grpcio-tools version, so the committed files can be checked by
regenerating them into a temporary directory and comparing bytes.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent
PROTOS = sorted(SCHEMA_DIR.glob("*.proto"))
DEFAULT_OUT = SCHEMA_DIR.parent / "src" / "flint" / "schema"
STAGED = Path("flint") / "schema"


def generate(out_dir: Path = DEFAULT_OUT) -> list[Path]:
    """Compile every schema and return the paths of the written ``*_pb2.py`` files."""
    with tempfile.TemporaryDirectory() as tmp:
        include, gen = Path(tmp) / "include", Path(tmp) / "gen"
        (include / STAGED).mkdir(parents=True)
        gen.mkdir()
        for proto in PROTOS:
            shutil.copyfile(proto, include / STAGED / proto.name)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"--proto_path={include}",
                f"--python_out={gen}",
                *((STAGED / proto.name).as_posix() for proto in PROTOS),
            ],
            check=True,
        )
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for proto in PROTOS:
            name = f"{proto.stem}_pb2.py"
            shutil.copyfile(gen / STAGED / name, out_dir / name)
            written.append(out_dir / name)
    return written


if __name__ == "__main__":
    if len(sys.argv) > 2:
        sys.exit(f"usage: {sys.argv[0]} [OUTPUT_DIR]")
    for path in generate(Path(sys.argv[1]) if len(sys.argv) == 2 else DEFAULT_OUT):
        print(path)
