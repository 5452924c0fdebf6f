"""Pair spaces: one index for the unordered pairs p <= q of a space (packed storage).

A tensor that is symmetric under swapping two axes over the same space (with the other
axes permuted alongside, e.g. tau[ijab] = tau[jiba]) needs only its pairs i <= j. The
pair space of ``o`` has one tile per tile pair (s, t) with s <= t: an off-diagonal pair
holds all n_s n_t elements (row-major), a diagonal pair the n(n+1)/2 elements i <= j
(row-major upper triangle); its irrep is irrep(s) ^ irrep(t). Contractions over a pair
index then run on the canonical half only: the ladder of closed-shell CCSD with rows
i <= j costs o(o+1)/2 v^4 GEMM rows instead of o^2 (the packed-pair form of PySCF's
``_add_vvvv``; Scuseria, Janssen, Schaefer, J. Chem. Phys. 89, 7382 (1988)).

``pack_block`` and ``unpack_half_block`` are the block maps of the planner's ``pack``
and ``unpack_half`` steps (``plan.symmetric``: a contraction whose result is symmetric is
computed on the pairs of one factor, unpacked to half and added with its transpose).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from tessera.errors import SymmetryError
from tessera.tensor.block_tensor import BlockTensor, PermutationalSymmetry
from tessera.tensor.space import IndexSpace, Tile


class PairSpace(IndexSpace):
    """The pairs p <= q of ``base``; ``tile_pairs[n]`` is the (s, t) tile pair of tile n."""

    def __init__(self, base: IndexSpace):
        self.base = base
        self.tile_pairs = tuple((s, t) for s in range(len(base.tiles)) for t in range(s, len(base.tiles)))
        self.tile_of = {st: n for n, st in enumerate(self.tile_pairs)}
        tiles, offset = [], 0
        for s, t in self.tile_pairs:
            ns, nt = base.tiles[s].size, base.tiles[t].size
            size = ns * (ns + 1) // 2 if s == t else ns * nt
            tiles.append(Tile(size, base.tiles[s].irrep ^ base.tiles[t].irrep, offset))
            offset += size
        super().__init__(f"({base.name}{base.name})", tiles)


def pair_space(base: IndexSpace) -> PairSpace:
    """The pair space of ``base``, made once per space object (pair spaces of spaces of
    one tiling compare equal, as the spaces do)."""
    made = base.__dict__.get("_pair_space")
    if made is None:
        made = base.__dict__["_pair_space"] = PairSpace(base)
    return made


def pack_block(block: np.ndarray, diagonal: bool) -> np.ndarray:
    """Block (s, t, ...) of a pair-symmetric tensor -> its pair block (pairs, ...)."""
    n1, n2 = block.shape[:2]
    if diagonal:
        return block[triu_pairs(n1)]
    return block.reshape(n1 * n2, *block.shape[2:])


def unpack_half_block(block: np.ndarray, n1: int, n2: int, diagonal: bool) -> np.ndarray:
    """Pair block (pairs, ...) -> block (s, t, ...), s <= t, holding the pairs p < q and
    half of p = q, zero below: X + X.transpose(sym) is the whole pair-symmetric tensor."""
    if not diagonal:
        return block.reshape(n1, n2, *block.shape[1:])
    out = np.zeros((n1, n1, *block.shape[1:]), dtype=block.dtype)
    out[triu_pairs(n1)] = block
    idx = np.arange(n1)
    out[idx, idx] *= 0.5
    return out


@lru_cache(maxsize=256)
def triu_pairs(n: int) -> tuple:
    """``np.triu_indices(n)``, made once per tile size (a pack or unpack step asks for it
    once per diagonal block, thousands of times per CCSD iteration)."""
    return np.triu_indices(n)


# --------------------------------------------------------------- the +/- ladder
# Scuseria, Janssen, Schaefer, J. Chem. Phys. 89, 7382 (1988); PySCF ``ccsd._add_vvvv``
# notes: R[P, a, b] = sum_cd G[a, b, c, d] X[P, c, d] (G symmetric under a<->b with
# c<->d) splits over the virtual pairs a <= b, c <= d into
#   S[P, ab] = sum_cd V+[ab, cd] X+[P, cd],  A[P, ab] = sum_cd V-[ab, cd] X-[P, cd],
# V+-[ab, cd] = G[a, b, c, d] +- G[a, b, d, c], X+-[P, cd] = (X[P, c, d] +- X[P, d, c]) / 2
# (X+[P, cc] = X[P, cc] / 2), then R[P, a, b] = S + A, R[P, b, a] = S - A (a < b), R[P, a, a]
# = S[P, aa]: about half the multiply-adds of the full contraction.

def pm_pack_block(block: np.ndarray, sign: float, s: int, t: int) -> np.ndarray:
    """What block (P, s, t) of X adds to the pair block (P, {s, t}) of X+ (sign +1) or
    X- (sign -1); the last two axes are paired (the formulas above)."""
    n = block.shape[0]
    if s < t:
        return 0.5 * block.reshape(n, -1)
    if s > t:
        return (0.5 * sign) * block.transpose(0, 2, 1).reshape(n, -1)
    y = 0.5 * (block + sign * block.transpose(0, 2, 1))
    idx = np.arange(block.shape[1])
    y[:, idx, idx] *= 0.5
    return y[(slice(None),) + triu_pairs(block.shape[1])]


def pm_unpack_block(block: np.ndarray, sign: float, ns: int, nt: int, diagonal: bool, lower: bool) -> np.ndarray:
    """What pair block (P, {s, t}) of S (sign +1) or A (sign -1) adds to block (P, s, t)
    of R, or to (P, t, s) when ``lower`` (the formulas above)."""
    n = block.shape[0]
    if not diagonal:
        x = block.reshape(n, ns, nt)
        return sign * x.transpose(0, 2, 1) if lower else x
    y = np.zeros((n, ns, ns))
    y[(slice(None),) + triu_pairs(ns)] = block
    y += sign * y.transpose(0, 2, 1).copy()
    idx = np.arange(ns)
    y[:, idx, idx] *= 0.5
    return y


def plus_minus(g, axes: tuple, symmetric: bool) -> tuple:
    """(V+, V-) of the frozen local tensor ``g``: the axes ``axes`` of ``g`` are (a, b,
    c, d) of the formulas above; tensors over (pairs of a's space, pairs of c's space),
    frozen; when ``symmetric`` stored as canonical blocks (V[AB, CD] = V[CD, AB]) with
    the diagonal blocks as triangles (``SymmetricPairMatrix``): 0.26 of the dense g
    together for glycine cc-pVDZ (C1, tile 32). Made once per (g, version, axes) and kept on ``g``
    (which may then be freed, ``free_for_ladder``)."""
    made = g.__dict__.setdefault("_plus_minus", {})
    key = (g.version, axes, symmetric)
    if key not in made:
        if isinstance(g.blocks, FreedBlocks):      # keep the V+- made before it was freed
            g.blocks.refuse()
        made.clear()
        pa, pc = pair_space(g.spaces[axes[0]]), pair_space(g.spaces[axes[2]])
        sym = (PermutationalSymmetry((1, 0)),) if symmetric else ()
        kind = SymmetricPairMatrix if symmetric else BlockTensor
        out = tuple(kind((pa, pc), g.irrep, name=f"{g.name}{s}", symmetry=sym, canonical=symmetric) for s in "+-")
        structural = bool(g.blocks) and not any(any(b.strides) for b in g.blocks.values())
        for v in out if structural else ():     # g holds zero-stride views (planning without data): V+- alike
            v.blocks = {k: np.broadcast_to(np.float64(0.0), v.block_shape(k)) for k in v.allowed_keys()}
        for ab, cd in () if structural else out[0].stored_keys():
            (s, t), (u, w) = pa.tile_pairs[ab], pc.tile_pairs[cd]
            direct, crossed = _role_block(g, axes, (s, t, u, w)), _role_block(g, axes, (s, t, w, u))
            if direct is None and crossed is None:
                continue
            shape = (pa.base.tiles[s].size, pa.base.tiles[t].size, pc.base.tiles[u].size, pc.base.tiles[w].size)
            direct = np.zeros(shape) if direct is None else direct
            crossed = np.zeros(shape) if crossed is None else crossed.transpose(0, 1, 3, 2)
            for v, sign in zip(out, (1.0, -1.0)):
                x = pack_block(direct + sign * crossed, s == t)
                v.store_block((ab, cd), np.ascontiguousarray(pack_block(x.transpose(1, 2, 0), u == w).T))
        made[key] = tuple(v.freeze() for v in out)
    return made[key]


def plus_minus_last(h, axes: tuple) -> tuple:
    """(M+, M-) of the frozen local tensor ``h``, its axes ``axes`` as (k, y, c, d):
    M+-[k, y, cd] = h[k, y, c, d] +- h[k, y, d, c] on the pairs c <= d (like V+- of
    ``plus_minus``, paired on c, d only), tensors over (k's space, y's space, pairs of
    c's space), frozen. The t1 dressing of the +/- ladder (``plan.symmetric``,
    ``_plus_minus_steps``): sum_cd h[k, y, c, d] X[P, c, d] = sum_s sum_cd M^s[k, y, cd]
    X^s[P, cd] and sum_cd h[k, y, d, c] X[P, c, d] = sum_s s sum_cd M^s X^s, with the
    ladder's X+- (the formulas above). Made once per (h, version, axes), kept on ``h``."""
    made = h.__dict__.setdefault("_plus_minus_last", {})
    for old in [k for k in made if k[0] != h.version]:
        del made[old]
    key = (h.version, axes)
    if key not in made:
        ks, ys, pc = h.spaces[axes[0]], h.spaces[axes[1]], pair_space(h.spaces[axes[2]])
        out = tuple(BlockTensor((ks, ys, pc), h.irrep, name=f"{h.name}{s}") for s in "+-")
        structural = bool(h.blocks) and not any(any(b.strides) for b in h.blocks.values())
        for v in out:
            for k, y, cd in v.allowed_keys():
                u, w = pc.tile_pairs[cd]
                shape = (ks.tiles[k].size, ys.tiles[y].size, pc.base.tiles[u].size, pc.base.tiles[w].size)
                if structural:      # h holds zero-stride views (planning without data): M+- alike
                    v.blocks[(k, y, cd)] = np.broadcast_to(np.float64(0.0), v.block_shape((k, y, cd)))
                    continue
                direct, crossed = _role_block(h, axes, (k, y, u, w)), _role_block(h, axes, (k, y, w, u))
                if direct is None and crossed is None:
                    continue
                sign = 1.0 if v is out[0] else -1.0
                x = (0.0 if direct is None else direct) + \
                    (0.0 if crossed is None else sign * crossed.transpose(0, 1, 3, 2))
                x = np.broadcast_to(x, shape).reshape(shape[0] * shape[1], *shape[2:]).transpose(1, 2, 0)
                v.store_block((k, y, cd), np.ascontiguousarray(pack_block(x, u == w).T).reshape(*shape[:2], -1))
        made[key] = tuple(v.freeze() for v in out)
    return made[key]


