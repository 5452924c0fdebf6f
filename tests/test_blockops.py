"""The local executors' cached block maps (``backends.sectors``) and the reuse of gathered
operands within one plan, against numpy.einsum on random block-sparse tensors with
irreps (D2h-like labels), sparse and full, canonical and full outputs.
"""

import numpy as np
import pytest

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends import blockops, context, sectors

BACKENDS = ["serial", "threads"]
T2_SYM = (ts.PermutationalSymmetry((1, 0, 3, 2)),)


def _spaces(seed):
    rng = np.random.default_rng(seed)
    o = IndexSpace.from_irreps("o", rng.integers(0, 8, 7), 2)
    v = IndexSpace.from_irreps("v", rng.integers(0, 8, 11), 3)
    return o, v, rng


def _close(got, ref):
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-block"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_maps_reused_across_iterations_equal_einsum(backend, flat, monkeypatch):
    """The same steps run on new numbers (as in every CCSD iteration) hit the cached maps
    and give what fresh maps give: numpy.einsum, for transposed outputs, sparse operands
    (gathered into zeroed matrices), a canonical output and a divided addition; on whole
    flat tensors (small blocks, ``sectors.small_blocks``) and block by block."""
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
    o, v, rng = _spaces(5)
    eo, ev = rng.random(o.dim) - 2.0, rng.random(v.dim) + 0.5
    from tessera.chem.integrals import denominator
    D = denominator((o, o, v, v), (eo, eo, ev, ev), (1, 1, -1, -1), "D")
    d = D.to_dense()
    hits = []
    for it in range(3):
        W = BlockTensor.random((o, v, v, v), 0, rng=rng, name="W")
        tau = BlockTensor.random((o, o, v, v), 0, rng=rng, name="tau", fill=0.6)
        t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1")
        X = BlockTensor((v, o, o, v), 0, name="X")
        R = BlockTensor((o, o, v, v), 0, name="R", symmetry=T2_SYM, canonical=True)
        Q = BlockTensor((o, o, v, v), 0, name="Q")
        with ts.Context(backend), ts.equations():
            X["akic"] = -0.5 * W["kdac"] * t1["id"]                      # output transposed (perm_c)
            R["ijab"] = X["akic"] * tau["jkbc"] + X["bkjc"] * tau["ikac"] + t1["ia"] * t1["jb"]
            Q["ijab"] = 2.0 * R["jiba"] / D["ijab"]
        w, t, s = W.to_dense(), tau.to_dense(), t1.to_dense()
        x = -0.5 * np.einsum("kdac,id->akic", w, s)
        r = np.einsum("akic,jkbc->ijab", x, t) + np.einsum("bkjc,ikac->ijab", x, t) + np.einsum("ia,jb->ijab", s, s)
        _close(X.to_dense(), x)
        _close(R.to_dense(), r)
        _close(Q.to_dense(), np.divide(2.0 * r.transpose(1, 0, 3, 2), d, out=np.zeros_like(r), where=d != 0))
        hits.append(sum(f.cache_info().hits for f in (sectors.gather_map, sectors.scatter_map, sectors.add_map))
                    + sectors.index_cache.hits)
    assert hits[2] > hits[1] > hits[0]


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-block"])
def test_gemm_split_by_equal_rows_equal_einsum(flat, monkeypatch):
    """Row tuples of 4, 4, 2, ... rows that do not divide evenly among three workers: the
    GEMMs are split by equal rows (every task one at least), the blocks added after them
    (``gemm_scatter_tasks``' second list; on the flat path products end to end); results
    equal numpy.einsum for a transposed and a canonical output, with scale."""
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
    monkeypatch.setattr(blockops, "_TASK_FLOPS", 1)
    split = []
    gemm_scatter_tasks = blockops.gemm_scatter_tasks
    monkeypatch.setattr(blockops, "gemm_scatter_tasks", lambda *args: split.append(gemm_scatter_tasks(*args))
                        or split[-1])
    o = IndexSpace.from_irreps("o", [0] * 5, 2)               # tiles 2, 2, 1
    v = IndexSpace.from_irreps("v", [0, 1] * 4, 3)            # two irreps, tiles of 3 and 1
    rng = np.random.default_rng(3)
    A = BlockTensor.random((o, o, v, v), 0, rng=rng, name="A")
    B = BlockTensor.random((v, v, v, v), 0, rng=rng, name="B")
    X = BlockTensor((v, o, o, v), 0, name="X")
    R = BlockTensor((o, o, v, v), 0, name="R", symmetry=T2_SYM, canonical=True)
    with ts.Context("threads", workers=3), ts.equations():
        X["bija"] = -0.5 * A["ijcd"] * B["cdab"]                  # output transposed (perm_c)
        R["ijab"] = A["ijcd"] * B["cdab"] + A["jidc"] * B["dcba"]
    a, b = A.to_dense(), B.to_dense()
    r = np.einsum("ijcd,cdab->ijab", a, b)
    _close(X.to_dense(), -0.5 * r.transpose(3, 0, 1, 2))
    _close(R.to_dense(), r + r.transpose(1, 0, 3, 2))
    assert flat or any(then for _, then in split)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gathered_operand_reused_only_while_unchanged(backend, monkeypatch):
    """Within one batch an operand gathered twice with the same layout is gathered once,
    unless a step in between wrote it (then the new values are used)."""
    o, v, rng = _spaces(9)
    A = BlockTensor.random((o, v), 0, rng=rng, name="A")
    X = BlockTensor.random((v, v), 0, rng=rng, name="X", fill=0.7)
    B = BlockTensor.random((v, v), 0, rng=rng, name="B")
    C, E, F = (BlockTensor((o, v), 0, name=n) for n in "CEF")
    a, x, b = A.to_dense(), X.to_dense(), B.to_dense()
    gathered = []
    for name in ("gather_tasks", "gather_flat_tasks"):        # block by block or flat (small blocks)
        monkeypatch.setattr(blockops, name, lambda ref, *args, f=getattr(blockops, name):
                            gathered.append(ref.tensor.name) or f(ref, *args))
    with ts.Context(backend) as ctx, ts.equations():
        C["ia"] = A["ic"] * X["ca"]
        E["ia"] = 3.0 * A["ic"] * X["ca"]          # X and A unchanged: their matrices are reused
        X["ca"] += B["ca"]                         # X changes: the next use gathers it again
        F["ia"] = A["ic"] * X["ca"]
    _close(C.to_dense(), a @ x)
    _close(E.to_dense(), 3.0 * a @ x)
    _close(F.to_dense(), a @ (x + b))
    assert sorted(gathered) == ["A", "X", "X"]
    assert not ctx._batch                          # nothing is held after the batch


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_gather_served_by_its_transpose_or_symmetric_twin(backend, monkeypatch):
    """A constant tensor's gathered matrices are reused for a gather that equals one of
    them transposed, or equals it through the tensor's declared symmetry (ovvv[kbca] =
    ovvv[kbac]): four contractions of a frozen ovvv-like tensor gather it twice, and
    every result equals numpy.einsum (random irreps, so several sectors per GEMM). Left
    operands are gathered here as in products of many columns (no reads from blocks)."""
    monkeypatch.setattr(context, "BLOCK_READ_COLUMNS", 0)
    o, v, rng = _spaces(13)
    w = BlockTensor.random((o, v, v, v), 0, rng=rng).to_dense()
    w = w + w.transpose(0, 1, 3, 2)                                  # (kc|ab) = (kc|ba)
    W = BlockTensor.from_dense(w, (o, v, v, v), 0, name="W", symmetry=(ts.PermutationalSymmetry((0, 1, 3, 2)),))
    W.freeze()
    U = BlockTensor.random((o, o, v, v), 0, rng=rng, name="U")
    t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1")
    P, F = BlockTensor((o, v), 0, name="P"), BlockTensor((v, v), 0, name="F")
    Q, S = BlockTensor((o, v, v, o), 0, name="Q"), BlockTensor((o, o, o, v), 0, name="S")
    gathered = []
    gather_tasks = blockops.gather_tasks
    monkeypatch.setattr(blockops, "gather_tasks", lambda ref, *args: gathered.append(ref.tensor.name)
                        or gather_tasks(ref, *args))
    with ts.Context(backend) as ctx, ts.equations():
        Q["iabj"] = W["iabc"] * t1["jc"]            # W rows iab, columns c
        P["ia"] = W["jcba"] * U["ijbc"]             # its transpose: rows a, columns jcb
        S["ijkb"] = W["kcdb"] * U["ijcd"]           # rows kb, columns cd
        F["ab"] = W["kbca"] * t1["kc"]              # rows ba, columns kc: the transpose of rows kb,
    u, s = U.to_dense(), t1.to_dense()             # columns ac, which the symmetry makes cd above
    _close(Q.to_dense(), np.einsum("iabc,jc->iabj", w, s))
    _close(P.to_dense(), np.einsum("jcba,ijbc->ia", w, u))
    _close(S.to_dense(), np.einsum("kcdb,ijcd->ijkb", w, u))
    _close(F.to_dense(), np.einsum("kbca,kc->ab", w, s))
    # W[iabc] and W[kcdb] are gathered and cached; P's and F's gathers are their twins
    assert gathered.count("W") == 2 and len(ctx._cache) == 2
    assert not ctx._block_read


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_left_operand_read_in_place_equal_einsum(backend, monkeypatch):
    """A frozen left operand whose summed axes are a leading or trailing run of its blocks
    is read from its blocks in place (``blockops.BlockMatrix``: no gather, nothing
    cached), split by rows over tasks and with blocks missing (sparse: zero rows), on the
    per-block and the flat output paths; results equal numpy.einsum. A non-run order
    (summed axes in the middle) is read from its blocks too, each block copied as the
    product reads it (``blockops.CopiedBlock``: nothing gathered or kept); a right operand
    is gathered as before."""
    monkeypatch.setattr(blockops, "_TASK_FLOPS", 1e3)
    o, v, rng = _spaces(29)
    W = BlockTensor.random((o, v, v, v), 0, rng=rng, name="W", fill=0.7).freeze()
    t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1")
    U = BlockTensor.random((o, o, v, v), 0, rng=rng, name="U")
    Q, F = BlockTensor((o, v, v, o), 0, name="Q"), BlockTensor((v, v), 0, name="F")
    X = BlockTensor.random((v, v), 0, rng=rng, name="X")
    P, S, Y = BlockTensor((o, v), 0, name="P"), BlockTensor((o, v), 0, name="S"), BlockTensor((v, v), 0, name="Y")
    gathered = []
    gather_tasks = blockops.gather_tasks
    monkeypatch.setattr(blockops, "gather_tasks", lambda ref, *args: gathered.append(ref.tensor.name)
                        or gather_tasks(ref, *args))
    for flat in (True, False):
        monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
        with ts.Context(backend) as ctx, ts.equations():
            Q["iabj"] = W["iabc"] * t1["jc"]            # trailing run c
            F["ab"] = 2.0 * W["kcab"] * t1["kc"]        # leading run kc
            P["ia"] = W["jcba"] * U["ijbc"]             # leading run jcb
            S["ib"] = W["iacb"] * X["ca"]               # summed axes in the middle: blocks copied
            Y["ab"] = t1["kc"] * W["kcab"]              # W on the right: gathered
        w, s, u, x = W.to_dense(), t1.to_dense(), U.to_dense(), X.to_dense()
        _close(Q.to_dense(), np.einsum("iabc,jc->iabj", w, s))
        _close(F.to_dense(), 2.0 * np.einsum("kcab,kc->ab", w, s))
        _close(P.to_dense(), np.einsum("jcba,ijbc->ia", w, u))
        _close(S.to_dense(), np.einsum("iacb,ca->ib", w, x))
        _close(Y.to_dense(), np.einsum("kc,kcab->ab", s, w))
        assert len(ctx._block_read) == 4
        assert any(isinstance(e[4], blockops.CopiedBlock) for m in ctx._block_read.values()
                   for mat in m[1].values() for e in mat.entries)
    assert gathered.count("W") == 2                     # one per context: Y
    with ts.Context(backend) as ctx:
        for _ in range(2):
            with ts.equations():
                Q["iabj"] = W["iabc"] * t1["jc"]
            _close(Q.to_dense(), np.einsum("iabc,jc->iabj", W.to_dense(), s))
            key = next(iter(W.blocks))
            W.store_block(key, W.blocks[key] + 1.0)    # a new version: read anew, the stale entry replaced
        assert len(ctx._block_read) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_gathered_in_one_layout_stored_once(backend, monkeypatch):
    """``Context.store_constants_gathered``: a constant gathered in one layout only keeps
    its blocks as views of the kept matrices (its own arrays freed, its values unchanged);
    one gathered in two layouts, one read in place, one on the flat path, and blocks no
    product reads keep their own arrays; the same equations run again equal numpy.einsum (random irreps, so
    several sectors per GEMM)."""
    import weakref
    o, v, rng = _spaces(31)
    W, V, L = (BlockTensor.random((o, v, v, v), 0, rng=rng, name=n, fill=0.7).freeze() for n in "WVL")
    M = BlockTensor.random((v, v), 0, rng=rng, name="M").freeze()
    t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1")
    U = BlockTensor.random((o, o, v, v), 0, rng=rng, name="U")
    w, vv, lv, m, s, u = (x.to_dense() for x in (W, V, L, M, t1, U))
    Y, S, Q, P, F = (BlockTensor((v, v), 0, name="Y"), BlockTensor((o, o, o, v), 0, name="S"),
                     BlockTensor((v, v), 0, name="Q"), BlockTensor((o, v, v, o), 0, name="P"),
                     BlockTensor((o, v), 0, name="F"))
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 0)        # per block, then M on the flat path
    monkeypatch.setattr(sectors, "_small", lambda spaces, *args: len(spaces) == 2 and spaces[0] is v)
    own = {n: {k: weakref.ref(b) for k, b in t.blocks.items()} for n, t in (("W", W), ("V", V), ("L", L))}

    def run():
        with ts.equations():
            Y["ab"] = t1["kc"] * W["kcab"]              # W on the right: gathered, its one layout
            S["ijkb"] = V["kcdb"] * U["ijcd"]           # V in two layouts
            Q["ab"] = t1["kc"] * V["kcab"]
            P["iabj"] = L["iabc"] * t1["jc"]            # L read in place
            F["ia"] = t1["ib"] * M["ba"]                # M: flat
        _close(Y.to_dense(), np.einsum("kc,kcab->ab", s, w))
        _close(S.to_dense(), np.einsum("kcdb,ijcd->ijkb", vv, u))
        _close(Q.to_dense(), np.einsum("kc,kcab->ab", s, vv))
        _close(P.to_dense(), np.einsum("iabc,jc->iabj", lv, s))
        _close(F.to_dense(), s @ m)
    with ts.Context(backend) as ctx:
        run()
        flat = M.flat()
        ctx.store_constants_gathered()
        (mats,) = [mats for key, mats in ctx._cache.items() if key[1] == W.uid]
        # the blocks of the sectors this product reads (t1's irrep) are views, their own
        # arrays freed; the others keep theirs
        shared = {k for k, b in W.blocks.items() if any(np.shares_memory(b, x) for x in mats.values())}
        assert shared and all((r() is None) == (k in shared) for k, r in own["W"].items())
        assert all(r() is not None for r in [*own["V"].values(), *own["L"].values()])    # two layouts, in place: kept
        assert all(np.shares_memory(b, flat) for b in M.blocks.values())
        np.testing.assert_array_equal(W.to_dense(), w)
        run()


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_added_in_another_order_kept_permuted_while_unchanged(backend, monkeypatch):
    """A frozen tensor added into outputs of other axis orders (CCSD's Z[ijab] += ovov[iajb])
    on the flat path is permuted once per (order, output) and kept (``Context._permuted``);
    the kept vector serves later batches, a changed tensor is permuted anew, and every
    result equals numpy's transpose (random irreps; a fresh and an accumulating output)."""
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30)
    o, v, rng = _spaces(17)
    V = BlockTensor.random((o, v, o, v), 0, rng=rng, name="V").freeze()
    X = BlockTensor.random((o, o, v, v), 0, rng=rng, name="X")
    Y = BlockTensor((v, o, o, v), 0, name="Y")
    x = X.to_dense()
    with ts.Context(backend) as ctx:
        for n in range(2):                        # the second batch uses the kept vectors
            with ts.equations():
                X["ijab"] += 0.5 * V["iajb"]
                Y["aijb"] = V["iajb"]
            vd = V.to_dense()
            x = x + 0.5 * vd.transpose(0, 2, 1, 3)
            _close(X.to_dense(), x)
            _close(Y.to_dense(), vd.transpose(1, 0, 2, 3))
            assert len(ctx._permuted_flats) == 2
            key = next(iter(V.blocks))
            V.store_block(key, V.blocks[key] + 1.0)    # a new version: permuted again next time


