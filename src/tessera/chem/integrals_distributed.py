"""The AO->MO transformation of ``chem.integrals`` for distributed tensors.

No rank computes or holds
all AO integrals or a whole four-index tensor, and no data goes through one rank.
1. AO shell pairs (lam >= sig) are dealt over the ranks in contiguous runs of near-equal
   element count. Each rank computes (lam sig|mu nu) for its own shell pairs and all
   mu >= nu (libcint via ``moleintor.getints``: ``s2kl`` for off-diagonal shell pairs,
   ``s4`` for a diagonal one, so each AO pair lam >= sig is computed exactly once and the
   integrals computed over all ranks are the 4-fold packed set, npair^2 with
   npair = nao(nao+1)/2), in units of at most ``slab_bytes``/2.
2. It half-transforms mu nu -> p >= q over all active orbitals at once (``nr_e2``, s2)
   and *puts* the rows each class needs into one GlobalArray per class,
   H[(p q) | lam sig], rows grouped by the class's first-pair tile groups (P, Q) and
   owned by the rank that owns those MO blocks (``placement="pairs"``), columns = the
   AO pairs in dealing order (each rank writes only its own contiguous column range).
3. After ``sync()``, each rank finishes lam sig -> r s for the rows it owns (per irrep
   of r, so only symmetry-allowed (R, S) combinations are transformed; r >= s packing
   where both indices run over the same orbitals) and stores its blocks with
   ``store_block``. The six arrays are freed (collective) before returning.
Both MPI backends store tensors in GlobalArrays; the transform uses one-sided puts for
step 2 with either backend (``mpi-collective`` avoids one-sided operations only in
contractions and (T)).

Memory per rank (distributed), in doubles: its owned MO blocks (~ stored total/ranks with
the ``pairs`` placement) + its owned rows of the half-transformed arrays, sum over
classes of rows(P Q) x npair (~ (2 o^2 + 3 o v + v^2) npair / ranks; AO pairs carry no
point-group symmetry, so with symmetry this can exceed the stored MO integrals) +
working arrays of about ``slab_bytes`` in each step (step 1-2: one AO unit <= slab/2,
then the half-transformed chunk, its transpose and one class's rows of it, together
<= slab or one unit; step 3: a row chunk of one group in packed AO order <= slab/2 and
its transformed rows) + one group's output blocks (<= tile^2 x o-or-v^2) + index maps
of npair integers. Nothing scales as nao^4 or as a whole MO class.
"""

from __future__ import annotations

import numpy as np
from pyscf import lib
from pyscf.ao2mo import _ao2mo
from pyscf.gto import moleintor

from tessera.chem.integrals import pair_index


