"""The one exception type the CLI turns into a one-line message.

Every stage raises `FlintError` for problems the user can fix (bad flags, a broken model file, a sharding
that does not divide); anything else is a bug and keeps its traceback under `--debug`.
"""


class FlintError(Exception):
    """A problem with the user's input, phrased as what was wrong and what to do about it."""
