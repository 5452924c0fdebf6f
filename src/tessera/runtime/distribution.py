"""Every partitioner of Tessera: which rank (or bin) gets which item.

Pure Python and deterministic: every rank computes the same map from the same input.

- ``cyclic(n, P)``: item i to i mod P;
- ``contiguous(n, P)``: n items cut into P consecutive runs of counts differing by <= 1;
- ``largest_first(costs, P)``: greedy longest-processing-time (Graham 1969): items by
  decreasing cost each go to the least loaded bin (ties: lowest bin); ``makespan`` is
  the largest load it leaves (``largest_first_order`` / ``largest_first_sorted``: its
  order and its rule on items already in that order);
- ``contiguous_runs(costs, P)`` / ``run_bounds``: items in order cut into P consecutive
  runs of near-equal total cost (GTFock's static partition of the task space, 1-D);
- ``grid_shape``, ``default_layers``, ``grid_3d``: process grids of SUMMA and 2.5D;
- ``assign_owners``: the block owner map of a GlobalArray built from the above;
- ``size_ranked``: items ranked by size dealt round-robin (vectorised; loads within one
  item of each other);
- ``block_owner_array`` / ``block_owners``: the owner map of a distributed block tensor
  (placements ``balanced`` and ``("rows", owners)``), as an array or a dict;
- ``block_offsets``: where each block lies in its owner's memory;
- ``piece_count`` / ``PieceDeal`` / ``piece_deal``: the ``pieces`` placement, blocks cut
  into pieces dealt like blocks, so that a class of fewer blocks than ranks is spread
  too; computed from the size classes by arithmetic (``floor_sum``), no table.
"""

from __future__ import annotations

import heapq
import math
import zlib
from typing import Mapping, Sequence

import numpy as np

from tessera.errors import RuntimeLayerError

DISTRIBUTIONS = ("cyclic", "contiguous", "balanced")


def assign_owners(
    keys: Sequence[tuple],
    nranks: int,
    distribution: str = "cyclic",
    costs: Mapping | Sequence | None = None,
    owners: Mapping | None = None,
    default_costs: Sequence[float] | None = None,
) -> dict:
    """Return {key: rank} for ranks 0..nranks-1.

    cyclic: the i-th key goes to rank i mod nranks.
    contiguous: keys are cut into nranks consecutive runs whose lengths differ by <= 1.
    balanced: greedy longest-processing-time: keys by decreasing cost (ties: key order)
        each go to the rank with the least total cost so far (ties: lowest rank). Costs
        come from `costs` (dict key->cost or a sequence aligned with keys) or, if None,
        from `default_costs` (GlobalArray passes the block sizes).
    owners: {key: rank} for every key; overrides `distribution`.
    """
    if nranks < 1:
        raise RuntimeLayerError(f"cannot distribute blocks over {nranks} ranks; expected >= 1.")
    if owners is not None:
        return _check_owners(keys, nranks, owners)
    if distribution not in DISTRIBUTIONS:
        raise RuntimeLayerError(
            f"unknown distribution {distribution!r}; expected one of "
            f"{', '.join(DISTRIBUTIONS)}, or pass owners={{key: rank}}."
        )
    if costs is not None and distribution != "balanced":
        raise RuntimeLayerError(
            f"costs were given but distribution is {distribution!r}; costs are used only by "
            "distribution='balanced'. Drop costs or choose 'balanced'."
        )
    if distribution == "cyclic":
        ranks = cyclic(len(keys), nranks)
    elif distribution == "contiguous":
        ranks = contiguous(len(keys), nranks)
    else:
        ranks = largest_first(_costs_list(keys, costs if costs is not None else default_costs), nranks)
    return dict(zip(keys, ranks))


def cyclic(n: int, nbins: int) -> list:
    """Bin of each of n items: i mod nbins."""
    return [i % nbins for i in range(n)]


def contiguous(n: int, nbins: int) -> list:
    """Bin of each of n items cut into nbins consecutive runs whose lengths differ by <= 1."""
    base, extra = divmod(n, nbins)
    out = []
    for r in range(nbins):
        out += [r] * (base + (1 if r < extra else 0))
    return out


