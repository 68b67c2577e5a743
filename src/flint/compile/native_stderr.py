"""Hold back what XLA's native code prints on stderr, below Python.

XLA and its plugins log through their own copies of absl, which Python's settings do not reach: the
CUDA plugin says it found no CUDA driver each time JAX starts (none is needed), and the GPU compiler
logs a line for every dump or temporary file it cannot write, hundreds when the temp directory is
full. Flint reports a failure in one line of its own, so these are caught at the file descriptor.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator

from flint.errors import FlintError


@contextlib.contextmanager
def native_stderr_held(replay_on_error: bool) -> Iterator[None]:
    """Send file descriptor 2 to a temporary file for the duration. With `replay_on_error`, what
    was held is passed on if the block fails unexpectedly (not with a `FlintError`, which says what
    to do in its own line); otherwise it is dropped, for a caller that turns XLA's exception into
    that line itself."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except FlintError:
            raise
        except BaseException:
            if replay_on_error:
                os.dup2(saved, 2)
                held.seek(0)
                os.write(2, held.read())
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