def test_threads_executor_runs_each_task_once_the_caller_helping():
    """``ThreadsExecutor.run``: every task runs once, on at most ``workers`` threads at a
    time, the calling thread one of them; after a task's error no task starts, and the
    error is raised once the running ones have ended (none runs on after ``run`` returns)."""
    import threading
    import time

    from tessera.backends.local import ThreadsExecutor

    ex = ThreadsExecutor(2)
    lock, ran, live, peak = threading.Lock(), [], [0], [0]

    def task(n, fail=False):
        def run():
            with lock:
                live[0] += 1
                peak[0] = max(peak[0], live[0])
            time.sleep(0.002)
            with lock:
                live[0] -= 1
                ran.append((n, threading.get_ident()))
            if fail:
                raise ValueError(f"task {n}")
        return run
    try:
        ex.run([task(n) for n in range(9)])
        assert sorted(n for n, _ in ran) == list(range(9)) and peak[0] <= 2
        assert threading.get_ident() in {t for _, t in ran}
        ran.clear()
        with pytest.raises(ValueError, match="task 0"):
            ex.run([task(0, fail=True)] + [task(n) for n in range(1, 60)])
        assert live[0] == 0 and 0 in {n for n, _ in ran} and len(ran) < 10      # the others stopped, and ended
    finally:
        ex.close()