def largest_first(costs: Sequence[float], nbins: int) -> list:
    """Bin of each item: largest cost first, each to the least loaded bin so far (ties:
    the earlier item, the lowest bin). Graham's LPT rule: makespan <= 4/3 optimal."""
    costs = np.asarray(costs, dtype=float)
    order = largest_first_order(costs)
    out = np.empty(len(costs), dtype=np.int64)
    out[order] = largest_first_sorted(costs[order], nbins)
    return out.tolist()


def largest_first_order(costs) -> np.ndarray:
    """Items by decreasing cost, ties in item order (a stable NumPy sort, the order of
    ``largest_first`` and of a largest-first hand-out)."""
    return np.argsort(-np.asarray(costs, dtype=float), kind="stable")


def largest_first_sorted(costs, nbins: int) -> np.ndarray:
    """``largest_first``'s bin of each item of ``costs`` already in its order
    (``largest_first_order``): one heap operation per item, nothing else per item."""
    heap = [(0.0, r) for r in range(nbins)]
    out = [0] * len(costs)
    for j, c in enumerate(np.asarray(costs, dtype=float).tolist()):
        load, r = heap[0]
        out[j] = r
        heapq.heapreplace(heap, (load + c, r))
    return np.asarray(out, dtype=np.int64)


def bin_loads(bins: Sequence[int], costs: Sequence[float], nbins: int) -> list:
    """Total cost per bin of an assignment."""
    out = [0.0] * nbins
    for b, c in zip(bins, costs):
        out[b] += float(c)
    return out


def makespan(costs: Sequence[float], nbins: int) -> float:
    """Largest bin load of ``largest_first`` (the busiest rank's work)."""
    if nbins == 1 or not len(costs):
        return float(sum(costs))
    return max(bin_loads(largest_first(costs, nbins), costs, nbins))


def run_bounds(costs: Sequence[float], nbins: int) -> np.ndarray:
    """Cut points of ``contiguous_runs``: bin r holds items [bounds[r], bounds[r+1]).

    An item goes to the run in which the midpoint of its cost falls, the run targets being
    r/nbins of the total; so each cut is where the running cost is closest to its target.
    """
    costs = np.asarray(costs, dtype=float)
    if not len(costs):
        return np.zeros(nbins + 1, dtype=np.int64)
    cum = np.cumsum(costs)
    targets = cum[-1] * np.arange(1, nbins) / nbins
    inner = np.searchsorted(cum - 0.5 * costs, targets, side="right")
    return np.concatenate(([0], inner, [len(costs)])).astype(np.int64)


def contiguous_runs(costs: Sequence[float], nbins: int) -> list:
    """Bin of each item when the items, in order, are cut into ``nbins`` consecutive runs of
    near-equal total cost (``run_bounds``)."""
    bounds = run_bounds(costs, nbins)
    return np.repeat(np.arange(nbins), np.diff(bounds)).tolist()


def grid_shape(nranks: int) -> tuple:
    """(rows, cols) of the most square process grid, rows <= cols."""
    pr = int(math.isqrt(nranks))
    while nranks % pr:
        pr -= 1
    return pr, nranks // pr


def default_layers(nranks: int) -> int:
    """Layers c of a 2.5D grid on P ranks: the smallest divisor of P not below P^(1/3)
    (Solomonik & Demmel's upper end c = P^(1/3), on a divisor): 1 on 1 rank, 2 on 2, 3 on
    3, 2 on 4 (a 1 x 2 grid per layer), 2 on 8, 4 on 16."""
    for c in range(1, nranks + 1):
        if nranks % c == 0 and c ** 3 >= nranks:
            return c
    return 1


