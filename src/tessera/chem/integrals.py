"""AO->MO integral transformation into BlockTensors (chemists' notation, real orbitals).

``(pq|rs)`` classes over the active occupied (o) and virtual (v) spaces, each stored
only at the blocks that point-group symmetry allows: oooo, ovoo, oovv, ovov, ovvv, vvvv.
The AO->MO step uses PySCF's ``ao2mo`` (libcint integrals); blocks are cut from it.

Distributed tensors (created inside a distributed context) are filled by their owners:
every rank transforms only its share. The integral classes are placed by first-pair
groups (``placement="pairs"``: all blocks sharing their first two tiles live on one
rank), so a rank half-transforms the first index pair only for the first-index tiles it
owns (PySCF ``half_e1``), then the second pair only for its own groups. Memory per rank:
the AO integrals (8-fold packed, nao^4/8, replicated: every rank computes them), one
half-transformed slab (first tile x second space x nao^2/2) at a time, and its share
of the MO blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyscf import ao2mo, lib

from tessera.errors import InputError
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry
from tessera.tensor.space import IndexSpace, Tile

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
    """Active occupied and virtual spaces, orbitals grouped by irrep, tiles <= ``tile``.

    The orbitals of an irrep are split into the fewest tiles of at most ``tile`` and of
    near-equal size (13 orbitals with tile 12 give 7 + 6, not 12 + 1), which keeps block
    sizes and so work and memory per rank even.
    """
    orbsym = np.asarray(orbsym)
    if not 0 <= nfrozen < nocc:
        raise InputError(f"cannot freeze {nfrozen} of {nocc} occupied orbitals; "
                         "expected 0 <= frozen core < occupied")
    if not isinstance(tile, (int, np.integer)) or isinstance(tile, bool) or tile <= 0:
        raise InputError(f"tile size must be a positive integer, got {tile!r}; use e.g. --tile 32")
    return _even_space("o", orbsym[nfrozen:nocc], int(tile)), _even_space("v", orbsym[nocc:], int(tile))


def _even_space(name: str, irreps, tile: int) -> IndexSpace:
    """Like IndexSpace.from_irreps, with each irrep cut into near-equal tiles."""
    irreps = np.asarray(irreps, dtype=np.int64)
    tiles, order, offset = [], [], 0
    for g in sorted(set(irreps.tolist())):
        members = np.flatnonzero(irreps == g)
        ntiles = -(-len(members) // tile)
        for chunk in np.array_split(members, ntiles):
            tiles.append(Tile(len(chunk), int(g), offset))
            order.extend(chunk.tolist())
            offset += len(chunk)
    return IndexSpace(name, tiles, order)


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
    index = {"o": o.orbitals, "v": v.orbitals + nocc}            # space position -> active MO
    tensors = {name: BlockTensor(tuple(o if ch == "o" else v for ch in name), 0, name=name,
                                 symmetry=_SYMMETRY[name], placement="pairs") for name in CLASSES}
    if any(t.dist is not None for t in tensors.values()):
        for name, t in tensors.items():
            _fill_owned(t, eri_ao, [coeff[:, index[ch]] for ch in name])
            tensors[name] = t.freeze()
        del eri_ao
        return MOIntegrals(o, v, ref.mo_energy[nfrozen:ref.nocc], ref.mo_energy[ref.nocc:], tensors, nfrozen)
    packed = ao2mo.incore.full(eri_ao, coeff, compact=True)      # (npair, npair), p>=q
    del eri_ao
    for name in CLASSES:
        sp = tuple(o if ch == "o" else v for ch in name)
        t = tensors[name]
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


def _fill_owned(t, eri_ao, coeffs) -> None:
    """Fill the blocks of ``t`` this rank owns: (PQ|rs) for its first-pair groups.

    ``coeffs[n]`` are the MO coefficients of axis n in space-position order. The first
    pair is half-transformed once per first-index tile this rank owns (all second-index
    orbitals), the second pair per owned group.
    """
    sp = t.spaces
    by_first: dict = {}
    for key in t.owned_keys():
        by_first.setdefault(key[0], {}).setdefault(key[1], []).append(key)
    nao = coeffs[0].shape[0]
    for tile0, groups in sorted(by_first.items()):
        s0 = sp[0].slice(tile0)
        n0, n1 = s0.stop - s0.start, sp[1].dim
        half = ao2mo.incore.half_e1(eri_ao, (coeffs[0][:, s0], coeffs[1]), compact=False)
        half = half.reshape(n0, n1, -1)                        # (P, q, kl packed)
        for tile1, keys in sorted(groups.items()):
            s1 = sp[1].slice(tile1)
            rows = lib.unpack_tril(half[:, s1].reshape(-1, half.shape[2]))        # (P q, nao, nao)
            npq = rows.shape[0]
            tmp = (rows.reshape(npq * nao, nao) @ coeffs[3]).reshape(npq, nao, -1)  # (P q, lam, s)
            del rows
            slab = (coeffs[2].T @ tmp.transpose(1, 0, 2).reshape(nao, -1))          # (r, P q s)
            slab = slab.reshape(sp[2].dim, n0, s1.stop - s1.start, sp[3].dim).transpose(1, 2, 0, 3)
            for key in keys:
                t.store_block(key, slab[:, :, sp[2].slice(key[2]), sp[3].slice(key[3])])
        del half


def _pairs(p, q) -> np.ndarray:
    """Packed pair index of (p, q) for every p in ``p``, q in ``q`` (4-fold packing p>=q)."""
    hi = np.maximum(p[:, None], q[None, :])
    lo = np.minimum(p[:, None], q[None, :])
    return hi * (hi + 1) // 2 + lo


def denominator(spaces: tuple, energies: tuple, signs: tuple, name: str = "D") -> BlockTensor:
    """D[p q ...] = sum_n signs[n] * energies[n][p_n] at every allowed block (irrep 0)."""
    d = BlockTensor(spaces, 0, name=name)
    for key in d.owned_keys():
        blk = np.zeros(d.block_shape(key))
        for n, (s, e, sign, t) in enumerate(zip(spaces, energies, signs, key)):
            shape = [1] * len(spaces)
            shape[n] = -1
            blk = blk + sign * e[s.orbitals[s.slice(t)]].reshape(shape)
        d.store_block(key, blk)
    return d.freeze()
