"""AO->MO integral transformation into BlockTensors (chemists' notation, real orbitals).

``(pq|rs)`` classes over the active occupied (o) and virtual (v) spaces, each stored
only at the blocks that point-group symmetry allows: oooo, ovoo, oovv, ovov, ovvv, vvvv.
The AO->MO step uses PySCF's ``ao2mo`` (libcint integrals); blocks are cut from it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyscf import ao2mo

from tessera.errors import InputError
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry
from tessera.tensor.space import IndexSpace

CLASSES = ("oooo", "ovoo", "oovv", "ovov", "ovvv", "vvvv")


@dataclass
class MOIntegrals:
    o: IndexSpace
    v: IndexSpace
    eo: np.ndarray            # active occupied orbital energies (space orbital order)
    ev: np.ndarray            # virtual orbital energies
    tensors: dict             # class name -> BlockTensor
    nfrozen: int

    def __getattr__(self, name):
        tensors = self.__dict__.get("tensors", {})
        if name in tensors:
            return tensors[name]
        raise AttributeError(name)

    def spaces(self, letters: str) -> tuple:
        """('o'|'v' per letter) -> spaces, e.g. spaces('oovv')."""
        return tuple(self.o if ch == "o" else self.v for ch in letters)

    @property
    def stored_elements(self) -> int:
        return sum(t.stored_elements for t in self.tensors.values())

    @property
    def dense_elements(self) -> int:
        return sum(t.dense_elements for t in self.tensors.values())


def make_spaces(orbsym, nocc: int, nfrozen: int, tile: int) -> tuple:
    """Active occupied and virtual spaces, orbitals grouped by irrep, tiles <= ``tile``."""
    orbsym = np.asarray(orbsym)
    if not 0 <= nfrozen < nocc:
        raise InputError(f"cannot freeze {nfrozen} of {nocc} occupied orbitals; "
                         "expected 0 <= frozen core < occupied")
    o = IndexSpace.from_irreps("o", orbsym[nfrozen:nocc], tile)
    v = IndexSpace.from_irreps("v", orbsym[nocc:], tile)
    return o, v


_SYMMETRY = {   # permutational symmetry carried as metadata (real orbitals)
    "oooo": (PermutationalSymmetry((1, 0, 3, 2)), PermutationalSymmetry((2, 3, 0, 1))),
    "ovov": (PermutationalSymmetry((2, 3, 0, 1)),),
    "oovv": (PermutationalSymmetry((1, 0, 3, 2)),),
    "ovoo": (PermutationalSymmetry((0, 1, 3, 2)),),
    "ovvv": (PermutationalSymmetry((0, 1, 3, 2)),),
    "vvvv": (PermutationalSymmetry((1, 0, 3, 2)), PermutationalSymmetry((2, 3, 0, 1))),
}


def transform(ref, nfrozen: int, tile: int) -> MOIntegrals:
    """MO integrals of the active orbitals of ``ref`` as frozen BlockTensors.

    The MO integrals come from PySCF's in-core ``ao2mo`` in 4-fold packed form
    (pairs p>=q); each class is cut from it one first-index tile at a time, keeping only
    allowed blocks, so no dense four-index array of any class is ever built.
    """
    o, v = make_spaces(ref.orbsym, ref.nocc, nfrozen, tile)
    coeff = ref.mo_coeff[:, nfrozen:]
    nocc = ref.nocc - nfrozen
    eri_ao = ref.mol.intor("int2e", aosym="s8")
    packed = ao2mo.incore.full(eri_ao, coeff, compact=True)      # (npair, npair), p>=q
    del eri_ao
    index = {"o": o.orbitals, "v": v.orbitals + nocc}            # space position -> active MO
    tensors = {}
    for name in CLASSES:
        sp = tuple(o if ch == "o" else v for ch in name)
        t = BlockTensor(sp, 0, name=name, symmetry=_SYMMETRY[name])
        cols = _pairs(index[name[2]], index[name[3]]).ravel()
        for tile0 in range(len(sp[0].tiles)):
            rows = _pairs(index[name[0]][sp[0].slice(tile0)], index[name[1]]).ravel()
            chunk = packed[np.ix_(rows, cols)].reshape(
                sp[0].tiles[tile0].size, sp[1].dim, sp[2].dim, sp[3].dim)
            for key in t.allowed_keys():
                if key[0] == tile0:
                    t.blocks[key] = np.ascontiguousarray(
                        chunk[(slice(None),) + tuple(s.slice(k) for s, k in zip(sp[1:], key[1:]))])
        tensors[name] = t.freeze()
    eo = ref.mo_energy[nfrozen:ref.nocc]
    ev = ref.mo_energy[ref.nocc:]
    return MOIntegrals(o, v, eo, ev, tensors, nfrozen)


def _pairs(p, q) -> np.ndarray:
    """Packed pair index of (p, q) for every p in ``p``, q in ``q`` (4-fold packing p>=q)."""
    hi = np.maximum(p[:, None], q[None, :])
    lo = np.minimum(p[:, None], q[None, :])
    return hi * (hi + 1) // 2 + lo


def denominator(spaces: tuple, energies: tuple, signs: tuple, name: str = "D") -> BlockTensor:
    """D[p q ...] = sum_n signs[n] * energies[n][p_n] at every allowed block (irrep 0)."""
    d = BlockTensor(spaces, 0, name=name)
    for key in d.allowed_keys():
        blk = np.zeros(d.block_shape(key))
        for n, (s, e, sign, t) in enumerate(zip(spaces, energies, signs, key)):
            shape = [1] * len(spaces)
            shape[n] = -1
            blk = blk + sign * e[s.orbitals[s.slice(t)]].reshape(shape)
        d.blocks[key] = blk
    return d.freeze()