def test_flat_storage_views_zeros_and_rebuild():
    """``BlockTensor.flat``: the stored blocks of a canonical tensor end to end, its alias
    blocks views of them, a missing block zeros; writing the vector writes the blocks; a
    block replaced afterwards makes a new vector; an empty tensor's vector is zeros whose
    block views appear when its blocks are read."""
    o, v, rng = _spaces(3)
    d = rng.standard_normal((o.dim, o.dim, v.dim, v.dim))
    d += d.transpose(1, 0, 3, 2)
    T = BlockTensor.from_dense(d, (o, o, v, v), 0, symmetry=T2_SYM, canonical=True)
    gone = T.stored_keys()[3]
    for key in [gone] + [a for a, _ in T.aliases.of(gone)]:
        del T.blocks[key]
    ref = BlockTensor.from_dense(d, (o, o, v, v), 0, symmetry=T2_SYM, canonical=True)
    ref.store_block(gone, np.zeros(ref.block_shape(gone)))
    vec = T.flat()
    assert vec.size == ref.stored_elements and T.flat() is vec
    _close(T.to_dense(), ref.to_dense())
    vec *= 2.0
    _close(T.to_dense(), 2.0 * ref.to_dense())
    T.store_block(gone, np.ones(T.block_shape(gone)))
    assert T.flat() is not vec
    _close(T.blocks[gone], np.ones(T.block_shape(gone)))
    E = BlockTensor((o, o, v, v), 0, name="E", symmetry=T2_SYM, canonical=True)
    E.flat()[:] = 1.0
    assert sorted(E.blocks) == sorted(E.allowed_keys())
    assert all((b == 1.0).all() for b in E.blocks.values())


