"""Patches of a GlobalArray: rectangular global index ranges [lo, hi) that may span any
number of blocks, owners and pieces (``PatchAccess``, a base of ``GlobalArray``).

A patch is cut into its boxes in the blocks it touches (``BlockLayout.pieces``); a box in
a whole block is one operation on its owner (an MPI subarray datatype where it is not the
whole block; a copy where the owner's memory is mapped here, but accumulates), a box in a
block stored in pieces one operation per owner over its rows in that owner's pieces
(``placement.part_runs``, indexed datatypes), so only the box's elements move. Semantics
(completion, atomicity, zeros for missing blocks) are ``runtime.global_array``'s.
"""

from __future__ import annotations

from time import perf_counter

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime.handle import Handle


class PatchAccess:
    """get/put/acc of patches (blocking and non-blocking) over a GlobalArray's slots,
    window and exposure (the attributes ``GlobalArray`` sets)."""

    def get_patch(self, lo, hi) -> np.ndarray:
        """A copy of the global index range [lo, hi) (zeros where blocks do not exist)."""
        return self._patch("get", lo, hi, None, 1.0, blocking=True)

    def iget_patch(self, lo, hi) -> Handle:
        return self._patch("get", lo, hi, None, 1.0, blocking=False)

    def put_patch(self, lo, hi, a) -> None:
        self._patch("put", lo, hi, a, 1.0, blocking=True)

    def acc_patch(self, lo, hi, a, scale=1.0) -> None:
        self._patch("acc", lo, hi, a, scale, blocking=True)

    def iacc_patch(self, lo, hi, a, scale=1.0) -> Handle:
        return self._patch("acc", lo, hi, a, scale, blocking=False)

    def _patch(self, op: str, lo, hi, a, scale, blocking: bool):
        t0 = perf_counter()
        if self._win is None:
            self._check_live()
        lo, hi = self.layout.check_patch(lo, hi)
        pshape = tuple(b - a_ for a_, b in zip(lo, hi))
        pieces, missing = self.layout.pieces(lo, hi)
        if op == "get":
            buf = np.zeros(pshape, self.dtype) if missing else np.empty(pshape, self.dtype)
        else:
            if missing:
                raise RuntimeLayerError(
                    f"{op}_patch [{lo}, {hi}) on global array {self.name!r} touches "
                    f"{len(missing)} block(s) that do not exist, e.g. {missing[0]}; expected a "
                    "patch covered by existing blocks. Split the patch or create those blocks."
                )
            buf = self._as_block(a, pshape, f"{op}_patch", scale)
        win, mt, types, isz = self._win, self._mpitype, self._types, self.itemsize
        targets, parts, boxes = [], [], []
        local_done = False
        for p in pieces:
            owner, target, tspec, bshape, count, _, block = self._slots[p.key]
            if tspec is None:       # a block stored in pieces: one operation per run of the box
                local_done = self._piece_patch(op, p, buf, targets, parts, boxes) or local_done
                continue
            parts.append((owner, p.size * isz))
            if block is not None and op != "acc":
                if not local_done:
                    self._exp.sync_memory()
                    local_done = True
                bsl = tuple(slice(s, s + n) for s, n in zip(p.block_start, p.shape))
                psl = tuple(slice(s, s + n) for s, n in zip(p.patch_start, p.shape))
                if op == "get":
                    buf[psl] = block[bsl]
                else:
                    block[bsl] = buf[psl]
                continue
            # acc always goes through MPI (atomic with every other rank's accs)
            if p.shape == pshape:
                origin = [buf, p.size, mt]
            else:
                origin = [buf, 1, types.get(mt, pshape, p.shape, p.patch_start)]
            if p.shape != bshape:
                tspec = (tspec[0], 1, types.get(mt, bshape, p.shape, p.block_start))
            if op == "get":
                win.Get(origin, target, tspec)
            elif op == "put":
                win.Put(origin, target, tspec)
            else:
                win.Accumulate(origin, target, tspec, self._SUM)
            if target not in targets:
                targets.append(target)
        if local_done and op == "put":
            self._exp.sync_memory()
        if boxes:                   # boxes of pieced blocks assembled beside buf: complete them now
            for t in targets:
                self._flush(t)
            targets = []
            for psl, box in boxes:
                if psl is not None:
                    buf[psl] = box
        result = buf if op == "get" else None
        if blocking:
            for t in targets:
                self._flush(t)
            self._log.add_split(op, parts, perf_counter() - t0)
            return result
        h = Handle(self, op, result, tuple((t, self._epochs[t]) for t in targets), parts,
                   keep=None if op == "get" else buf)
        self._log.add_split(op, parts, perf_counter() - t0)
        return h

    def _piece_patch(self, op: str, p, buf, targets: list, parts: list, boxes: list) -> bool:
        """The box ``p`` of ``_patch``'s ``buf`` in a block stored in pieces: one operation
        per owner, over the runs of the box in its pieces (``piece_runs``: a contiguous row
        of the box each; indexed datatypes on both sides where there are several), so only
        the box's elements move, in as many operations as whole pieces would take; mapped
        runs are copied (but acc, as for whole blocks). The runs go straight to or from
        ``buf`` when the box is the whole patch, else through a box of their own, listed in
        ``boxes`` (``_patch`` completes it and, for a get, copies it into ``buf``). Appends
        the targets and (owner, bytes) of its operations; returns whether it copied mapped
        memory."""
        runs = self.piece_runs(p.key, tuple(x for ax, (a, n) in enumerate(zip(p.block_start, p.shape))
                                            for x in (ax, a, a + n)))
        if p.shape == buf.shape:
            box = buf
        else:
            psl = tuple(slice(a, a + n) for a, n in zip(p.patch_start, p.shape))
            box = np.empty(p.shape, self.dtype) if op == "get" else np.ascontiguousarray(buf[psl])
            boxes.append((psl if op == "get" else None, box))
        flat, mt, isz, exp = box.reshape(-1), self._mpitype, self.itemsize, self._exp
        mapped, remote = False, {}
        for owner, off, pos, n in zip(*(c.tolist() for c in (runs.owner, runs.offset, runs.pos, runs.count))):
            view = self._mapped.get(owner)
            if view is None or op == "acc":
                remote.setdefault(owner, []).append((off, pos, n))
                continue
            parts.append((owner, n * isz))
            if not mapped:
                exp.sync_memory()
                mapped = True
            if op == "get":
                flat[pos:pos + n] = view[off:off + n]
            else:
                view[off:off + n] = flat[pos:pos + n]
        call = {"get": self._win.Get, "put": self._win.Put}.get(op)
        for owner, owned in remote.items():
            target, base = exp.targets[owner], exp.base[owner]
            offs, poss, ns = (list(c) for c in zip(*owned))
            if len(ns) == 1:
                types = ()
                origin, disp = [flat[poss[0]:poss[0] + ns[0]], ns[0], mt], (base + offs[0], ns[0], mt)
            else:
                types = (mt.Create_indexed(ns, poss).Commit(), mt.Create_indexed(ns, offs).Commit())
                origin, disp = [flat, 1, types[0]], (base, 1, types[1])
            if call is not None:
                call(origin, target, disp)
            else:
                self._win.Accumulate(origin, target, disp, self._SUM)
            for t in types:         # freed once started: MPI completes the operation with them
                t.Free()
            parts.append((owner, sum(ns) * isz))
            if target not in targets:
                targets.append(target)
        return mapped
