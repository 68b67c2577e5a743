"""Errors raised while reading Chakra traces."""


class TraceFormatError(ValueError):
    """A trace file or comm-groups file cannot be decoded as the Chakra format.

    A ValueError subclass so callers validating user-supplied input can catch it with the
    usual exception for bad values.
    """