def _row_elements(thing) -> int:
    """Elements of one row of an ``_even_parts`` item: a gather's (matrix, entry, block) or
    a scatter's (entry, fresh)."""
    if len(thing) == 3:
        return thing[2].size // thing[1][3][0]
    (_, rsl, csl, shape), _ = thing
    return (rsl.stop - rsl.start) * (csl.stop - csl.start) // shape[0]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_gathers_and_scatters_cut_into_even_parts_equal_einsum(workers, monkeypatch):
    """Gathers, and the scatters of products computed whole, are cut into a multiple of
    the workers of parts of equal elements (blocks split by rows of their first axis),
    and the contractions still equal numpy.einsum (random irreps, sparse operands,
    transposed gathers and products, an output made by the step and one added to)."""
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 0)
    monkeypatch.setattr(blockops, "_GATHER_ELEMENTS", 40)
    monkeypatch.setattr(blockops, "_FLAT_ELEMENTS", 40)
    cuts, even_parts = [], blockops._even_parts
    monkeypatch.setattr(blockops, "_even_parts", lambda items, w: cuts.append(even_parts(items, w)) or cuts[-1])
    o, v, rng = _spaces(21)
    A = BlockTensor.random((o, o, v, v), 0, rng=rng, name="A", fill=0.8)
    B = BlockTensor.random((v, o, v, o), 0, rng=rng, name="B")
    C = BlockTensor((o, v, o, v), 0, name="C")
    with ts.Context("threads", workers=workers), ts.equations():
        C["iajb"] = A["ikac"] * B["ckbj"]
        C["iajb"] += 2.0 * B["ckai"] * A["jkcb"]
    a, b = A.to_dense(), B.to_dense()
    _close(C.to_dense(), np.einsum("ikac,ckbj->iajb", a, b) + 2.0 * np.einsum("ckai,jkcb->iajb", b, a))
    # gathers were cut, and scatters too on several workers (one worker scatters as it multiplies)
    assert {len(parts[0][0][0]) for parts in cuts} == ({3} if workers == 1 else {2, 3})
    for parts in cuts:
        assert len(parts) % workers == 0
        sizes = [sum((r1 - r0) * _row_elements(thing) for thing, r0, r1 in p) for p in parts]
        widest = max(_row_elements(thing) for p in parts for thing, _, _ in p)
        assert max(sizes) - min(sizes) <= 2 * widest       # a part: the rows that start in its range


