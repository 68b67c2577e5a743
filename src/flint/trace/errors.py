"""Errors raised while reading Chakra traces."""


class TraceFormatError(ValueError):
    """A trace file or comm-groups file cannot be decoded as the Chakra format.

    A ValueError subclass so callers validating user-supplied input can catch it with the
    usual exception for bad values.
    """


class GroupsFileError(TraceFormatError):
    """A comm-groups file that cannot be read as one: the file is the one to correct."""


class TraceLookupError(LookupError):
    """A part of a trace set asked for that it does not hold (a rank, a file's name that gives no
    rank); the message says what it holds instead."""
