"""numpy-style entry points over the equation language: ``einsum`` and ``dot``."""

from __future__ import annotations

import numpy as np

from tessera.errors import ShapeError
from tessera.expr.terms import Ref, Update, record
from tessera.tensor.block_tensor import BlockTensor, flat_weights


def einsum(subscripts: str, *tensors, out: BlockTensor | None = None, scale: float = 1.0) -> BlockTensor:
    """``einsum("abcd,ijcd->ijab", W, tau)``: a new (or the given) BlockTensor."""
    if "->" not in subscripts:
        raise ShapeError(f"einsum {subscripts!r}: give the output indices explicitly, as 'ab,bc->ac'")
    ins, target = subscripts.replace(" ", "").split("->")
    ins = ins.split(",")
    if len(ins) != len(tensors):
        raise ShapeError(f"einsum {subscripts!r}: {len(ins)} operands named, {len(tensors)} given")
    refs = [Ref(t, s) for t, s in zip(tensors, ins)]
    if out is None:
        spaces = {ch: sp for r in refs for ch, sp in zip(r.indices, r.tensor.spaces)}
        missing = set(target) - set(spaces)
        if missing:
            raise ShapeError(f"einsum {subscripts!r}: output index {''.join(sorted(missing))!r} in no operand")
        irrep = 0
        for t in tensors:
            irrep ^= t.irrep
        out = BlockTensor(tuple(spaces[ch] for ch in target), irrep, name="einsum")
    expr = refs[0] * scale
    for r in refs[1:]:
        expr = expr * r
    record(Update(Ref(out, target), expr, accumulate=True))
    return out


def dot(x: Ref, y: Ref) -> float:
    """Full contraction of two refs with the same index letters: sum of x*y."""
    if sorted(x.indices) != sorted(y.indices):
        raise ShapeError(f"dot needs the same indices on both sides, got {x.indices!r} and {y.indices!r}")
    perm = tuple(y.indices.index(ch) for ch in x.indices)
    xt, xb = x.tensor, x.tensor.blocks
    if xt.pieced:                      # no process holds its blocks whole
        if y.tensor.pieced and perm == tuple(range(len(perm))) and xt.dist.same_layout(y.tensor.dist):
            return xt.vdot(y.tensor)   # one layout: each process over the pieces it holds
        if not y.tensor.pieced:
            return dot(y, x)           # sum over y's blocks, x's fetched
        xb = xt.dist.fetch_many(xt.owned_keys())     # both in pieces: x's blocks at their homes
        for key in list(xb) if xt.aliases else ():
            xb.update((alias, xb[key].transpose(p)) for alias, p in xt.aliases.of(key))
    # two canonical tensors of one structure, same index order: each orbit of blocks
    # once, its canonical block weighted by the orbit's size (aliases are its transposes)
    orbits = bool(xt.aliases) and xt.aliases is y.tensor.aliases and perm == tuple(range(len(perm)))
    if (orbits or not (xt.aliases or y.tensor.aliases)) and perm == tuple(range(len(perm))) \
            and xt.dist is None and y.tensor.dist is None and xt.spaces == y.tensor.spaces \
            and xt.irrep == y.tensor.irrep:
        # one local structure: one pass over the two flat vectors, without BLAS (a BLAS
        # dot wakes its threads, per block or even once, for more than the arithmetic
        # costs on a busy machine) and without temporaries
        xv, yv = xt.flat(), y.tensor.flat()
        if orbits:
            return float(np.einsum("i,i,i->", xv, flat_weights(xt.spaces, xt.irrep, xt.aliases), yv))
        return float(np.einsum("i,i->", xv, yv))
    xkeys = [k for k in xb if k not in xt.aliases] if orbits else list(xb)
    total = 0.0
    yb = y.tensor.blocks
    ykeys = {key: tuple(key[perm.index(n)] for n in range(len(perm))) for key in xkeys}
    if y.tensor.dist is not None:      # blocks of y that another process stores
        yb = dict(yb)
        yb.update(y.tensor.dist.fetch_many([k for k in ykeys.values() if k not in yb]))
    for key in xkeys:
        other = yb.get(ykeys[key])
        if other is not None:
            weight = xt.orbit_size(key) if orbits else 1
            total += weight * float(np.vdot(xb[key], other.transpose(perm)))
    return float(xt.global_sum(total))