@pytest.mark.parametrize("backend", BACKENDS)
def test_outer_products_made_block_by_block_equal_einsum(backend, monkeypatch):
    """A product with no contracted index (t1 x t1 into tau, taupp) runs no GEMM: each
    output block is made from its two slices and added where it goes (``_outer_one``);
    equal numpy.einsum with scale, a transposed output, a canonical output, an output
    that stores nothing yet and one added to, sparse factors, random irreps."""
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 0)
    gemms = []
    for name in ("_gemm_one", "_gemm_scatter_one"):
        fn = getattr(blockops, name)
        monkeypatch.setattr(blockops, name, lambda *a, _fn=fn: gemms.append(a) or _fn(*a))
    o, v, rng = _spaces(11)
    t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1", fill=0.7)
    t2 = BlockTensor.random((o, o, v, v), 0, rng=rng, name="t2")
    tau = BlockTensor((o, o, v, v), 0, name="tau", symmetry=T2_SYM, canonical=True)
    taupp = BlockTensor((o, v, o, v), 0, name="taupp")
    fresh = BlockTensor((o, v, o, v), 0, name="fresh")
    with ts.Context(backend), ts.equations():
        tau["ijab"] = t2["ijab"] + t2["jiba"] + 0.5 * t1["ia"] * t1["jb"]
        taupp["kcjb"] = 2.0 * t2["jkbc"] - 2.0 * t1["kb"] * t1["jc"]
        fresh["kcjb"] = -t1["kb"] * t1["jc"]
    s, t = t1.to_dense(), t2.to_dense()
    _close(tau.to_dense(), t + t.transpose(1, 0, 3, 2) + 0.5 * np.einsum("ia,jb->ijab", s, s))
    _close(taupp.to_dense(), 2.0 * np.einsum("jkbc->kcjb", t) - 2.0 * np.einsum("kb,jc->kcjb", s, s))
    _close(fresh.to_dense(), -np.einsum("kb,jc->kcjb", s, s))
    assert gemms == []


