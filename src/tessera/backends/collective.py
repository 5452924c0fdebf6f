"""``mpi-collective``: bulk-synchronous execution; inputs move only by collectives.

Every rank takes part in every step. No one-sided operation is used: the tensors still
live in the ranks' memory (the same distributed storage as ``mpi-onesided``), but
blocks travel only by all-to-all exchanges and broadcasts (``CollectiveComm``, on the
runtime's ``World.alltoallv`` and ``World.split`` groups).

Contraction (SUMMA, van de Geijn & Watts 1997, per symmetry sector; 2.5D, Solomonik &
Demmel 2011): the ranks form a pr x pc x c grid of c layers, each a pr x pc SUMMA grid
(rank = layer * pr * pc + row * pc + col). Row tile tuples of each sector are dealt to
grid rows, column tuples to grid columns (balanced by size; the same in every layer),
inner tuples to the layers and, within a layer, to max(pr, pc) panels; with c > 1 an
inner tuple larger than a layer's share is cut into parts along its first tile
(``summa_layout._inner_units``: partial blocks), so one occupied tile still spreads over the layers.
(1) One all-to-all moves every A block (part) from its owner to the rank of its layer
and grid row that holds its panel, and every B block (part) to the rank of its layer and
grid column that holds its panel (one home each: inputs are not replicated). (2) Each layer
runs SUMMA over its own panels: for each panel the holders broadcast it, A along their
grid row and B along their grid column (all sectors in one message), and every rank adds
A_panel @ B_panel into its output rectangle: one GEMM per sector and panel. (3) One
all-to-all sends each output block piece to the block's owner, who adds it in place;
the owners' additions are the reduction over layers (a layer with no inner tuple of a
sector sends nothing for it).

Variants: ``summa`` (c = 1: a pr x pc grid of all ranks) and ``2.5d`` (c layers; by
default ``auto.default_layers(P)``, the smallest divisor of P not below P^(1/3), or
``layers=c`` for any divisor c of P). Per rank the broadcast volume shrinks (A panels
reach pc - 1 ranks of a grid 1/c the size, over 1/c of the inner tuples), while each
rank holds an output rectangle c times larger than with SUMMA on the same ranks: the
memory cost of replication, which the cost model (``auto``) checks before choosing c > 1.
Owner-computes steps (permuted additions, Hadamard products) get their inputs by one
all-to-all. Tensors stored in pieces (``placement="pieces"``: the integral classes, T2
and its kin where they have too few blocks for the ranks) take part unchanged: an
exchange gathers such a block where it is needed from the runs of its pieces (each
holder sends its run, ``exchange``; a request goes to every holder), and an output
block, or a partial one, is cut at piece boundaries and each piece sent to its owner,
who adds it (``deliver``, ``add_partials``); a block's home (where owner-computes
steps and the stationary modes compute it) is its first piece's owner. A contraction may instead keep one operand where it lives (its products on
the owners of A, of B or of the output; ``backends.stationary``), chosen per contraction
by cost (``stationary`` option: auto | never | a | b | c).
"""

from __future__ import annotations

import logging
import time
import numpy as np

from tessera.backends.budget import EXECUTOR_CACHE_MB
from tessera.backends.dist_base import DistributedExecutor, part_range
from tessera.backends import rank_choice, stationary
from tessera.backends.exchange import (add_partials, deliver, exchange, expect_from, involves, owned_views,
                                       request_exchange)
from tessera.backends.own_products import add_homes, hadamard_own, own_tasks, summa_own
from tessera.backends.registry import DEFAULT_VARIANT, check_options
from tessera.backends.schedule import Share
from tessera.backends.summa_layout import cell_layout
from tessera.errors import InputError
from tessera.plan.blocktasks import sector_signature, source_block
from tessera.runtime.distribution import default_layers, grid_shape

log = logging.getLogger("tessera.backends")

STATIONARY = ("auto", "never", *stationary.MODES)    # the executor's ``stationary`` option


