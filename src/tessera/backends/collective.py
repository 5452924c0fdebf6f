"""``mpi-collective``: bulk-synchronous execution; inputs move only by collectives.

Every rank takes part in every step. No one-sided operation is used: the tensors still
live in the ranks' memory (the same distributed storage as ``mpi-onesided``), but
blocks travel only by all-to-all exchanges and broadcasts (``CollectiveComm``).

Contraction (SUMMA, van de Geijn & Watts 1997, per symmetry sector): the ranks form a
pr x pc grid. Row tile tuples of each sector are dealt to grid rows, column tuples to
grid columns (balanced by size), inner tuples to panels. (1) One all-to-all moves every
A block from its owner to the rank of its grid row that holds its panel, and every B
block to the rank of its grid column that holds its panel. (2) For each panel the
holders broadcast it, A along their grid row and B along their grid column (all
sectors in one message), and every rank adds A_panel @ B_panel into its output
rectangle: one GEMM per sector and panel. (3) One all-to-all sends each output block
to its owner, who adds it in place. Owner-computes steps (permuted additions, Hadamard
products) get their inputs by one all-to-all.

Variant ``summa`` is the only one; replication of an input across grid layers (2.5D)
is not implemented.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from tessera.backends.dist_base import DistributedExecutor, check_choice, part_range, part_slice
from tessera.backends.auto import grid_shape
from tessera.plan.blocktasks import _invert

VARIANTS = ("summa",)


def _deal(sizes, nbins: int) -> list:
    """Bin of each item: greedy by size, largest first (deterministic)."""
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    loads = [0] * nbins
    out = [0] * len(sizes)
    for i in order:
        b = min(range(nbins), key=lambda q: (loads[q], q))
        out[i] = b
        loads[b] += sizes[i]
    return out


class CollectiveComm:
    """All-to-all and grid broadcasts over the workers, recorded in the comm log.

    The runtime offers no sub-communicators or all-to-all (see docs/distributed.md), so
    they are made here from ``world.comm`` and every call is recorded with
    ``world.comm_log.add`` (op names ``alltoallv``, ``bcast_row``, ``bcast_col``,
    ``allgather``)."""

    def __init__(self, world):
        self.world = world
        self.size, self.rank = world.size, world.rank
        self.pr, self.pc = grid_shape(self.size)
        self.my_row, self.my_col = divmod(self.rank, self.pc)
        comm = world.comm
        self.row_comm = comm.Split(self.my_row, self.my_col)    # same grid row, rank = column
        self.col_comm = comm.Split(self.my_col, self.my_row)    # same grid column, rank = row
        self.log = world.comm_log

    def grid_rank(self, row: int, col: int) -> int:
        return row * self.pc + col

    def alltoallv(self, send: list, recv_counts: list) -> list:
        """send[d] = flat float64 array for rank d, recv_counts[s] = elements from rank s
        (every rank knows them from the structure); returns recv[s]."""
        t0 = time.perf_counter()
        counts = [int(a.size) for a in send]
        sbuf = np.concatenate(send) if sum(counts) else np.zeros(1)
        sdis = [0] + np.cumsum(counts)[:-1].tolist()
        rc = [int(c) for c in recv_counts]
        rdis = [0] + np.cumsum(rc)[:-1].tolist()
        rbuf = np.empty(max(1, sum(rc)))
        self.world.comm.Alltoallv([sbuf, (counts, sdis)], [rbuf, (rc, rdis)])
        sent = 8 * (sum(counts) - counts[self.rank])
        self.log.add("alltoallv", -1, sent, time.perf_counter() - t0)
        return [rbuf[d:d + c] for d, c in zip(rdis, rc)]

    def bcast(self, buf: np.ndarray, root: int, axis: str) -> None:
        comm = self.row_comm if axis == "row" else self.col_comm
        if comm.Get_size() == 1 or buf.size == 0:
            return
        t0 = time.perf_counter()
        comm.Bcast(buf, root=root)
        peer = self.grid_rank(self.my_row, root) if axis == "row" else self.grid_rank(root, self.my_col)
        self.log.add(f"bcast_{axis}", peer, buf.nbytes, time.perf_counter() - t0)

    def free(self) -> None:
        for c in (self.row_comm, self.col_comm):
            if c is not None:
                c.Free()
        self.row_comm = self.col_comm = None


def exchange(cc: CollectiveComm, items) -> dict:
    """Blocks to where they are needed, by one all-to-all.

    ``items``: every (global array, key, destination rank) of the step, or (global array,
    key, destination, part) for rows lo..hi of one axis (``part = (axis, lo, hi)``), the
    same list on every rank (deterministic). Returns {(array id, key): block} (with
    ``part`` appended to the key when given) of the items destined here (owned blocks as
    views)."""
    me, size = cc.rank, cc.size
    send = [[] for _ in range(size)]
    expect = [[] for _ in range(size)]
    out: dict = {}
    seen = set()
    for ga, key, dest, *part in items:
        part = part[0] if part else None
        tag = (ga.eid, key) if part is None else (ga.eid, key, part)
        if (tag, dest) in seen:
            continue
        seen.add((tag, dest))
        src = ga.owner(key)
        if src == me:
            view = ga.local_view(key)
            if part is not None:
                view = view[part_slice(view.ndim, part)]
            if dest == me:
                out[tag] = view
            else:
                send[dest].append(view.ravel())
        elif dest == me:
            lo, hi = part_range(ga, key, part)
            expect[src].append((tag, tuple(b - a for a, b in zip(lo, hi))))
    counts = [sum(int(np.prod(shape)) for _, shape in lst) for lst in expect]
    recv = cc.alltoallv([np.concatenate(s) if s else np.zeros(0) for s in send], counts)
    for src, lst in enumerate(expect):
        pos, buf = 0, recv[src]
        for tag, shape in lst:
            n = int(np.prod(shape))
            out[tag] = buf[pos:pos + n].reshape(shape)
            pos += n
    return out


def request_exchange(cc: CollectiveComm, arrays: dict, requests) -> dict:
    """Blocks by request: every rank names what it needs (one allgather of keys), the
    owners answer (one all-to-all). ``requests`` = [(global array, key)] or [(global
    array, key, part)] of this rank; ``arrays`` maps array ids to the arrays any rank may
    name."""
    mine = sorted({(ga.eid, key, *rest) for ga, key, *rest in requests}, key=repr)
    everyone = cc.world.allgather(mine)
    items = [(arrays[eid], key, dest, *rest) for dest, lst in enumerate(everyone) for eid, key, *rest in lst]
    return exchange(cc, items)


class CollectiveExecutor(DistributedExecutor):
    name = "mpi-collective"

    def __init__(self, variant: str = "summa", world=None, schedule=None):
        super().__init__(world, fetcher=self._fetch_many)
        if schedule is not None:
            check_choice("schedule (mpi-collective is bulk-synchronous and has none)", schedule, ())
        self.variant = check_choice("variant (mpi-collective)", variant, VARIANTS)
        self.cc = CollectiveComm(self.world)
        self._known: dict = {}

    def describe(self) -> dict:
        return {**super().describe(), "variant": self.variant, "grid": [self.cc.pr, self.cc.pc]}

    def close(self) -> None:
        if not self.closed:
            self.cc.free()
        super().close()

    def task_order(self, costs, chunk: int):
        """Static partition into contiguous runs of near-equal cost (neighbouring tasks
        share inputs); one task per rank per round, every rank in every round."""
        from tessera.backends.distributed import contiguous_runs
        owner = contiguous_runs(list(costs), self.world.size)
        mine = [i for i, r in enumerate(owner) if r == self.world.rank]
        rounds = max(owner.count(r) for r in range(self.world.size)) if costs else 0
        for k in range(rounds):
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
        out = step.out.tensor
        a, d = step.inputs[0].tensor, step.divisor.tensor if step.divisor is not None else None
        from tessera.plan.blocktasks import add_source
        items = []
        for okey in out.allowed_keys():
            dest = out.dist.owner(okey)
            akey, dkey = add_source(step, okey)
            items.append((a.dist.ga, akey, dest))
            if d is not None:
                items.append((d.dist.ga, dkey, dest))
        blocks = exchange(self.cc, items)
        t0 = time.perf_counter()
        for okey, view in out.blocks.items():
            akey, dkey = add_source(step, okey)
            blk = blocks[(a.dist.ga.eid, akey)].transpose(step.perms["a"])
            if d is not None:
                blk = blk / blocks[(d.dist.ga.eid, dkey)].transpose(step.perms["d"])
            view += step.scale * blk if step.scale != 1.0 else blk
        self.compute_seconds += time.perf_counter() - t0

    def hadamard_step(self, step) -> None:
        from tessera.plan.blocktasks import hadamard_pairs
        out = step.out.tensor
        a, b = step.inputs[0].tensor, step.inputs[1].tensor
        pairs = hadamard_pairs(step)
        ga_a, ga_b = a.dist.ga, b.dist.ga
        items = [(ga_a, ka, out.dist.owner(ok)) for ok, v in pairs.items() for ka, _ in v] + \
                [(ga_b, kb, out.dist.owner(ok)) for ok, v in pairs.items() for _, kb in v]
        blocks = exchange(self.cc, items)
        t0 = time.perf_counter()
        expr = step.perms["einsum"]
        for okey, plist in pairs.items():
            if okey in out.blocks:
                for ka, kb in plist:
                    out.blocks[okey] += step.scale * np.einsum(expr, blocks[(ga_a.eid, ka)],
                                                               blocks[(ga_b.eid, kb)])
        self.compute_seconds += time.perf_counter() - t0

    # ---------------------------------------------------------------- SUMMA
    def contract_step(self, step) -> None:
        cc = self.cc
        A, B, C = step.inputs[0].tensor, step.inputs[1].tensor, step.out.tensor
        pa, pb, pc_ = step.perms["a"], step.perms["b"], step.perms["c"]
        sig = tuple((s.irrep, s.rows, s.inner, s.cols) for s in step.sectors)
        lay = _summa_layout(sig, pa, pb, cc.pr, cc.pc)
        me_row, me_col = cc.my_row, cc.my_col
        # (1) blocks to their SUMMA homes
        items = [(A.dist.ga, akey, cc.grid_rank(hr, hc)) for akey, hr, hc in lay["a_homes"]]
        items += [(B.dist.ga, bkey, cc.grid_rank(hr, hc)) for bkey, hr, hc in lay["b_homes"]]
        home = exchange(cc, items)
        # (2) panels: A along grid rows, B along grid columns
        nsec = len(sig)
        cmat = [np.zeros((lay["row_total"][n][me_row], lay["col_total"][n][me_col])) for n in range(nsec)]
        compute = 0.0
        for p in range(lay["npanel"]):
            a_root, b_root = p % cc.pc, p % cc.pr
            abuf = np.empty(lay["a_panel_size"][p][me_row])
            if me_col == a_root:
                self._pack_a(abuf, lay, p, me_row, A, home, pa)
            cc.bcast(abuf, a_root, "row")
            bbuf = np.empty(lay["b_panel_size"][p][me_col])
            if me_row == b_root:
                self._pack_b(bbuf, lay, p, me_col, B, home, pb)
            cc.bcast(bbuf, b_root, "col")
            c0 = time.perf_counter()
            aoff = boff = 0
            for n in range(nsec):
                m, k, ncol = lay["row_total"][n][me_row], lay["panel_inner"][n][p], lay["col_total"][n][me_col]
                am = abuf[aoff:aoff + m * k].reshape(m, k)
                bm = bbuf[boff:boff + k * ncol].reshape(k, ncol)
                aoff += m * k
                boff += k * ncol
                if m and k and ncol:
                    cmat[n] += am @ bm
            compute += time.perf_counter() - c0
        # (3) output blocks to their owners
        send = [[] for _ in range(cc.size)]
        expect = [[] for _ in range(cc.size)]
        c0 = time.perf_counter()
        for n, (_, rows, inner, cols) in enumerate(sig):
            for r, c, ro, co in lay["out"][n][me_row][me_col]:
                blk = cmat[n][ro:ro + rows.sizes[r], co:co + cols.sizes[c]]
                okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in pc_)
                dest = C.dist.owner(okey)
                res = blk.reshape(rows.shapes[r] + cols.shapes[c]).transpose(pc_)
                if dest == cc.rank:
                    C.blocks[okey] += step.scale * res
                else:
                    send[dest].append(np.ascontiguousarray(res).ravel())
        compute += time.perf_counter() - c0
        for n, (_, rows, inner, cols) in enumerate(sig):
            for gr in range(cc.pr):
                for gc in range(cc.pc):
                    src = cc.grid_rank(gr, gc)
                    if src == cc.rank:
                        continue
                    for r, c, _, _ in lay["out"][n][gr][gc]:
                        okey = tuple((rows.tuples[r] + cols.tuples[c])[q] for q in pc_)
                        if C.dist.owner(okey) == cc.rank:
                            expect[src].append(okey)
        counts = [sum(C.blocks[k].size for k in keys) for keys in expect]
        recv = cc.alltoallv([np.concatenate(s) if s else np.zeros(0) for s in send], counts)
        c0 = time.perf_counter()
        for src, keys in enumerate(expect):
            pos, buf = 0, recv[src]
            for okey in keys:
                view = C.blocks[okey]
                view += step.scale * buf[pos:pos + view.size].reshape(view.shape)
                pos += view.size
        compute += time.perf_counter() - c0
        self.compute_seconds += compute

    @staticmethod
    def _pack_a(buf, lay, p, grow, A, home, pa) -> None:
        off = 0
        for n, entries in enumerate(lay["a_pack"]):
            m, k = lay["row_total"][n][grow], lay["panel_inner"][n][p]
            mat = buf[off:off + m * k].reshape(m, k)
            for akey, ro, io, rs, ks in entries[p][grow]:
                mat[ro:ro + rs, io:io + ks] = home[(A.dist.ga.eid, akey)].transpose(pa).reshape(rs, ks)
            off += m * k

    @staticmethod
    def _pack_b(buf, lay, p, gcol, B, home, pb) -> None:
        off = 0
        for n, entries in enumerate(lay["b_pack"]):
            k, ncol = lay["panel_inner"][n][p], lay["col_total"][n][gcol]
            mat = buf[off:off + k * ncol].reshape(k, ncol)
            for bkey, io, co, ks, cs in entries[p][gcol]:
                mat[io:io + ks, co:co + cs] = home[(B.dist.ga.eid, bkey)].transpose(pb).reshape(ks, cs)
            off += k * ncol


@lru_cache(maxsize=2048)
def _summa_layout(sig, pa, pb, pr: int, pc: int) -> dict:
    """Where every block of a contraction goes in the pr x pc SUMMA layout (structure only)."""
    npanel = max(pr, pc)
    lay = {"npanel": npanel, "row_total": [], "col_total": [], "panel_inner": [], "a_homes": [],
           "b_homes": [], "a_pack": [], "b_pack": [], "out": []}
    a_panel = [[0] * pr for _ in range(npanel)]
    b_panel = [[0] * pc for _ in range(npanel)]
    for _, rows, inner, cols in sig:
        grow = _deal(rows.sizes, pr)
        gcol = _deal(cols.sizes, pc)
        panel = _deal(inner.sizes, npanel)
        roff, rtot = [0] * len(rows.tuples), [0] * pr
        for r, g in enumerate(grow):
            roff[r] = rtot[g]
            rtot[g] += rows.sizes[r]
        coff, ctot = [0] * len(cols.tuples), [0] * pc
        for c, g in enumerate(gcol):
            coff[c] = ctot[g]
            ctot[g] += cols.sizes[c]
        ioff, itot = [0] * len(inner.tuples), [0] * npanel
        for q, p in enumerate(panel):
            ioff[q] = itot[p]
            itot[p] += inner.sizes[q]
        apack = [[[] for _ in range(pr)] for _ in range(npanel)]
        bpack = [[[] for _ in range(pc)] for _ in range(npanel)]
        for r, rk in enumerate(rows.tuples):
            for q, kk in enumerate(inner.tuples):
                akey = _invert(rk + kk, pa)
                p = panel[q]
                lay["a_homes"].append((akey, grow[r], p % pc))
                apack[p][grow[r]].append((akey, roff[r], ioff[q], rows.sizes[r], inner.sizes[q]))
        for q, kk in enumerate(inner.tuples):
            for c, ck in enumerate(cols.tuples):
                bkey = _invert(kk + ck, pb)
                p = panel[q]
                lay["b_homes"].append((bkey, p % pr, gcol[c]))
                bpack[p][gcol[c]].append((bkey, ioff[q], coff[c], inner.sizes[q], cols.sizes[c]))
        out = [[[] for _ in range(pc)] for _ in range(pr)]
        for r in range(len(rows.tuples)):
            for c in range(len(cols.tuples)):
                out[grow[r]][gcol[c]].append((r, c, roff[r], coff[c]))
        for p in range(npanel):
            for g in range(pr):
                a_panel[p][g] += rtot[g] * itot[p]
            for g in range(pc):
                b_panel[p][g] += itot[p] * ctot[g]
        lay["row_total"].append(rtot)
        lay["col_total"].append(ctot)
        lay["panel_inner"].append(itot)
        lay["a_pack"].append(apack)
        lay["b_pack"].append(bpack)
        lay["out"].append(out)
    lay["a_panel_size"] = a_panel
    lay["b_panel_size"] = b_panel
    return lay
