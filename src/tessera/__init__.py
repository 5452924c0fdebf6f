"""Tessera: block-sparse, symmetry-aware tensor engine for many-body quantum chemistry."""

from tessera.errors import TesseraError

__version__ = "0.1.0"
__all__ = ["TesseraError", "__version__"]
