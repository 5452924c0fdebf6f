"""Tessera: block-sparse, symmetry-aware tensor engine for many-body quantum chemistry."""

from tessera.backends.context import Context, current_context
from tessera.errors import TesseraError
from tessera.expr.ops import dot, einsum
from tessera.expr.terms import equations
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry
from tessera.tensor.space import IndexSpace, Tile

__version__ = "0.1.0"
__all__ = ["BlockTensor", "Context", "IndexSpace", "PermutationalSymmetry", "TesseraError", "Tile",
           "current_context", "dot", "einsum", "equations", "__version__"]
