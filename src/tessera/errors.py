"""One exception family for everything Tessera reports to a user.

Every message says what was wrong, what was expected, and what to do.
"""


class TesseraError(Exception):
    """Base of every error Tessera raises on purpose."""


class InputError(TesseraError):
    """Bad user input: a file, an option, a molecule."""


class SymmetryError(TesseraError):
    """A block or tensor that its symmetry does not allow."""


class ShapeError(TesseraError):
    """Index strings, spaces or array shapes that do not fit together."""


class ConvergenceError(TesseraError):
    """An iterative method did not converge; carries the last state."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class RuntimeLayerError(TesseraError):
    """Bad use of the distributed runtime (global arrays, counters, progress)."""


class OutputError(TesseraError):
    """A result file that cannot be written (folder gone, disk full, permissions)."""


class BuildError(TesseraError):
    """A compiled part of Tessera is missing: the install did not build it."""
