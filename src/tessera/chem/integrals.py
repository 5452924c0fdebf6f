"""AO->MO integral transformation into BlockTensors (chemists' notation, real orbitals).

``(pq|rs)`` classes over the active occupied (o) and virtual (v) spaces, each stored
only at the blocks that point-group symmetry allows: oooo, ovoo, oovv, ovov, ovvv, vvvv.

The transformation is task sets run on the current context (``chem/ao2mo.py``): one
driver for local and distributed tensors alike; on a local context with the 8-fold AO
integrals in memory (the SCF's when it kept them) when they fit the memory budget. A reference of the MO kind (an
FCIDUMP: integrals without a basis) has its class blocks cut from its packed MO
integrals instead, by their owners (one task set, ``mo_classes``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
from tessera.errors import InputError
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry
from tessera.tensor.space import IndexSpace, Tile

log = logging.getLogger(__name__)

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
    "vvvv": (PermutationalSymmetry((1, 0, 2, 3)), PermutationalSymmetry((0, 1, 3, 2)),
             PermutationalSymmetry((2, 3, 0, 1))),
}
CANONICAL = ("vvvv",)   # stored as canonical blocks (8-fold: about 1/8 of the blocks)


def class_tensor(name: str, o: IndexSpace, v: IndexSpace) -> BlockTensor:
    """The (empty) tensor of integral class ``name`` (e.g. "ovvv") over the spaces o, v;
    placed as ``pieces`` (written with ``put_block``, then only read: a distributed run
    may store a block of a class with few blocks over several ranks)."""
    return BlockTensor(tuple(o if ch == "o" else v for ch in name), 0, name=name,
                       symmetry=_SYMMETRY[name], canonical=name in CANONICAL, placement="pieces")


SLAB_BYTES = 64 * 2**20   # working slab of the transform per thread (see chem/ao2mo.py)


def transform(ref, nfrozen: int, tile: int, *, occ_tile: int | None = None,
              slab_bytes: int | None = None, max_memory_mb: float | None = None,
              context=None) -> MOIntegrals:
    """MO integrals of the active orbitals of ``ref`` as frozen BlockTensors.

    The tensors live on ``context``'s storage (default: the current context; spread over
    the ranks for a distributed one) and are filled by its executor (``chem/ao2mo.py``);
    ``slab_bytes`` (default SLAB_BYTES) bounds the working arrays per thread.
    ``occ_tile`` (default ``tile``) bounds the occupied tiles. On a local context
    (serial, threads) the 8-fold AO integrals are kept in memory when they fit the
    memory budget per rank (``backends.budget``: ``max_memory_mb``, MiB as --max-memory,
    else TESSERA_MEMORY_PER_RANK_MB, else the memory available now): the SCF's own when
    the reference still holds them (``ref.ao_integrals``, taken), else computed once;
    otherwise the transform goes by AO units of ``slab_bytes`` (said in the log).
    """
    from tessera.backends.budget import memory_budget
    from tessera.backends.context import current_context
    from tessera.chem.ao2mo import transform_classes
    from tessera.chem.scf.incore import s8_bytes, s8_fits

    context = current_context() if context is None else context
    if slab_bytes is None:
        slab_bytes = SLAB_BYTES
    if not isinstance(slab_bytes, (int, np.integer)) or isinstance(slab_bytes, bool) or slab_bytes <= 0:
        raise InputError(f"slab_bytes must be a positive integer, got {slab_bytes!r}; "
                         "leave it unset for the default (64 MiB)")
    o, v = make_spaces(ref.orbsym, ref.nocc, nfrozen, tile, occ_tile)
    nocc = ref.nocc - nfrozen
    index = {"o": o.orbitals, "v": v.orbitals + nocc}            # space position -> active MO
    with context:
        tensors = {name: class_tensor(name, o, v) for name in CLASSES}
        if ref.eri_mo is not None:
            stats = mo_classes(context, ref.eri_mo, {k: i + nfrozen for k, i in index.items()}, tensors)
        else:
            budget, source = memory_budget(context.ranks.node_size, max_memory_mb)
            in_memory = not context.distributed and s8_fits(ref.mol.nao, budget)
            if not in_memory and not context.distributed and context.ranks.rank == 0:
                log.info("transform: the 8-fold AO integrals (%.0f MiB) exceed the memory budget "
                         "(%.0f MiB per rank, %s): AO units of at most %.0f MiB per thread instead",
                         s8_bytes(ref.mol.nao) / 2**20, budget / 2**20, source, slab_bytes / 2**20)
            if not in_memory and ref.ao_integrals is not None:
                ref.ao_integrals.take()            # not used here: freed now, not at the end
            stats = transform_classes(context, ref.mol, ref.mo_coeff[:, nfrozen:], index, tensors,
                                      int(slab_bytes), in_memory, ref.ao_integrals)
    for t in tensors.values():
        t.freeze()
    return MOIntegrals(o, v, ref.mo_energy[nfrozen:ref.nocc], ref.mo_energy[ref.nocc:], tensors, nfrozen, stats)


def mo_classes(context, eri_s8, index, tensors) -> dict:
    """Fill the class tensors from 8-fold packed MO integrals ``eri_s8`` (every rank holds
    them); ``index[letter]``: space position -> MO index. Each block is cut by its owner."""
    from tessera.backends.tasks import TaskSet
    from tessera.chem.ao2mo import pair_index

    work = [(name, t, key) for name, t in tensors.items() for key in t.stored_keys()]

    def cut(j: int, _blocks) -> float:
        name, t, key = work[j]
        idx = [index[ch][sp.slice(k)] for ch, sp, k in zip(name, t.spaces, key)]
        pq, rs = pair_index(idx[0], idx[1]), pair_index(idx[2], idx[3])
        t.put_block(key, eri_s8[pair_index(pq.ravel(), rs.ravel())].reshape(t.block_shape(key)))
        return 0.0

    home = [t.dist.owner(key) if t.dist is not None else 0 for _, t, key in work]
    costs = [int(np.prod(t.block_shape(key))) for _, t, key in work]
    context.run_tasks(TaskSet("transform: MO integrals", costs, cut, home=home))
    for t in tensors.values():
        if t.dist is not None:
            t.dist.sync()
    return {"mo_integrals": int(eri_s8.size), "ranks": int(context.ranks.size)}


def denominator(spaces: tuple, energies: tuple | None, signs: tuple, name: str = "D", symmetry=(),
                placement: str = "balanced") -> BlockTensor:
    """D[p q ...] = sum_n signs[n] * energies[n][p_n] at every allowed block (irrep 0).
    ``symmetry`` (permutations under which D is invariant, e.g. D_ijab = D_jiba) makes
    it stored as canonical blocks; ``placement``: as the tensors it divides. ``energies``
    None: the empty tensor of that structure (planning without data)."""
    d = BlockTensor(spaces, 0, name=name, symmetry=symmetry, canonical=bool(symmetry), placement=placement)
    if energies is None:
        return d
    for key in d.owned_keys():
        blk = np.zeros(d.block_shape(key))
        for n, (s, e, sign, t) in enumerate(zip(spaces, energies, signs, key)):
            shape = [1] * len(spaces)
            shape[n] = -1
            blk = blk + sign * e[s.orbitals[s.slice(t)]].reshape(shape)
        d.store_block(key, blk)
    return d.freeze()
