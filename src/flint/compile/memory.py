"""How much device memory one rank of the compiled step needs, as the compiler's buffer assignment
says: what answers "does it fit?" before any simulation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes per rank: the arguments (parameter and optimizer shards, the batch), the outputs, the
    temporaries the compiler allocates, and the part of the outputs that reuses argument buffers
    (donated inputs), which is counted once; `donated` is what the donated arguments hold (of
    which XLA aliases what an output of the same per-rank shape replaces)."""

    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    donated: int = 0

    @property
    def peak(self) -> int:
        """Everything live at once: arguments, temporaries and the outputs that reuse no argument
        buffer (aliased bytes once). A step that donates its training state needs one copy of it."""
        return self.arguments + self.outputs + self.temporaries - self.aliased

    @classmethod
    def of(cls, compiled) -> "DeviceMemory | None":
        """Read from a compiled executable; None where the backend does not say."""
        stats = compiled.memory_analysis()
        if stats is None:
            return None
        return cls(
            arguments=stats.argument_size_in_bytes,
            outputs=stats.output_size_in_bytes,
            temporaries=stats.temp_size_in_bytes,
            aliased=stats.alias_size_in_bytes,
        )

    def as_json(self) -> dict[str, int]:
        return {
            "arguments": self.arguments,
            "outputs": self.outputs,
            "temporaries": self.temporaries,
            "aliased": self.aliased,
            "donated": self.donated,
            "peak": self.peak,
        }