class CollectiveComm:
    """The process grid of ``mpi-collective``: pr x pc x c ranks (c layers), with a
    runtime group per grid row and per grid column of each layer. ``pr x pc`` is chosen
    per contraction (``use``; ``default`` is the most square one); the groups of each shape
    are made on its first use. All-to-all over the workers (``World.alltoallv``, op
    ``alltoallv``) and broadcasts along a row or column (``Group.bcast``, ops ``bcast_row``
    and ``bcast_col``, peer: the root's World rank) are recorded in the comm log by the
    runtime."""

    def __init__(self, world, layers: int = 1):
        self.world = world
        self.size, self.rank = world.size, world.rank
        if layers < 1 or self.size % layers:
            raise InputError(f"mpi-collective: {layers} layer(s) do not divide {self.size} rank(s); "
                             "a 2.5D grid is pr x pc x layers ranks. Choose a divisor of the rank count "
                             "(or variant summa).")
        self.layers = layers
        self.default = grid_shape(self.size // layers)
        self._grids: dict = {}        # (pr, pc) -> (row, col, row group, col group)
        self.my_layer = self.rank // (self.size // layers)
        self.use(*self.default)
        self.log = world.comm_log

    def use(self, pr: int, pc: int) -> None:
        """Make pr x pc the grid of every layer (collective the first time a shape is used:
        every rank must pass the same shape)."""
        if (pr, pc) not in self._grids:
            row, col = divmod(self.rank % (pr * pc), pc)
            # same layer and grid row, group rank = column; same layer and column, rank = row
            self._grids[(pr, pc)] = (row, col, self.world.split(self.my_layer * pr + row, col),
                                     self.world.split(self.my_layer * pc + col, row))
        self.pr, self.pc = pr, pc
        self.my_row, self.my_col, self.row_group, self.col_group = self._grids[(pr, pc)]

    def grid_rank(self, row: int, col: int, layer: int | None = None) -> int:
        """World rank of grid position (row, col) in ``layer`` (default: this rank's)."""
        return ((self.my_layer if layer is None else layer) * self.pr + row) * self.pc + col

    def alltoallv(self, send: list, recv_counts: list) -> list:
        """send[d] = flat float64 array for rank d, recv_counts[s] = elements from rank s
        (every rank knows them from the structure); returns recv[s]."""
        return self.world.alltoallv(send, recv_counts)

    def bcast(self, buf: np.ndarray, root: int, axis: str) -> None:
        """Broadcast ``buf`` in place along this rank's grid row (root: a column) or grid
        column (root: a row) of its layer."""
        group = self.row_group if axis == "row" else self.col_group
        group.bcast(buf, root, op_name=f"bcast_{axis}")

    def free(self) -> None:
        for _, _, rg, cg in self._grids.values():
            rg.free()
            cg.free()
        self._grids = {}
        self.row_group = self.col_group = None


def held_keys(ga) -> set:
    """The stored keys whose block this rank is home of or holds a piece of."""
    return set(ga.home_keys()) | {k for k, _, _ in ga.local_pieces()}


class CollectiveExecutor(DistributedExecutor):
    name = "mpi-collective"

    def __init__(self, variant: str = DEFAULT_VARIANT["mpi-collective"], world=None, schedule=None,
                 layers: int | None = None, stationary: str = "auto", cache_mb: int = EXECUTOR_CACHE_MB):
        # frozen operands' panels and blocks kept across steps and iterations
        super().__init__(world, fetcher=self._fetch_many, frozen_bytes=int(cache_mb) << 20)
        check_options(self.name, variant, schedule, ranks=max(2, self.world.size))
        self.variant = variant
        size = self.world.size
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int)):
            raise InputError(f"mpi-collective: layers must be an integer, got {layers!r}")
        if self.variant == "summa":
            if layers not in (None, 1):
                raise InputError(f"mpi-collective: layers={layers} replicate the output over grid layers, "
                                 "which is variant 2.5d; variant summa has one layer. Use variant='2.5d'.")
            layers = 1
        elif layers is None:
            layers = default_layers(size)
        if stationary not in STATIONARY:
            raise InputError(f"mpi-collective: stationary={stationary!r}; expected one of {', '.join(STATIONARY)} "
                             "(auto: per contraction, by cost; never: always the grid)")
        self.stationary = stationary
        self._modes: dict = {}        # contraction -> (mode, SUMMA's grid, this rank's products)
        self._received: dict = {}     # (array, frozen entry) -> the most one rank receives of it
        self.cc = CollectiveComm(self.world, layers)
        if self.variant == "2.5d" and layers == 1:
            log.info("mpi-collective 2.5d on %d rank(s): one layer (no replication; the same steps as summa)",
                     size)

    def describe(self) -> dict:
        modes: dict = {}
        for mode, *_ in self._modes.values():
            modes[mode] = modes.get(mode, 0) + 1
        return {**super().describe(), "variant": self.variant, "grid": list(self.cc.default),
                "layers": self.cc.layers, "stationary": self.stationary, "contraction_modes": modes}

    def close(self) -> None:
        if not self.closed:
            self.cc.free()
            self._modes.clear()
            self._received.clear()
        super().close()

    def _kept(self, t, key, need, empty) -> tuple:
        """(what was kept for ``key`` of frozen tensor ``t`` earlier, or None; ``empty``, now
        kept under that key, to fill this time, or None). Only a frozen operand is kept
        (``FrozenCache``), while ``need`` (bytes: the most any rank keeps, from structure
        alone, so every rank decides alike; a number or a function giving it, called on a
        miss only) fits the bound with the others kept."""
        hit = self.frozen.get(t, key)
        if hit is not None or not t.constant:
            return hit, None
        need = need() if callable(need) else need
        return (None, empty) if self.frozen.put(t, key, empty, need) else (None, None)

    def _exchange(self, parts, step_key) -> dict:
        """``exchange`` of [(tensor, items)]: the blocks a rank receives for a frozen tensor
        are kept and not sent again while kept, keyed by ``step_key`` and the part's
        position. Collective: a rank lists only the items it sends or receives
        (``own_tasks``), so whether to keep is decided on the most any rank receives (one
        allreduce, the first time a key is offered; remembered, so a key the cache refuses
        asks no more)."""
        me, out, send, fill, missed = self.cc.rank, {}, [], [], False

        def most_received(ga, items, key) -> int:
            """Bytes the rank receiving the most of ``items`` gets."""
            if (ga.eid, key) not in self._received:
                mine = 0
                for _, bkey, dest, *part in items:
                    if dest == me and (ga.pieces > 1 or ga.owner(bkey) != dest):
                        lo, hi = part_range(ga, bkey, part[0] if part else None)
                        mine += 8 * int(np.prod([b - a for a, b in zip(lo, hi)]))
                self._received[ga.eid, key] = int(self.world.allreduce(mine, "max"))
            return self._received[ga.eid, key]
        for i, (t, items) in enumerate(parts):
            ga = t.dist.ga
            key = ("in", step_key, i)
            kept, keep = self._kept(t, key, lambda: most_received(ga, items, key), {})
            if kept is None:
                missed = True
                send += items
                if keep is not None:
                    # this part's own blocks: another part may read the same array
                    mine = {(ga.eid, key, *part) for _, key, dest, *part in items if dest == me}
                    fill.append((ga, keep, mine))
                continue
            out.update(kept)
            out.update(owned_views(me, [it for it in items if it[2] == me]))
        got = exchange(self.cc, send) if missed else {}
        for ga, keep, mine in fill:
            # copies: a view would hold the whole receive buffer
            keep.update({tag: blk.copy() for tag, blk in got.items()
                         if tag in mine and (ga.pieces > 1 or ga.owner(tag[1]) != me)})
        out.update(got)
        return out

    def task_order(self, task_set):
        """The static schedule, contiguous runs of near-equal cost (neighbouring tasks
        share inputs) or the tasks' homes; one task per rank per round, every rank in
        every round. A rank lists its own queue only (of the others: their lengths)."""
        me = self.world.rank
        share = Share(task_set.costs, self.world.size, "contiguous", task_set.home, keep=me)
        mine = share.queue(me)
        for k in range(share.longest):
            yield mine[k] if k < len(mine) else None

    # ---------------------------------------------------------------- block access
    def _fetch_many(self, handle, keys) -> dict:
        """``tensor.dist.fetch_many`` (collective): every rank asks, owners answer."""
        got = request_exchange(self.cc, self.store.by_eid, [(handle.ga, k) for k in keys])
        return {key: blk for (_, key), blk in got.items()}

    def fetch_blocks(self, requests) -> dict:
        """{(uid, key): block} for [(tensor, key)] of this rank (collective)."""
        got = request_exchange(self.cc, self.store.by_eid, [(r[0].dist.ga, *r[1:]) for r in requests])
        uid = {r[0].dist.ga.eid: r[0].uid for r in requests}
        return {(uid[tag[0]], *tag[1:]): blk for tag, blk in got.items() if tag[0] in uid}

    # Bulk-synchronous: a rank reads another's blocks only inside a collective that the
    # owner enters after finishing its own writes, and writes only its own blocks, so
    # steps need no barrier between them.
    def _needs_barrier(self, step) -> bool:
        return False

    def _wrote(self, step) -> None:
        step.out.tensor.version += 1

    def add_step(self, step) -> None:
        """out[okey] += scale * A[perm] (/ D[perm]) on the owner (home) of every output block;
        an output stored in pieces gets its pieces by one all-to-all (``deliver``)."""
        if self.rank_local(step):
            self.add_local(step)
            return
        out, me = step.out.tensor, self.cc.rank
        a, d = step.inputs[0].tensor, step.divisor.tensor if step.divisor is not None else None
        key = ("add", out.dist.ga.eid, a.dist.ga.eid, d.dist.ga.eid if d is not None else None, step.pairs,
               tuple(step.perms["a"]), tuple(step.perms["d"]) if d is not None else None)
        if key not in self._own:
            self._own[key] = self._add_homes(step)
        homes = self._own[key]
        items = [(a.dist.ga, akey, dest) for _, dest, akey, _ in homes]
        ditems = [(d.dist.ga, dkey, dest) for _, dest, _, dkey in homes] if d is not None else []
        blocks = self._exchange([(a, items)] + ([(d, ditems)] if d is not None else []), key)
        t0 = time.perf_counter()
        send, expect = [[] for _ in range(self.cc.size)], [[] for _ in range(self.cc.size)]
        for okey, home, akey, dkey in homes:
            if home != me:
                if out.pieced:
                    expect_from(out, okey, home, expect, me)
                continue
            blk = source_block(step, okey, blocks[(a.dist.ga.eid, akey)])
            if d is not None:
                blk = blk / blocks[(d.dist.ga.eid, dkey)].transpose(step.perms["d"])
            deliver(out, okey, blk, step.scale, send, me)
        self.compute_seconds += time.perf_counter() - t0
        if out.pieced:
            self.compute_seconds += add_partials(self.cc, step.scale, send, expect)

    def _held(self, t) -> set:
        """``own_products``' ``held``: the stored keys of ``t`` this rank is home of or holds
        a piece of."""
        return held_keys(t.dist.ga)

    def _add_homes(self, step) -> list:
        """``own_products.add_homes`` of this rank (once per step structure)."""
        return add_homes(step, self._held, step.out.tensor.dist.owner)

    def hadamard_step(self, step) -> None:
        """out[okey] += scale * sum of A x B (elementwise) on the home of every output
        block; a rank walks only its share (``_hadamard_own``)."""
        out, me = step.out.tensor, self.cc.rank
        a, b = step.inputs[0].tensor, step.inputs[1].tensor
        ga_a, ga_b = a.dist.ga, b.dist.ga
        key = ("hadamard", out.dist.ga.eid, ga_a.eid, ga_b.eid, step.perms["einsum"])
        if key not in self._own:
            self._own[key] = self._hadamard_own(step)
        pairs = self._own[key]
        blocks = self._exchange([(a, [(ga_a, ka, home) for _, home, v in pairs for ka, _ in v]),
                                 (b, [(ga_b, kb, home) for _, home, v in pairs for _, kb in v])], key)
        t0 = time.perf_counter()
        send, expect = [[] for _ in range(self.cc.size)], [[] for _ in range(self.cc.size)]
        expr = step.perms["einsum"]
        for okey, home, plist in pairs:
            if home != me:
                if out.pieced:
                    expect_from(out, okey, home, expect, me)
                continue
            blk = sum(np.einsum(expr, blocks[(ga_a.eid, ka)], blocks[(ga_b.eid, kb)]) for ka, kb in plist)
            deliver(out, okey, blk, step.scale, send, me)
        self.compute_seconds += time.perf_counter() - t0
        if out.pieced:
            self.compute_seconds += add_partials(self.cc, step.scale, send, expect)

    def _hadamard_own(self, step) -> list:
        """``own_products.hadamard_own`` of this rank (once per step structure)."""
        me, gas = self.cc.rank, tuple(r.tensor.dist.ga for r in step.inputs)
        return hadamard_own(step, me, self._held, step.out.tensor.dist.owner,
                            lambda x, key, home: involves(gas[x], key, None, home, me))

    # ---------------------------------------------------------------- SUMMA / 2.5D
    def _mode(self, step, sig) -> tuple:
        """(mode, grid, share): the pr x pc x layers grid SUMMA runs the contraction on
        (of the shapes with the fewest idle lines, the least cost of the busiest rank as
        counted rank by rank) and ``"summa"`` or the operand kept stationary (by the same
        count), with (the contraction's key, this rank's ``own_tasks``: the products it
        runs, sends for or receives for, with their ranks); ``stationary.choose``'s choice, each
        rank counting only itself (``rank_choice.rank_costs``: the products and items of the
        blocks it holds) and one allreduce of the candidates' costs giving the busiest
        rank's; decided once per contraction; frozen operands count as moved once."""
        A, B, C = step.inputs[0].tensor, step.inputs[1].tensor, step.out.tensor
        perms = (step.perms["a"], step.perms["b"], step.perms["c"])
        key = (sig, perms, self.stationary, A.dist.ga.eid, B.dist.ga.eid, C.dist.ga.eid, A.constant, B.constant)
        if key in self._modes:
            return self._modes[key]
        layers = self.cc.layers
        if self.cc.size == 1:
            self._modes[key] = ("summa", (1, 1, layers), None)
            return self._modes[key]
        ops = stationary.Operands((A, B, C), (A.dist.owner, B.dist.owner, C.dist.owner),
                                  tuple(t.dist.ga.piece_table if t.pieced else None for t in (A, B, C)))
        moved_once = [x for x, t in (("a", A), ("b", B)) if t.constant]
        held = tuple(held_keys(t.dist.ga) for t in (A, B, C))
        if self.stationary in stationary.MODES:      # forced: nothing to weigh (no grid is used)
            mode, grid = self.stationary, (*self.cc.default, layers)
        else:                                        # ``never``: SUMMA's shapes only
            modes = stationary.MODES if self.stationary == "auto" else ()
            costs = rank_choice.rank_costs(sig, perms, layers, ops, self.cc.size, self.cc.rank, held, moved_once, modes)
            mode, grid = rank_choice.pick(rank_choice.candidates(sig, perms, layers, self.cc.size, modes),
                                          self.world.allreduce(costs, "max"))
        self._modes[key] = (mode, grid, None if mode == "summa" else
                            (key, own_tasks(sig, perms, ops, held, mode)))
        return self._modes[key]

    def _stationary_step(self, step, share) -> None:
        """One contraction with an operand stationary: every block product on the rank its
        stationary block names; ``share`` = (the contraction's key, ``own_tasks``: this
        rank's products, the only ones it lists). The blocks a rank lacks come by one
        all-to-all (a frozen operand's kept, ``_exchange``); each rank sums its products of
        an output block and sends that partial block to the owner, who adds it (one
        all-to-all)."""
        cc, me = self.cc, self.cc.rank
        A, B, C = step.inputs[0].tensor, step.inputs[1].tensor, step.out.tensor
        pa, pb, pc_ = step.perms["a"], step.perms["b"], step.perms["c"]
        key, tasks = share
        ga_a, ga_b = A.dist.ga, B.dist.ga
        blocks = self._exchange([(A, [(ga_a, a, r) for t in tasks for a, _, _, r in t.products]),
                                 (B, [(ga_b, b, r) for t in tasks for _, b, _, r in t.products])], key)
        send = [[] for _ in range(cc.size)]
        expect = [[] for _ in range(cc.size)]
        c0 = time.perf_counter()
        for t in tasks:
            # partial blocks (pieces) held here from the other ranks with products of it, in task order
            for r in sorted({r for *_, r in t.products} - {me}):
                expect_from(C, t.out, r, expect, me)
            acc = None
            for akey, bkey, k, r in t.products:
                if r != me:
                    continue
                prod = (blocks[(ga_a.eid, akey)].transpose(pa).reshape(t.m, k)
                        @ blocks[(ga_b.eid, bkey)].transpose(pb).reshape(k, t.n))
                if acc is None:
                    acc = prod
                else:
                    acc += prod
            if acc is None:
                continue
            deliver(C, t.out, acc.reshape(t.out_shape).transpose(pc_), step.scale, send, me)
        self.compute_seconds += time.perf_counter() - c0 + add_partials(cc, step.scale, send, expect)

    def contract_step(self, step) -> None:
        cc = self.cc
        A, B, C = step.inputs[0].tensor, step.inputs[1].tensor, step.out.tensor
        pa, pb, pc_ = step.perms["a"], step.perms["b"], step.perms["c"]
        sig = sector_signature(step)
        mode, (pr, pc, _), share = self._mode(step, sig)
        if mode != "summa":
            self._stationary_step(step, share)
            return
        cc.use(pr, pc)
        me_row, me_col, me_layer = cc.my_row, cc.my_col, cc.my_layer
        # this rank's cell of the layout (``cell_layout``: from the deal, not every block)
        lay = cell_layout(sig, pa, pb, cc.pr, cc.pc, cc.layers, me_layer, me_row, me_col)
        layout_key = (sig, pa, pb, cc.pr, cc.pc, cc.layers)
        kept_a, keep_a = self._kept(A, ("a", layout_key), lay["a_strip_bytes"], [])
        kept_b, keep_b = self._kept(B, ("b", layout_key), lay["b_strip_bytes"], [])
        # (1) blocks (or parts: a cut inner tuple) to their homes, one each, in the layer
        # of their inner unit (not for an operand whose panels were kept); a rank lists the
        # items it sends or receives (``_summa_own``)
        own = self._summa_own(step, layout_key)
        items = ([] if kept_a is not None else own["a"]) + ([] if kept_b is not None else own["b"])
        home = exchange(cc, items) if kept_a is None or kept_b is None else {}
        # (2) this layer's panels: A along grid rows, B along grid columns
        nsec = len(sig)
        active = lay["active"]
        cmat = [np.zeros((lay["row_total"][n], lay["col_total"][n]) if active[n] else (0, 0)) for n in range(nsec)]
        compute = 0.0
        for p in range(lay["npanel"]):
            a_root, b_root = p % cc.pc, p % cc.pr
            abuf = self._panel(kept_a, keep_a, p, lay["a_panel_size"][p], a_root, "row",
                               me_col == a_root and (lambda buf: self._pack(buf, lay, "a", p, A, home, pa)))
            bbuf = self._panel(kept_b, keep_b, p, lay["b_panel_size"][p], b_root, "col",
                               me_row == b_root and (lambda buf: self._pack(buf, lay, "b", p, B, home, pb)))
            c0 = time.perf_counter()
            aoff = boff = 0
            for n in range(nsec):
                m, k, ncol = lay["row_total"][n], lay["panel_inner"][n][p], lay["col_total"][n]
                am = abuf[aoff:aoff + m * k].reshape(m, k)
                bm = bbuf[boff:boff + k * ncol].reshape(k, ncol)
                aoff += m * k
                boff += k * ncol
                if m and k and ncol:
                    cmat[n] += am @ bm
            compute += time.perf_counter() - c0
        # (3) output pieces to the owners of the output blocks (they add: the reduction
        # over layers); a layer without inner tuples in a sector has nothing to send
        send = [[] for _ in range(cc.size)]
        expect = [[] for _ in range(cc.size)]
        c0 = time.perf_counter()
        for n, (_, rows, inner, cols) in enumerate(sig):
            if not active[n]:
                continue
            for r, c, ro, co in lay["out"][n]:
                blk = cmat[n][ro:ro + rows.sizes[r], co:co + cols.sizes[c]]
                okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in pc_)
                if okey in C.aliases:        # a canonical output receives its canonical blocks only
                    continue
                deliver(C, okey, blk.reshape(rows.shapes[r] + cols.shapes[c]).transpose(pc_), step.scale,
                        send, cc.rank)
        compute += time.perf_counter() - c0
        for okey, src in own["expect"]:
            expect_from(C, okey, src, expect, cc.rank)
        self.compute_seconds += compute + add_partials(cc, step.scale, send, expect)

    def _summa_own(self, step, layout_key) -> dict:
        """This rank's share of a SUMMA contraction's lists (``own_products.summa_own``),
        made once per layout and operands from its grid cell and held blocks, walked every
        iteration: ``a``, ``b``: the home items it sends or receives, as ``exchange`` takes
        them; ``expect``: (output key, grid rank) of the partial blocks it receives, in the
        order they are sent."""
        cc, me = self.cc, self.cc.rank
        A, B, C = step.inputs[0].tensor, step.inputs[1].tensor, step.out.tensor
        key = ("summa", layout_key, A.dist.ga.eid, B.dist.ga.eid, C.dist.ga.eid, step.perms["c"])
        if key not in self._own:
            gas = {"a": A.dist.ga, "b": B.dist.ga}
            own = summa_own(step, (cc.pr, cc.pc, cc.layers), me, self._held,
                            lambda x, bkey, part, dest: involves(gas[x], bkey, part, dest, me))
            for x in "ab":
                own[x] = [(gas[x], bkey, dest, *([part] if part else [])) for bkey, dest, part in own[x]]
            self._own[key] = own
        return self._own[key]

    def _panel(self, kept, keep, p: int, size: int, root: int, axis: str, pack):
        """Panel ``p`` of an operand on this rank: the one ``kept`` from an earlier iteration
        (a frozen operand), else broadcast along the grid ``axis`` from ``root``, which
        ``pack``s it (``pack`` is False elsewhere); appended to ``keep`` when kept."""
        if kept is not None:
            return kept[p]
        buf = np.empty(size)
        if pack:
            pack(buf)
        self.cc.bcast(buf, root, axis)
        if keep is not None:
            keep.append(buf)
        return buf

    @staticmethod
    def _pack(buf, lay, x: str, p: int, t, home, perm) -> None:
        """Panel ``p`` of operand ``x`` ("a": this rank's grid row of A, "b": its column of
        B) into ``buf``: per sector the (rows x inner) or (inner x columns) matrix of the
        ``cell_layout``'s pack entries, from the blocks (parts) at ``home``."""
        off = 0
        for n, entries in enumerate(lay[f"{x}_pack"]):
            k = lay["panel_inner"][n][p]
            rows, cols = (lay["row_total"][n], k) if x == "a" else (k, lay["col_total"][n])
            mat = buf[off:off + rows * cols].reshape(rows, cols)
            for key, part, ro, co, rs, cs in entries[p]:
                blk = home[(t.dist.ga.eid, key) if part is None else (t.dist.ga.eid, key, part)]
                mat[ro:ro + rs, co:co + cs] = blk.transpose(perm).reshape(rs, cs)
            off += rows * cols