def ao_pair_units(ao_loc, nranks: int, max_cols: int) -> list:
    """The AO integral work units of every rank, in column order (the same on every rank).

    Shell pairs (l, s), s <= l, in (l, s) order are cut into ``nranks`` contiguous runs of
    near-equal AO-pair count; a rank's pairs with the same l form units (l, s0, s1,
    diagonal), a diagonal shell pair (s = l) on its own, others split so a unit has at most
    ``max_cols`` AO pairs (at least one shell pair). Returns [(rank, l, s0, s1, diag,
    ncols)]; a unit's columns are the AO pairs (lam, sig) in libcint's order (lam-major;
    lam >= sig within a diagonal shell pair).
    """
    from tessera.runtime.distribution import contiguous_runs

    size = np.diff(np.asarray(ao_loc, dtype=np.int64))
    pairs = [(l, s) for l in range(len(size)) for s in range(l + 1)]
    cost = [int(size[l] * (size[l] + 1) // 2) if l == s else int(size[l] * size[s]) for l, s in pairs]
    owner = contiguous_runs(cost, nranks)
    units, i = [], 0
    while i < len(pairs):
        l, s = pairs[i]
        if l == s:
            units.append((owner[i], l, l, l + 1, True, cost[i]))
            i += 1
            continue
        j, ncols = i, 0
        while (j < len(pairs) and pairs[j][0] == l and pairs[j][1] != l and owner[j] == owner[i]
               and (j == i or ncols + cost[j] <= max_cols)):
            ncols += cost[j]
            j += 1
        units.append((owner[i], l, s, pairs[j - 1][1] + 1, False, ncols))
        i = j
    return units


def _unit_tril(ao_loc, unit) -> np.ndarray:
    """Packed AO-pair index lam(lam+1)/2 + sig of each column of a unit."""
    _, l, s0, s1, diag, _ = unit
    a0, a1 = int(ao_loc[l]), int(ao_loc[l + 1])
    if diag:
        lam, sig = np.tril_indices(a1 - a0)
        lam, sig = lam + a0, sig + a0
    else:
        lam = np.repeat(np.arange(a0, a1), ao_loc[s1] - ao_loc[s0])
        sig = np.tile(np.arange(ao_loc[s0], ao_loc[s1]), a1 - a0)
    return lam * (lam + 1) // 2 + sig


def transform_distributed(mol, coeff, index, tensors, slab_bytes: int) -> dict:
    """Fill the distributed class tensors; each rank computes its share (module docstring).
    Returns this rank's counts: AO integrals computed, bytes of half-transformed rows held."""
    from tessera.runtime import GlobalArray

    world = next(iter(tensors.values())).dist.world
    me = world.rank
    nao = coeff.shape[0]
    nact = coeff.shape[1]
    npair = nao * (nao + 1) // 2
    nact_pair = nact * (nact + 1) // 2
    intor = mol._add_suffix("int2e")
    ao_loc = moleintor.make_loc(mol._bas, intor)
    units = ao_pair_units(ao_loc, world.size, max(1, slab_bytes // (16 * npair)))
    col_tril = np.concatenate([_unit_tril(ao_loc, u) for u in units])
    col_of_tril = np.empty(npair, dtype=np.int64)
    col_of_tril[col_tril] = np.arange(npair)                       # tril order -> column
    mine = [u for u in units if u[0] == me]
    c_lo = sum(u[5] for u in units if u[0] < me)

    # one half-transformed array per class: rows (p q) of each first-pair group, owned by
    # the group's owner in the class tensor; columns the AO pairs in unit order
    plans = []
    for name, t in tensors.items():
        groups: dict = {}
        for key in t.allowed_keys():
            groups.setdefault(key[:2], []).append(key)
        if not groups:
            continue
        sp = t.spaces
        gkeys = sorted(groups)
        rows = np.concatenate([pair_index(index[name[0]][sp[0].slice(P)], index[name[1]][sp[1].slice(Q)]).ravel()
                               for P, Q in gkeys])
        ga = GlobalArray([[sp[0].tiles[P].size * sp[1].tiles[Q].size for P, Q in gkeys], [npair]],
                         owners={(n, 0): t.dist.owner(groups[g][0]) for n, g in enumerate(gkeys)},
                         name=f"half-{name}", world=world)
        plans.append((name, t, ga, gkeys, groups, rows))

    # steps 1-2: own AO integrals -> (p>=q | lam sig) -> rows to their owners, in chunks
    # of columns; the chunk, its transpose and one class's rows fit in slab_bytes
    max_rows = max([len(p[5]) for p in plans] + [1])
    chunk_cols = max([slab_bytes // (8 * (2 * nact_pair + max_rows))] + [u[5] for u in mine])
    scratch = _Scratch()
    computed = 0
    if mine:
        half = scratch.get("half", (chunk_cols, nact_pair))
        cintopt = moleintor.make_cintopt(mol._atm, mol._bas, mol._env, intor)
        nbas = mol.nbas
        pos, c0 = 0, c_lo
        for n_unit, unit in enumerate(mine):
            _, l, s0, s1, diag, n = unit
            ao = moleintor.getints(intor, mol._atm, mol._bas, mol._env,
                                   (l, l + 1, s0, s1, 0, nbas, 0, nbas),
                                   aosym="s4" if diag else "s2kl", cintopt=cintopt).reshape(n, npair)
            computed += ao.size
            _ao2mo.nr_e2(ao, coeff, (0, nact, 0, nact), "s2kl", "s2", out=half[pos:pos + n])
            del ao
            pos += n
            if n_unit + 1 == len(mine) or pos + mine[n_unit + 1][5] > chunk_cols:
                half_t = lib.transpose(half[:pos], out=scratch.get("half_t", (nact_pair, pos)))
                for _, _, ga, _, _, rows in plans:
                    ga.put_patch((0, c0), (len(rows), c0 + pos),
                                 np.take(half_t, rows, axis=0, mode="clip", out=scratch.get("rows", (len(rows), pos))))
                c0, pos = c0 + pos, 0
    scratch.clear()
    held = 0
    for _, _, ga, _, _, _ in plans:
        ga.sync()
        held += ga.nbytes_local()

    # step 3: finish lam sig -> r s for the owned rows, store the blocks
    row_chunk = max(1, slab_bytes // (16 * npair))
    for name, t, ga, gkeys, groups, _ in plans:
        coeffs = [coeff[:, index[ch]] for ch in name]
        for gi, _ in ga.local_keys():
            _finish_group(t, groups[gkeys[gi]], ga.local_view((gi, 0)), col_of_tril,
                          coeffs[2], coeffs[3], name[2] == name[3], row_chunk, scratch)
    scratch.clear()
    for _, t, ga, _, _, _ in plans:
        ga.free()
    for t in tensors.values():
        t.dist.sync()
    return {"ao_integrals_computed": int(computed), "ao_integrals_total": int(npair * npair),
            "ao_pair_columns": int(sum(u[5] for u in mine)), "ao_pairs": int(npair),
            "half_bytes_held": int(held), "ranks": int(world.size)}


def _finish_group(t, keys, rows, col_of_tril, cz, cw, same_space: bool, row_chunk: int,
                  scratch) -> None:
    """(P Q | lam sig) rows of one first-pair group -> its blocks (P Q | R S).

    Only (R, S) combinations that occur in ``keys`` are transformed: per irrep h of R the
    orbitals of irrep h of the third space and irrep h^g of the fourth (``nr_e2``), r >= s
    packed when both are the same orbitals.
    """
    sp = t.spaces
    P, Q = keys[0][:2]
    npq = sp[0].tiles[P].size * sp[1].tiles[Q].size
    by_irrep: dict = {}
    for key in keys:
        by_irrep.setdefault((sp[2].tiles[key[2]].irrep, sp[3].tiles[key[3]].irrep), []).append(key)
    spans = [_irrep_spans(sp[2]), _irrep_spans(sp[3])]
    out = {key: np.empty((npq,) + t.block_shape(key)[2:]) for key in keys}
    for r0 in range(0, npq, row_chunk):
        r1 = min(r0 + row_chunk, npq)
        tril = np.take(rows[r0:r1], col_of_tril, axis=1, mode="clip",  # AO pairs, packed order
                       out=scratch.get("tril", (r1 - r0, len(col_of_tril))))
        for (h, k), hkeys in by_irrep.items():
            z0, z1 = spans[0][h]
            w0, w1 = spans[1][k]
            if same_space and (z0, z1) == (w0, w1):
                n = z1 - z0
                res = _ao2mo.nr_e2(tril, cz[:, z0:z1], (0, n, 0, n), "s2kl", "s2",
                                   out=scratch.get("res", (r1 - r0, n * (n + 1) // 2)))
                for key in hkeys:
                    rs = pair_index(np.arange(*_rel(sp[2], key[2], z0)), np.arange(*_rel(sp[3], key[3], z0)))
                    out[key][r0:r1] = res[:, rs.ravel()].reshape((r1 - r0,) + rs.shape)
            else:
                nz, nw = z1 - z0, w1 - w0
                res = _ao2mo.nr_e2(tril, np.hstack([cz[:, z0:z1], cw[:, w0:w1]]), (0, nz, nz, nz + nw),
                                   "s2kl", "s1", out=scratch.get("res", (r1 - r0, nz * nw)))
                res = res.reshape(r1 - r0, nz, nw)
                for key in hkeys:
                    out[key][r0:r1] = res[:, slice(*_rel(sp[2], key[2], z0)), slice(*_rel(sp[3], key[3], w0))]
    for key, blk in out.items():
        blk = blk.reshape(t.block_shape(key))
        if key in t.blocks:
            t.store_block(key, blk)
        else:                                   # not with placement "pairs"; kept general
            t.accumulate_block(key, blk)


class _Scratch:
    """Reusable flat work buffers by name (grown when too small), so that the working
    arrays are allocated, and their pages touched, once per transform."""

    def __init__(self):
        self._bufs: dict = {}

    def get(self, name: str, shape: tuple) -> np.ndarray:
        size = int(np.prod(shape))
        buf = self._bufs.get(name)
        if buf is None or buf.size < size:
            buf = self._bufs[name] = np.empty(size)
        return buf[:size].reshape(shape)

    def clear(self) -> None:
        self._bufs.clear()


def _irrep_spans(space) -> dict:
    """{irrep: (first, stop)} positions spanning the tiles of each irrep."""
    spans: dict = {}
    for tl in space.tiles:
        lo, hi = spans.get(tl.irrep, (tl.offset, tl.offset + tl.size))
        spans[tl.irrep] = (min(lo, tl.offset), max(hi, tl.offset + tl.size))
    return spans


def _rel(space, tile: int, start: int) -> tuple:
    """(first, stop) of a tile's positions relative to ``start``."""
    s = space.slice(tile)
    return s.start - start, s.stop - start
