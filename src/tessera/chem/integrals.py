"""AO->MO integral transformation into BlockTensors (chemists' notation, real orbitals).

``(pq|rs)`` classes over the active occupied (o) and virtual (v) spaces, each stored
only at the blocks that point-group symmetry allows: oooo, ovoo, oovv, ovov, ovvv, vvvv.

Serial (local tensors): PySCF's in-core ``ao2mo`` (libcint integrals, 8-fold packed);
blocks are cut from its 4-fold packed result.

Distributed (tensors created inside a distributed context): each rank computes a share of
the AO integrals and transforms it; see ``chem/integrals_distributed.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pyscf import ao2mo

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
    transform_stats: dict = field(default_factory=dict)   # this rank's share (distributed)

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


def make_spaces(orbsym, nocc: int, nfrozen: int, tile: int, occ_tile: int | None = None) -> tuple:
    """Active occupied and virtual spaces, orbitals grouped by irrep, tiles <= ``tile``
    (occupied tiles <= ``occ_tile`` when given).

    The orbitals of an irrep are split into the fewest tiles of at most ``tile`` and of
    near-equal size (13 orbitals with tile 12 give 7 + 6, not 12 + 1), which keeps block
    sizes and so work and memory per rank even.
    """
    orbsym = np.asarray(orbsym)
    if not 0 <= nfrozen < nocc:
        raise InputError(f"cannot freeze {nfrozen} of {nocc} occupied orbitals; "
                         "expected 0 <= frozen core < occupied")
    occ_tile = tile if occ_tile is None else occ_tile
    for t in (tile, occ_tile):
        if not isinstance(t, (int, np.integer)) or isinstance(t, bool) or t <= 0:
            raise InputError(f"tile size must be a positive integer, got {t!r}; use e.g. --tile 32")
    return _even_space("o", orbsym[nfrozen:nocc], int(occ_tile)), _even_space("v", orbsym[nocc:], int(tile))


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


def class_tensor(name: str, o: IndexSpace, v: IndexSpace) -> BlockTensor:
    """The (empty) tensor of integral class ``name`` (e.g. "ovvv") over the spaces o, v."""
    return BlockTensor(tuple(o if ch == "o" else v for ch in name), 0, name=name,
                       symmetry=_SYMMETRY[name], placement="pairs")


SLAB_BYTES = 64 * 2**20   # working slab of the distributed transform (see module docstring)


def transform(ref, nfrozen: int, tile: int, *, occ_tile: int | None = None,
              slab_bytes: int | None = None) -> MOIntegrals:
    """MO integrals of the active orbitals of ``ref`` as frozen BlockTensors.

    Local tensors: the MO integrals come from PySCF's in-core ``ao2mo`` in 4-fold packed
    form (pairs p>=q); each class is cut from it one first-index tile at a time, keeping
    only allowed blocks, so no dense four-index array of any class is ever built.
    Distributed tensors: see the module docstring; ``slab_bytes`` (default SLAB_BYTES)
    bounds its working arrays and is used only there. ``occ_tile`` (default ``tile``)
    bounds the occupied tiles.
    """
    o, v = make_spaces(ref.orbsym, ref.nocc, nfrozen, tile, occ_tile)
    coeff = ref.mo_coeff[:, nfrozen:]
    nocc = ref.nocc - nfrozen
    index = {"o": o.orbitals, "v": v.orbitals + nocc}            # space position -> active MO
    tensors = {name: class_tensor(name, o, v) for name in CLASSES}
    eo = ref.mo_energy[nfrozen:ref.nocc]
    ev = ref.mo_energy[ref.nocc:]
    if any(t.dist is not None for t in tensors.values()):
        if slab_bytes is None:
            slab_bytes = SLAB_BYTES
        if not isinstance(slab_bytes, (int, np.integer)) or slab_bytes <= 0:
            raise InputError(f"slab_bytes must be a positive integer, got {slab_bytes!r}; "
                             "leave it unset for the default (64 MiB)")
        from tessera.chem.integrals_distributed import transform_distributed
        stats = transform_distributed(ref.mol, np.ascontiguousarray(coeff), index, tensors,
                                       int(slab_bytes))
        for name, t in tensors.items():
            tensors[name] = t.freeze()
        return MOIntegrals(o, v, eo, ev, tensors, nfrozen, stats)
    eri_ao = ref.mol.intor("int2e", aosym="s8")
    packed = ao2mo.incore.full(eri_ao, coeff, compact=True)      # (npair, npair), p>=q
    del eri_ao
    for name in CLASSES:
        sp = tuple(o if ch == "o" else v for ch in name)
        t = tensors[name]
        cols = pair_index(index[name[2]], index[name[3]]).ravel()
        for tile0 in range(len(sp[0].tiles)):
            rows = pair_index(index[name[0]][sp[0].slice(tile0)], index[name[1]]).ravel()
            chunk = packed[np.ix_(rows, cols)].reshape(
                sp[0].tiles[tile0].size, sp[1].dim, sp[2].dim, sp[3].dim)
            for key in t.allowed_keys():
                if key[0] == tile0:
                    t.blocks[key] = np.ascontiguousarray(
                        chunk[(slice(None),) + tuple(s.slice(k) for s, k in zip(sp[1:], key[1:]))])
        tensors[name] = t.freeze()
    return MOIntegrals(o, v, eo, ev, tensors, nfrozen)


def pair_index(p, q) -> np.ndarray:
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
