"""Tessera: block-sparse, symmetry-aware tensor engine for many-body quantum chemistry."""

from importlib import metadata as _metadata

from tessera.backends.context import Context, current_context
from tessera.errors import TesseraError
from tessera.expr.ops import dot, einsum
from tessera.expr.terms import equations
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry
from tessera.tensor.space import IndexSpace, Tile

try:
    __version__ = _metadata.version("tessera")
except _metadata.PackageNotFoundError:       # sources on the path, not installed
    __version__ = "0+unknown"

__all__ = ["BlockTensor", "CCSD", "Context", "IndexSpace", "PermutationalSymmetry", "RHF", "TesseraError",
           "Tile", "current_context", "dot", "einsum", "equations", "__version__"]


def __getattr__(name):
    """``tessera.CCSD`` and ``tessera.RHF`` (PySCF-style classes) import the chemistry on first use."""
    if name in ("CCSD", "RHF"):
        from tessera.chem import pyscf_api
        return getattr(pyscf_api, name)
    raise AttributeError(f"module 'tessera' has no attribute {name!r}")
