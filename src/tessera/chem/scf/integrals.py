"""Two-electron integrals over shell blocks, from libcint (through PySCF's C drivers).

PySCF stays the source of basis sets and Gaussian integrals; this module only asks
libcint for one block quartet ``(AB|CD)`` at a time, with a ``shls_slice``, exactly as
``pyscf.gto.moleintor.getints4c`` does, but with the argument arrays and the libcint
optimizer (``cintopt``) prepared once instead of on every call: a Fock build makes
thousands of such calls per iteration.

Also the Schwarz bounds Q_ij = sqrt(max |(ij|ij)|) per shell pair (Haser and Ahlrichs,
J. Comput. Chem. 10, 104 (1989)): |(ij|kl)| <= Q_ij Q_kl.
"""

from __future__ import annotations

import ctypes

import numpy as np
from pyscf.gto import moleintor

from tessera.chem.scf.blocking import ShellBlocks


class BlockERI:
    """Callable computing the integral block ``(ij|kl)`` for shell ranges, shape
    ``(ni, nj, nk, nl)``, chemists' notation, real spherical (or Cartesian) AOs."""

    def __init__(self, mol):
        self.intor_name = mol._add_suffix("int2e")
        self._atm = np.asarray(mol._atm, dtype=np.int32, order="C")
        self._bas = np.asarray(mol._bas, dtype=np.int32, order="C")
        self._env = np.asarray(mol._env, dtype=np.double, order="C")
        self.ao_loc = np.asarray(moleintor.make_loc(self._bas, self.intor_name),
                                 dtype=np.int32)
        self._natm = ctypes.c_int(self._atm.shape[0])
        self._nbas = ctypes.c_int(self._bas.shape[0])
        self._cintopt = moleintor.make_cintopt(self._atm, self._bas, self._env,
                                               self.intor_name)
        lib = moleintor.libcgto
        self._drv = lib.GTOnr2e_fill_drv
        self._fill = lib.GTOnr2e_fill_s1
        self._intor = getattr(lib, self.intor_name)
        self._null = ctypes.c_void_p()
        self._args_tail = (
            self.ao_loc.ctypes.data_as(ctypes.c_void_p), self._cintopt,
            self._atm.ctypes.data_as(ctypes.c_void_p), self._natm,
            self._bas.ctypes.data_as(ctypes.c_void_p), self._nbas,
            self._env.ctypes.data_as(ctypes.c_void_p))

    def __call__(self, i0, i1, j0, j1, k0, k1, l0, l1, out=None) -> np.ndarray:
        loc = self.ao_loc
        shape = (int(loc[i1] - loc[i0]), int(loc[j1] - loc[j0]),
                 int(loc[k1] - loc[k0]), int(loc[l1] - loc[l0]))
        if out is None:
            out = np.empty(shape)
        else:
            out = out.ravel()[:np.prod(shape)].reshape(shape)
        if out.size:
            self._drv(self._intor, self._fill, self._null,
                      out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(1),
                      (ctypes.c_int * 8)(i0, i1, j0, j1, k0, k1, l0, l1),
                      *self._args_tail)
        return out

    def blocks(self, blocks: ShellBlocks, a, b, c, d, out=None) -> np.ndarray:
        """The block quartet (AB|CD) for shell blocks a, b, c, d."""
        sr = blocks.shell_ranges
        return self(*sr[a], *sr[b], *sr[c], *sr[d], out=out)


def schwarz_bounds(eri: BlockERI, blocks: ShellBlocks) -> np.ndarray:
    """Q[i, j] = sqrt(max over functions of |(ij|ij)|) for every shell pair, (nbas, nbas).

    Computed one block pair at a time: the diagonal of (AB|AB) holds every (ij|ij) with
    i in A and j in B.
    """
    ao_loc = blocks.ao_loc
    nbas = len(ao_loc) - 1
    q = np.zeros((nbas, nbas))
    for a in range(blocks.nblocks):
        for b in range(a + 1):
            g = eri.blocks(blocks, a, b, a, b)
            diag = np.abs(np.einsum("abab->ab", g))
            sa0, sa1 = blocks.shell_ranges[a]
            sb0, sb1 = blocks.shell_ranges[b]
            ra = ao_loc[sa0:sa1] - ao_loc[sa0]
            rb = ao_loc[sb0:sb1] - ao_loc[sb0]
            m = np.maximum.reduceat(np.maximum.reduceat(diag, ra, axis=0), rb, axis=1)
            q[sa0:sa1, sb0:sb1] = m
            q[sb0:sb1, sa0:sa1] = m.T
    return np.sqrt(q)