def kept_plus_minus_last(h) -> tuple:
    """The M+- that ``plus_minus_last`` keeps on ``h`` (of every axis order made; empty when none)."""
    return tuple(m for pair in (h.__dict__.get("_plus_minus_last") or {}).values() for m in pair)


def free_plus_minus_last(h) -> None:
    """Drop the M+- kept on ``h`` (a CCSD's, once it is done; the next makes them again)."""
    h.__dict__.pop("_plus_minus_last", None)


class TriangleBlocks(dict):
    """The blocks of a symmetric matrix of canonical blocks (V[AB, CD] = V[CD, AB], the
    8-fold ladder's V+-) with its diagonal blocks (AB == CD, symmetric themselves) held
    as their upper triangles, n(n+1)/2 elements instead of n^2, and made whole when read
    (``[]``, ``get``, ``items``, ``values``: a new array each time; an executor reads a
    frozen operand once and keeps its gathered matrices). ``stored_elements`` counts the
    triangles. The other blocks and their aliases are held as given."""

    def __init__(self, blocks: dict):
        super().__init__(blocks)
        for key, blk in blocks.items():
            if key[0] == key[1]:
                n = blk.shape[0]
                # zero-stride views (planning without data) stay of no memory
                packed = np.broadcast_to(np.float64(0.0), (n * (n + 1) // 2,)) if not any(blk.strides) \
                    else np.ascontiguousarray(blk[triu_pairs(n)])
                dict.__setitem__(self, key, packed)

    def __getitem__(self, key):
        blk = dict.__getitem__(self, key)
        if key[0] != key[1]:
            return blk
        n = int(round((np.sqrt(8 * blk.size + 1) - 1) / 2))
        whole = np.empty((n, n))
        whole[triu_pairs(n)] = blk
        lower = np.tril_indices(n, -1)
        whole[lower] = whole.T[lower]
        return whole

    def get(self, key, default=None):
        return self[key] if key in self else default

    def values(self):
        return [self[k] for k in self]

    def items(self):
        return [(k, self[k]) for k in self]

    def __setitem__(self, key, value):
        raise SymmetryError("the ladder's V+- are frozen: their blocks cannot be replaced")

    def keep_view(self, key, view: np.ndarray) -> None:
        """Hold off-diagonal block ``key`` as ``view``, an array of the same values (its
        place in an executor's gathered matrix, ``Context.store_constants_gathered``), its
        own array freed; a diagonal block stays a triangle."""
        if key[0] != key[1]:
            dict.__setitem__(self, key, view)


class SymmetricPairMatrix(BlockTensor):
    """A frozen matrix over (pairs, pairs) stored as canonical blocks (V[AB, CD] =
    V[CD, AB]) whose diagonal blocks are held as triangles from ``freeze`` on
    (``TriangleBlocks``): the 8-fold ladder's V+-, about (P^2 + P) / 2 elements for P pairs."""

    def freeze(self) -> "SymmetricPairMatrix":
        self.blocks = TriangleBlocks(self.blocks)
        return super().freeze()

    @property
    def stored_elements(self) -> int:
        return int(sum(b.size for k, b in dict.items(self.blocks) if k not in self.aliases))

    @property
    def local_nbytes(self) -> int:
        return 8 * self.stored_elements


def kept_plus_minus(g) -> tuple:
    """The (V+, V-) that ``plus_minus`` keeps on ``g`` (empty when none were made)."""
    made = g.__dict__.get("_plus_minus") or {}
    return next(iter(made.values()), ())


def free_plus_minus(g) -> None:
    """Drop the (V+, V-) kept on ``g`` (a job whose CCSD is done: (T) reads no vvvv). A
    later ``plus_minus`` of a ``g`` freed by ``free_for_ladder`` is then an error naming
    ``g``, as reading its blocks is."""
    g.__dict__.pop("_plus_minus", None)


def free_for_ladder(g) -> bool:
    """Free the blocks of the frozen local tensor ``g`` once ``plus_minus`` has made its
    V+- (they stay kept on ``g``, where the planner finds them): a local CCSD reads vvvv
    through the ladder's V+- only. Returns whether it freed them. Afterwards ``g`` holds
    no block (``stored_elements`` 0) and reading one (``[]``, ``get``, ``in``: what
    executors and ``plus_minus`` do; ``to_dense``, ``flat``) is an error naming ``g``,
    not a zero block."""
    if g.dist is not None or not kept_plus_minus(g):
        return False
    g.blocks = FreedBlocks(g.name)
    return True


class FreedBlocks(dict):
    """The (no) blocks of a tensor freed by ``free_for_ladder``."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name

    def refuse(self, *args, **kwargs):
        """Raise: what reads a freed tensor's blocks (``[]``, ``get``, ``in``, and
        ``BlockTensor.to_dense``, ``flat``) gets this error, never zeros."""
        raise SymmetryError(f"tensor {self.name!r} was freed once the ladder's V+- were made from it "
                            "(a local CCSD keeps V+- only); use its blocks before CCSD, or transform "
                            "the integrals again")

    __getitem__ = get = __contains__ = __setitem__ = refuse


def _role_block(g, axes: tuple, tiles: tuple):
    """Block of ``g`` with tile ``tiles[r]`` on axis ``axes[r]``, its axes in that order."""
    key = [0] * len(axes)
    for ax, tile in zip(axes, tiles):
        key[ax] = tile
    blk = g.blocks.get(tuple(key))
    return None if blk is None else blk.transpose(axes)
