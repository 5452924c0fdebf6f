"""Imports that the run's libraries make but a run never uses, deferred to first use.

Two modules cost a quarter of a run's import time (0.51 -> 0.37 s CPU to import
``tessera.chem.job``, median of 8, measured under load) and are never touched by a run:

- ``numpy.f2py``: SciPy's array-API shim (``scipy._lib.array_api_compat``, imported with
  ``scipy.linalg``) asks numpy for every name it lists, and numpy imports f2py to answer;
- ``scipy.optimize``: PySCF's ``pyscf.scf.diis`` imports it at module level for its
  EDIIS/ADIIS, which Tessera never calls (its DIIS is ``chem.diis``).

``defer`` puts an empty module object in their place; the module's code runs on the first
attribute anyone reads from it (``scipy.optimize.minimize``, ``from scipy.optimize import
x``), so whoever does use one gets the real module. ``importlib.util.LazyLoader`` would
not do: an ``import`` statement reads ``__spec__``, which makes it load at once. Only for
a program (``cli.main``): in another caller's process it would change that caller's
modules. One lock serialises the first use; a run's worker threads never touch these
modules, so the first use comes from the main thread (a worker importing a submodule of
one while another thread loads it could wait on both locks).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types

DEFERRED = ("numpy.f2py", "scipy.optimize")

_LOCK = threading.RLock()


class _Deferred(types.ModuleType):
    """A module whose code has not run yet; any attribute it lacks runs it (once)."""

    def __getattr__(self, attr):
        with _LOCK:
            if type(self) is _Deferred:
                if self.__dict__.get("_loading"):     # its own code asked (``from . import x``)
                    raise AttributeError(attr)
                self.__dict__["_loading"] = True
                try:
                    self.__spec__.loader.exec_module(self)
                except BaseException:
                    sys.modules.pop(self.__name__, None)     # a later import tries afresh
                    raise
                finally:
                    del self.__dict__["_loading"]
                self.__class__ = types.ModuleType
        return getattr(self, attr)


def defer(names=DEFERRED) -> None:
    """Put a deferred module in place of each of ``names`` not imported yet."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            continue            # not installed: nothing imports it either
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _Deferred
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)