def grid_3d(nranks: int, layers: int = 1) -> tuple:
    """(pr, pc, layers): ``layers`` copies of the most square grid of P / layers ranks."""
    return (*grid_shape(nranks // layers), layers)


def _costs_list(keys, costs) -> list[float]:
    if costs is None:
        return [1.0] * len(keys)
    if isinstance(costs, Mapping):
        missing = [k for k in keys if k not in costs]
        if missing:
            raise RuntimeLayerError(
                f"costs has no entry for {len(missing)} block(s), e.g. {missing[0]}; expected "
                "a cost for every block key. Add the missing keys to costs."
            )
        values = [costs[k] for k in keys]
    else:
        values = list(costs)
        if len(values) != len(keys):
            raise RuntimeLayerError(
                f"costs has {len(values)} entries but there are {len(keys)} blocks; expected "
                "one cost per block in sorted key order, or a dict {key: cost}."
            )
    out = []
    for k, v in zip(keys, values):
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if not f >= 0.0 or f == float("inf"):
            raise RuntimeLayerError(
                f"cost of block {k} is {v!r}; expected a finite number >= 0."
            )
        out.append(f)
    return out


def _check_owners(keys, nranks, owners) -> dict:
    out = {}
    for k in keys:
        if k not in owners:
            raise RuntimeLayerError(
                f"owners has no rank for block {k}; expected an owner for every block key "
                f"({len(keys)} blocks). Add it or use a distribution."
            )
        r = owners[k]
        if isinstance(r, bool) or not hasattr(r, "__index__") or not 0 <= int(r) < nranks:
            raise RuntimeLayerError(
                f"owner of block {k} is {r!r}; expected a rank 0 <= r < {nranks} (the number "
                "of worker ranks)."
            )
        out[k] = int(r)
    extra = [k for k in owners if k not in out]
    if extra:
        raise RuntimeLayerError(
            f"owners names {len(extra)} block(s) that the array does not have, e.g. "
            f"{extra[0]!r}; expected only keys of existing blocks."
        )
    return out


PLACEMENTS = ("balanced", "pieces")
PIECE_SHARE = 0.4          # the largest piece of a ``pieces`` placement: at most this share of the mean


def structure_signature(spaces, irrep) -> int:
    """A stable integer from a structure (tile sizes and irreps), the same on every rank."""
    data = repr((irrep, [[(t.size, t.irrep) for t in s.tiles] for s in spaces])).encode()
    return zlib.crc32(data)


def size_ranked(sizes, nbins: int, shift: int = 0) -> np.ndarray:
    """Bin of each item when the items, ranked by decreasing size (ties: their order), are
    dealt round-robin to bins ``shift, shift + 1, ...``: the item of rank n goes to bin
    (n + shift) mod nbins. Every bin gets the same number of items to within one, and in
    each round of ``nbins`` items an earlier bin's item is at most as large as the one
    before it, so the largest and smallest bin loads differ by at most one item's size
    (the largest). Vectorised: O(n log n) in NumPy, no per-item Python work."""
    sizes = np.asarray(sizes)
    order = np.argsort(-sizes, kind="stable")
    out = np.empty(len(sizes), dtype=np.int64)
    out[order] = (np.arange(len(sizes)) + shift) % nbins
    return out


def block_sizes(spaces, keys) -> np.ndarray:
    """Elements of each block ``keys[n]`` of a tensor over ``spaces``."""
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    ks = np.asarray(keys, dtype=np.int64).reshape(len(keys), len(spaces))
    out = np.ones(len(keys), dtype=np.int64)
    for d, s in enumerate(spaces):
        out *= np.asarray([t.size for t in s.tiles], dtype=np.int64)[ks[:, d]]
    return out


def piece_table(spaces, irrep, keys, nranks: int, least: int = 1) -> tuple:
    """``PieceDeal.table`` of the blocks ``keys`` (every stored key, as ``block_owner_array``
    takes them) of a ``pieces`` placement: (index into ``keys``, owner, elements) per piece."""
    positions = np.empty(len(keys), dtype=np.int64)          # the balanced order of blocks
    positions[np.argsort(-block_sizes(spaces, keys), kind="stable")] = np.arange(len(keys))
    return piece_deal(spaces, irrep, keys, nranks, least).table(positions)


def block_owner_array(spaces, irrep, keys, nranks: int, placement="balanced") -> np.ndarray:
    """Owner rank of each block ``keys[n]`` of a block tensor's structure (its index spaces'
    tiles and its irrep), the same on every rank without communication:

    - ``balanced`` (every tensor, the integral classes included): blocks ranked by size,
      dealt round-robin (``size_ranked``), the rank labels rotated by a structural hash so
      that many small tensors do not all start on rank 0; each rank holds within one
      (largest) block of the mean, whatever the tensor;
    - ``pieces``: as ``balanced``, but each block may be stored in pieces on several
      ranks (``piece_deal``, the default cut: not TESSERA_PIECES's forced one); its owner
      here is its home, the owner of its first piece;
    - ``("rows", owners)``: every block of first tile i on rank ``owners[i]`` (a tensor
      laid out to follow another's ownership).

    Vectorised: no Python work per block."""
    rows = check_placement(placement, len(spaces[0].tiles), nranks)
    if rows is not None:
        first = np.asarray(keys, dtype=np.int64).reshape(len(keys), len(spaces))[:, 0]
        return np.asarray(rows, dtype=np.int64)[first]
    if nranks == 1:
        return np.zeros(len(keys), dtype=np.int64)
    if placement == "pieces":
        sizes = block_sizes(spaces, keys)
        positions = np.empty(len(keys), dtype=np.int64)      # the balanced order of blocks
        positions[np.argsort(-sizes, kind="stable")] = np.arange(len(keys))
        return piece_deal(spaces, irrep, keys, nranks).home(positions)
    return size_ranked(block_sizes(spaces, keys), nranks, structure_signature(spaces, irrep) % nranks)


def check_placement(placement, ntiles: int, nranks: int):
    """The owner of each first tile of a ``("rows", owners)`` placement (checked), None
    for ``balanced``; an error for anything else."""
    if isinstance(placement, tuple) and len(placement) == 2 and placement[0] == "rows":
        rows = placement[1]
        if len(rows) != ntiles or not all(0 <= r < nranks for r in rows):
            raise RuntimeLayerError(f"placement 'rows' needs one rank in 0..{nranks - 1} per tile of "
                                    f"the first space ({ntiles}), got {list(rows)}")
        return rows
    if placement not in PLACEMENTS:
        raise RuntimeLayerError(f"unknown placement {placement!r}; expected one of {', '.join(PLACEMENTS)} "
                                "or ('rows', owners)")
    return None


def block_owners(spaces, irrep, keys, nranks: int, placement="balanced") -> dict:
    """{key: rank} of ``block_owner_array``."""
    return dict(zip(keys, block_owner_array(spaces, irrep, keys, nranks, placement).tolist()))


def block_offsets(owners, sizes, nranks: int) -> tuple:
    """(offset of each block in its owner's memory, elements per rank): a rank's blocks
    lie one after the other in key order. Vectorised."""
    owners = np.asarray(owners, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    run = np.bincount(owners, weights=sizes, minlength=nranks).astype(np.int64)
    order = np.argsort(owners, kind="stable")
    before = np.cumsum(sizes[order]) - sizes[order]          # elements before, over all ranks
    start = np.concatenate(([0], np.cumsum(run)[:-1]))       # where each rank's run begins
    offsets = np.empty(len(sizes), dtype=np.int64)
    offsets[order] = before - start[owners[order]]
    return offsets, run


def piece_count(largest: int, total: int, nranks: int, least: int = 1) -> int:
    """Pieces per block of a ``pieces`` placement on ``nranks`` ranks of blocks of
    ``total`` elements, the largest of ``largest``: 1 (whole blocks) when the largest
    block is at most PIECE_SHARE of the mean per rank, else enough that its pieces are
    (dealt largest first, ranks then differ by at most one piece: ``size_ranked``), at
    most ``nranks``; at least ``least`` (a test forcing pieces on a few ranks)."""
    if nranks == 1 or not total:
        return 1
    need = math.ceil(largest / (PIECE_SHARE * total / nranks))
    return int(max(least, min(need, nranks)))


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """sum over t < n of floor((a t + b) / m), for n >= 0, m >= 1, a, b >= 0, in O(log m)
    steps (the Euclid-like reduction of AtCoder Library's ``floor_sum``), exact (NumPy
    integers are made Python integers: their products would overflow)."""
    n, m, a, b, total = int(n), int(m), int(a), int(b), 0
    while True:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            return total
        n, b = divmod(top, m)
        m, a = a, m


class PieceDeal:
    """The ``pieces`` placement from a structure's block size classes alone: O(classes)
    integers, nothing per block or piece, the same on every rank.

    Blocks are ranked by decreasing size, ties in key order (a block's *position*, as
    ``balanced``); class ``c`` (``sizes[c]`` elements, ``counts[c]`` blocks) cuts each block
    into ``n_c = min(k, size)`` pieces (``k``: ``piece_count``), piece ``j`` holding the
    block's elements [floor(j s / n), floor((j + 1) s / n)). The pieces, blocks in position
    order and a block's in element order, are numbered ``i`` and dealt round-robin: owner
    (i + shift) mod P, a rank's pieces lying in its memory in that order. Within a class,
    piece x = b n + j (block b) starts at floor(x s / n) of the class's elements, so the
    elements of a rank's first T pieces of a class (x = x0, x0 + P, ...) are a difference
    of two ``floor_sum``s: offsets, element counts, a block's pieces and a rank's own
    pieces are arithmetic on positions (``BalancedPlacement`` maps positions to keys)."""

    def __init__(self, sizes, counts, nranks: int, shift: int = 0, least: int = 1):
        self.sizes = np.asarray(sizes, dtype=np.int64)              # decreasing
        self.counts = np.asarray(counts, dtype=np.int64)
        held = self.sizes[self.counts > 0]
        assert (np.diff(held) < 0).all(), "size classes must be given largest first"
        self.nranks, self.shift = int(nranks), int(shift) % int(nranks)
        self.k = piece_count(int(held[0]) if len(held) else 0, int(self.sizes @ self.counts), nranks, least)
        self.n = np.minimum(self.k, np.maximum(self.sizes, 1))        # pieces per block of each class
        self.first_block = np.concatenate(([0], np.cumsum(self.counts)))
        self.first_piece = np.concatenate(([0], np.cumsum(self.counts * self.n)))
        # per class, as Python integers (per-key arithmetic): size, pieces per block, first
        # piece, pieces
        self._class_ints = list(zip(self.sizes.tolist(), self.n.tolist(), self.first_piece[:-1].tolist(),
                                    (self.counts * self.n).tolist()))

    def _class(self, g) -> np.ndarray:
        return np.searchsorted(self.first_block, g, side="right") - 1

    def home(self, positions) -> np.ndarray:
        """Owner of the first piece of the block at each position."""
        g = np.asarray(positions, dtype=np.int64)
        c = self._class(g)
        return (self.first_piece[c] + (g - self.first_block[c]) * self.n[c] + self.shift) % self.nranks

    def _first(self, rank: int, c: int) -> tuple:
        """(x0, T): ``rank``'s first piece of class ``c`` (its index in the class) and its
        number of pieces there."""
        _, _, first, total = self._class_ints[c]
        x0 = (rank - self.shift - first) % self.nranks
        return x0, max(0, -(-(total - x0) // self.nranks))

    def _elements(self, c: int, x0: int, t: int) -> int:
        """Elements of the pieces x0, x0 + P, ..., x0 + (t - 1) P of class ``c``."""
        s, n, _, _ = self._class_ints[c]
        return floor_sum(t, n, self.nranks * s, (x0 + 1) * s) - floor_sum(t, n, self.nranks * s, x0 * s)

    def _before(self, rank: int, c: int) -> int:
        """Elements of ``rank``'s pieces in the classes before ``c``."""
        return sum(self._elements(d, *self._first(rank, d)) for d in range(c) if self._class_ints[d][3])

    def elements(self, rank: int) -> int:
        """Elements ``rank`` holds."""
        return self._before(rank, len(self.sizes))

    def pieces(self, g: int) -> list:
        """[(owner, offset in its memory, first element in the block, elements), ...] of the
        block at position ``g``, in element order."""
        c = int(self._class(g))
        n, first = self._class_ints[c][1:3]
        b = g - int(self.first_block[c])
        return [self._piece(c, b, j, (first + b * n + j + self.shift) % self.nranks) for j in range(n)]

    def pieces_held(self, g: int, rank: int) -> list:
        """The entries of ``pieces(g)`` that ``rank`` holds, from its own piece numbers (j,
        j + P, ... of the block: at most one where a block has at most P pieces), without
        making the others: O(classes)."""
        c = int(self._class(g))
        n, first = self._class_ints[c][1:3]
        b = g - int(self.first_block[c])
        return [self._piece(c, b, j, rank) for j in range((rank - self.shift - first - b * n) % self.nranks, n,
                                                          self.nranks)]

    def _piece(self, c: int, b: int, j: int, owner: int) -> tuple:
        """``pieces``' entry of piece ``j`` of block ``b`` of class ``c``, held by ``owner``."""
        s, n = self._class_ints[c][:2]
        x, P = b * n + j, self.nranks
        start, end = j * s // n, (j + 1) * s // n
        return (owner, self._before(owner, c) + self._elements(c, x % P, x // P), start, end - start)

    def rank_pieces(self, rank: int) -> tuple:
        """(positions, first elements, elements) of ``rank``'s pieces in memory order."""
        parts = []
        for c in np.flatnonzero(self.counts).tolist():
            x0, t = self._first(rank, c)
            x = x0 + self.nranks * np.arange(t, dtype=np.int64)
            s, n = self.sizes[c], self.n[c]
            j = x % n
            start = j * s // n
            parts.append((self.first_block[c] + x // n, start, (j + 1) * s // n - start))
        if not parts:
            return (np.zeros(0, dtype=np.int64),) * 3
        return tuple(np.concatenate(p) for p in zip(*parts))

    def home_positions(self, rank: int) -> np.ndarray:
        """Positions of the blocks whose first piece ``rank`` holds, ascending: block b of
        class c with b n_c = x0 (mod P), an arithmetic progression in b."""
        out = []
        for c in np.flatnonzero(self.counts).tolist():
            x0, n, P = self._first(rank, c)[0], int(self.n[c]), self.nranks
            d = math.gcd(n, P)
            if x0 % d:
                continue
            step = P // d
            b0 = (x0 // d) * pow(n // d, -1, step) % step if step > 1 else 0
            out.append(self.first_block[c] + np.arange(b0, self.counts[c], step, dtype=np.int64))
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    def table(self, positions) -> tuple:
        """(index into ``positions``, owner, elements) of every piece of the blocks at
        ``positions``, blocks in order and a block's pieces in element order (vectorised:
        O(pieces) NumPy work, for plans and cost models)."""
        g = np.asarray(positions, dtype=np.int64)
        c = self._class(g)
        n = self.n[c]
        index = np.repeat(np.arange(len(g), dtype=np.int64), n)
        j = np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        c, n = c[index], n[index]
        owner = (self.first_piece[c] + (g[index] - self.first_block[c]) * n + j + self.shift) % self.nranks
        return index, owner, (j + 1) * self.sizes[c] // n - j * self.sizes[c] // n

    def loads(self) -> np.ndarray:
        """Elements on every rank at once (for plans: O(pieces) NumPy work)."""
        out = np.zeros(self.nranks, dtype=np.int64)
        for c in np.flatnonzero(self.counts).tolist():
            x = np.arange(self.counts[c] * self.n[c], dtype=np.int64)
            j, s, n = x % self.n[c], self.sizes[c], self.n[c]
            owner = (self.first_piece[c] + x + self.shift) % self.nranks
            out += np.bincount(owner, weights=(j + 1) * s // n - j * s // n, minlength=self.nranks).astype(np.int64)
        return out


def piece_deal(spaces, irrep, keys, nranks: int, least: int = 1) -> PieceDeal:
    """The ``pieces`` placement (``PieceDeal``) of the blocks ``keys`` (every stored key) of
    a structure; ``least``: pieces per block at least (TESSERA_PIECES)."""
    sizes = block_sizes(spaces, keys)
    classes, counts = np.unique(sizes, return_counts=True)
    return PieceDeal(classes[::-1], counts[::-1], nranks, structure_signature(spaces, irrep) % nranks, least)
