"""Loading Tessera's compiled parts: C sources built by the install (setuptools
``ext-modules`` of ``pyproject.toml``) with no Python API of their own, plain functions
on pointers called through ctypes (which releases the GIL).

Each C source exports ``int tessera_abi_version(void)``; the caller names the version its
argument lists were written for. A part that is missing, does not load, or was built
from another version of its source (a stale ``.so`` beside edited sources) is one
``BuildError`` naming ``make``, never a call with the wrong arguments.
"""

from __future__ import annotations

import ctypes
import importlib.util

from tessera.errors import BuildError

__all__ = ["load"]


def load(module: str, abi: int, what: str) -> ctypes.CDLL:
    """The compiled ``module`` (e.g. ``tessera.chem._triples_kernel``), checked to be
    built from the source version ``abi``; ``what`` names it in the error."""
    fix = "run `make` (or `pip install -e .`) in the Tessera checkout, which needs a C compiler"
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        raise BuildError(f"{what} {module} is not built; {fix}")
    try:
        lib = ctypes.CDLL(spec.origin)
        built = lib.tessera_abi_version()
    except (OSError, AttributeError) as exc:
        raise BuildError(f"{what} {spec.origin} does not load ({exc}); {fix}") from None
    if built != abi:
        raise BuildError(f"{what} {spec.origin} was built from another version of its source "
                         f"(version {built}, this Tessera needs {abi}); {fix}")
    return lib