def test_freed_working_memory_reused_until_given_back():
    """``heap.keep_freed_memory``: working arrays freed during a phase (here 96 MB of
    arrays below the mmap threshold, more than the old 64 MiB trim threshold) are reused
    without new page faults; ``give_back_freed_memory`` hands them back, and the next
    arrays fault their pages in again."""
    import resource

    from tessera.backends.heap import give_back_freed_memory, keep_freed_memory
    if not keep_freed_memory():
        pytest.skip("the C library has no mallopt")

    def faults_touching_arrays():
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        arrays = [np.empty(3 << 20) for _ in range(4)]       # 4 x 24 MiB
        for a in arrays:
            a.fill(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0

    give_back_freed_memory()
    first = faults_touching_arrays()
    reused = faults_touching_arrays()
    give_back_freed_memory()
    again = faults_touching_arrays()
    assert first > 0 and 4 * reused < first and 2 * again > first


def test_numpy_arrays_on_base_pages_once_memory_is_kept():
    """``heap._no_huge_pages`` (called by ``keep_freed_memory``) turns off numpy's request
    for transparent huge pages (its ``madvise(MADV_HUGEPAGE)`` for arrays of 4 MiB or
    more): turned on, then off by it, the switch reports it was off."""
    import importlib
    from tessera.backends import heap
    switch = None
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            switch = importlib.import_module(module)._set_madvise_hugepage
            break
        except (ImportError, AttributeError):
            continue
    if switch is None:
        pytest.skip("no huge-page switch in this numpy")
    switch(True)                       # as numpy starts where the kernel offers huge pages
    heap._no_huge_pages()
    assert switch(False) is False


@pytest.mark.parametrize("backend", BACKENDS)
def test_scale_put_on_the_smallest_matrix_equal_einsum(backend, monkeypatch):
    """A scaled product is scaled on the smallest of A, B and A @ B (``blockops._scaled``):
    B (a t1-like right operand), A (a t1-like left one), the product (a contraction over
    many indices), and A read in place (never copied: B or the product scaled); on the
    flat and per-block output paths, over row tasks, adding into a filled target; each
    equals numpy.einsum."""
    monkeypatch.setattr(blockops, "_TASK_FLOPS", 1e3)
    o, v, rng = _spaces(41)
    G = BlockTensor.random((o, v, o, o), 0, rng=rng, name="G")
    W = BlockTensor.random((o, v, v, v), 0, rng=rng, name="W", fill=0.7).freeze()
    T = BlockTensor.random((o, o, v, v), 0, rng=rng, name="T")
    t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1")
    picked = []
    scaled = blockops._scaled
    monkeypatch.setattr(blockops, "_scaled", lambda a, b, s: picked.append(
        (lambda r: "B" if r[1] is not b else "A" if r[0] is not a else "C" if r[2] != 1.0 else "-")(scaled(a, b, s)))
        or scaled(a, b, s))
    for flat in (True, False):
        monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
        picked.clear()
        Z = BlockTensor.random((o, o, v, v), 0, rng=rng, name="Z")
        z0 = Z.to_dense()
        A, F, Q = BlockTensor((v, o, v, v), 0, name="A"), BlockTensor((o, o), 0, name="F"), \
            BlockTensor((o, v, v, o), 0, name="Q")
        with ts.Context(backend), ts.equations():
            Z["ijab"] += -1.0 * G["iajk"] * t1["kb"]         # B smallest: t1
            A["bkca"] = 2.0 * t1["jb"] * T["jkca"]           # A smallest: t1 on the left
            F["ij"] = -0.5 * T["ikab"] * T["jkab"]           # product smallest: o x o
            Q["iabj"] = -2.0 * W["iabc"] * t1["jc"]          # W read in place: t1 scaled
        g, t, s, w = G.to_dense(), T.to_dense(), t1.to_dense(), W.to_dense()
        _close(Z.to_dense(), z0 - np.einsum("iajk,kb->ijab", g, s))
        _close(A.to_dense(), 2.0 * np.einsum("jb,jkca->bkca", s, t))
        _close(F.to_dense(), -0.5 * np.einsum("ikab,jkab->ij", t, t))
        _close(Q.to_dense(), -2.0 * np.einsum("iabc,jc->iabj", w, s))
        assert {"B", "A", "C"} <= set(picked), picked


def test_add_product_accumulates_in_place_for_every_operand_order():
    """``blockops.add_product``: out += a @ b for a and b in C order, Fortran order and
    strided views, into a C-ordered row slice of a larger matrix (written in place, the
    rows around it untouched) and into a transposed view (numpy's path); equal to numpy."""
    rng = np.random.default_rng(3)
    forms = {"C": lambda x: x, "F": np.asfortranarray, "view": lambda x: np.repeat(x, 2, axis=1)[:, ::2]}
    for fa, make_a in forms.items():
        for fb, make_b in forms.items():
            a, b = make_a(rng.random((30, 7))), make_b(rng.random((7, 11)))
            big = rng.random((40, 11))
            want = big.copy()
            want[5:35] += a @ b
            blockops.add_product(big[5:35], a, b)
            _close(big, want)
            out = rng.random((11, 30)).T            # not C-ordered
            want = out + a @ b
            blockops.add_product(out, a, b)
            _close(out, want)
