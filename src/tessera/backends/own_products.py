"""The block products of a stationary contraction that one ``mpi-collective`` rank takes
part in, listed from the blocks it holds: O(its products), not O(all products).

With one operand stationary (``backends.stationary``) a product runs on the home of its
block of that operand (of its output block, mode c). A rank runs the products whose
stationary block it is home of, sends the A and B blocks (or pieces) it holds to the
products that read them elsewhere, and receives the partial output blocks of the outputs
it holds (a block or a piece) from every rank with products of them: the products of
``rank_choice.product_codes``. They are listed in step order (``contraction_tasks``: task
by task, products by inner tuple), so the exchange items a rank makes of them are the
all-products items restricted to the ones it sends or receives, in the same order, and
``exchange`` pairs sends and receives as with the whole list.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tessera.backends.rank_choice import product_codes
from tessera.backends.stationary import MODES
from tessera.plan.blocktasks import invert_key


class OwnTask(NamedTuple):
    """The products of one output block that a rank takes part in (every product of an
    output it holds): ``products`` = ((A key, B key, k, rank that runs it), ...)."""

    out: tuple
    m: int
    n: int
    out_shape: tuple
    products: tuple


def own_tasks(sig, perms: tuple, ops, held: tuple, mode: str) -> list:
    """[OwnTask] of the products of ``product_codes(sig, perms, ops, held)`` with operand
    ``mode`` ("a", "b" or "c") stationary, in step order; ``ops``: ``stationary.Operands``
    (the owners give each product's rank, asked once per distinct stationary block)."""
    pa, pb, perm_c = perms
    aliases = ops.tensors[2].aliases
    x = MODES.index(mode)
    owner, homes = ops.owners[x], {}
    out = []
    for n, codes in enumerate(product_codes(sig, perms, ops, held)):
        _, rows, inner, cols = sig[n]
        nq, nc = len(inner.tuples), len(cols.tuples)
        rq, c = np.divmod(codes, nc)
        r, q = np.divmod(rq, nq)
        order = np.lexsort((q, c, r))           # task (r, c) by task, then inner tuple
        r, c, q = (v[order].tolist() for v in (r, c, q))
        start = 0
        while start < len(r):
            end = start
            while end < len(r) and r[end] == r[start] and c[end] == c[start]:
                end += 1
            rk, ck = rows.tuples[r[start]], cols.tuples[c[start]]
            okey = tuple((rk + ck)[p] for p in perm_c)
            if not (aliases and okey in aliases):
                prods = []
                for qi in q[start:end]:
                    kk = inner.tuples[qi]
                    akey, bkey = invert_key(rk + kk, pa), invert_key(kk + ck, pb)
                    home = (akey, bkey, okey)[x]
                    if home not in homes:
                        homes[home] = owner(home)
                    prods.append((akey, bkey, inner.sizes[qi], homes[home]))
                out.append(OwnTask(okey, rows.sizes[r[start]], cols.sizes[c[start]],
                                   rows.shapes[r[start]] + cols.shapes[c[start]], tuple(prods)))
            start = end
    return out
