"""Block-sparse tensor operations against numpy.einsum on random tensors.

Random tilings, random irreps (D2h-like labels 0..7 and smaller groups), random tensor
irreps; every contraction pattern the CCSD and (T) equations use, ranks 2 to 6, both
executors. Reference: numpy.einsum on the dense arrays (symmetry-forbidden parts zero).
"""

import threading
import zlib

import numpy as np
import pytest

import tessera as ts
from types import SimpleNamespace

from tessera import BlockTensor, IndexSpace
from tessera.backends.context import PlanningContext
from tessera.errors import InputError, ShapeError, SymmetryError

BACKENDS = ["serial", "threads"]


def spaces(seed, nirrep=4, tile=3):
    rng = np.random.default_rng(seed)
    o = IndexSpace.from_irreps("o", rng.integers(0, nirrep, 6), tile)
    v = IndexSpace.from_irreps("v", rng.integers(0, nirrep, 9), tile + 1)
    return o, v, rng


def rand(letters, o, v, rng, irrep=0):
    sp = tuple(o if ch in "ijklmn" else v for ch in letters)
    return BlockTensor.random(sp, irrep, rng=rng, name=letters)


def check(expr, outs, tensors, result):
    ref = np.einsum(expr, *[t.to_dense() for t in tensors])
    np.testing.assert_allclose(result.to_dense(), ref, rtol=0, atol=1e-12 * max(1.0, np.abs(ref).max()))


# contraction patterns of the CCSD equations (PySCF rccsd layout) and of the (T) kernel
PATTERNS = [
    "kcld,ilcd->ki", "kcld,klad->ac", "kcld,ld->kc", "lcki,lc->ki", "kdac,kd->ac",
    "kilj->klij", "lcki,jc->klij", "kcld,ijcd->klij", "kcad,id->akic", "ldkc,ilda->akic",
    "lckd,ilad->akic", "ac,ic->ia", "ki,ka->ia", "kc,kica->ia", "kdac,ikcd->ia", "lcki,klac->ia",
    "iajb->ijab", "klij,klab->ijab", "acbd,ijcd->ijab", "kdac,ijcd->kaij", "kaij,kb->ijab",
    "iacb,jc->ijab", "ac,ijcb->ijab", "akic,kjcb->ijab", "bkci,kjac->ijab", "ia,jb->ijab",
    "iabf,kjcf->ijkabc", "iajm,mkbc->ijkabc", "ijkabc->ijkbca", "ia,jbkc->ijkabc",
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("expr", PATTERNS)
def test_patterns(backend, expr):
    o, v, rng = spaces(zlib.crc32(expr.encode()) % 1000)
    ins, out = expr.split("->")
    irreps = [int(rng.integers(0, 4)) for _ in ins.split(",")]
    tensors = [rand(s, o, v, rng, g) for s, g in zip(ins.split(","), irreps)]
    with ts.Context(backend):
        result = ts.einsum(expr, *tensors)
    g = 0
    for x in irreps:
        g ^= x
    assert result.irrep == g
    check(expr, out, tensors, result)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("one_block_gathers", [False, True])
def test_random_ranks_and_tilings(backend, seed, one_block_gathers, monkeypatch):
    """Random contractions of rank 2..6 operands over random tilings and irreps (D2h labels);
    also with every gather task copying a single block (many tasks fill one matrix)."""
    if one_block_gathers:
        from tessera.backends import blockops
        monkeypatch.setattr(blockops, "_GATHER_ELEMENTS", 1)
    rng = np.random.default_rng(100 + seed)
    nirrep = [1, 2, 4, 8][seed]
    sp = [IndexSpace.from_irreps(f"s{n}", rng.integers(0, nirrep, rng.integers(3, 7)),
                                 int(rng.integers(1, 4))) for n in range(6)]
    letters = "pqrstu"
    for _ in range(6):
        n_a, n_b = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        pool = list(letters)
        rng.shuffle(pool)
        shared = pool[:int(rng.integers(1, 3))]
        a_ext = pool[len(shared):len(shared) + n_a]
        b_ext = pool[len(shared) + n_a:len(shared) + n_a + n_b]
        a = "".join(rng.permutation(shared + a_ext))
        b = "".join(rng.permutation(shared + b_ext))
        out = "".join(rng.permutation(a_ext + b_ext))
        A = BlockTensor.random(tuple(sp[letters.index(c)] for c in a), int(rng.integers(0, nirrep)), rng=rng)
        B = BlockTensor.random(tuple(sp[letters.index(c)] for c in b), int(rng.integers(0, nirrep)), rng=rng,
                               fill=0.7)
        with ts.Context(backend):
            C = ts.einsum(f"{a},{b}->{out}", A, B, scale=-0.5)
        ref = -0.5 * np.einsum(f"{a},{b}->{out}", A.to_dense(), B.to_dense())
        np.testing.assert_allclose(C.to_dense(), ref, rtol=0, atol=1e-12 * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_equation_batch_sums_permutations_division(backend):
    o, v, rng = spaces(7, nirrep=8, tile=2)
    W, tau, t1 = rand("abcd", o, v, rng), rand("ijab", o, v, rng), rand("ia", o, v, rng)
    eo, ev = rng.random(o.dim) - 2.0, rng.random(v.dim) + 0.5
    from tessera.chem.integrals import denominator
    D = denominator((o, o, v, v), (eo, eo, ev, ev), (1, 1, -1, -1))
    R = BlockTensor((o, o, v, v), 0, name="R")
    Z = BlockTensor((o, o, v, v), 0, name="Z")
    with ts.Context(backend), ts.equations():
        Z["ijab"] = 0.5 * W["acbd"] * tau["ijcd"] - tau["jiba"] + 2.0 * t1["ia"] * t1["jb"]
        R["ijab"] += Z["ijab"] + Z["jiba"]
        R["ijab"] = R["ijab"] / D["ijab"]          # aliased: read and written in one update
    d = W.to_dense(), tau.to_dense(), t1.to_dense()
    z = 0.5 * np.einsum("acbd,ijcd->ijab", d[0], d[1]) - d[1].transpose(1, 0, 3, 2) \
        + 2 * np.einsum("ia,jb->ijab", d[2], d[2])
    dd = eo[:, None, None, None] + eo[None, :, None, None] - ev[None, None, :, None] - ev[None, None, None, :]
    ref = (z + z.transpose(1, 0, 3, 2)) / dd
    np.testing.assert_allclose(R.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_allclose(ts.dot(R["ijab"], tau["jiba"]), np.einsum("ijab,jiba", ref, d[1]), rtol=1e-12)
    assert np.isclose(R.norm(), np.linalg.norm(ref), rtol=1e-12)


def test_three_factor_term_and_hadamard():
    o, v, rng = spaces(11)
    f, t1, ovvv, tau = rand("kc", o, v, rng), rand("ia", o, v, rng), rand("kdac", o, v, rng), rand("ijcd", o, v, rng)
    X = ts.einsum("kc,ka,ic->ia", f, t1, t1)
    check("kc,ka,ic->ia", "ia", [f, t1, t1], X)
    Y = ts.einsum("kdac,kb,ijcd->ijab", ovvv, t1, tau)
    check("kdac,kb,ijcd->ijab", "ijab", [ovvv, t1, tau], Y)
    H = ts.einsum("ijab,ijab->ijab", tau, tau)
    check("ijab,ijab->ijab", "ijab", [tau, tau], H)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_allowed_elements_counts_every_allowed_block(seed):
    """allowed_elements (an XOR convolution of the elements per irrep) equals the elements
    of the allowed blocks listed one by one, for 0 to 5 axes, every irrep, random tilings."""
    from tessera.tensor.block_tensor import allowed_elements, allowed_keys
    rng = np.random.default_rng(seed)
    for ndim in range(6):
        sp = tuple(IndexSpace.from_irreps(f"s{n}", rng.integers(0, 8, rng.integers(1, 12)), int(rng.integers(1, 4)))
                   for n in range(ndim))
        for irrep in range(8):
            listed = sum(int(np.prod([s.tiles[t].size for s, t in zip(sp, k)])) for k in allowed_keys(sp, irrep))
            assert allowed_elements(sp, irrep) == listed


@pytest.mark.parametrize("backend", BACKENDS)
def test_spaces_of_one_tiling_share_cached_structure(backend):
    """Spaces compare by tiling (kind, name, tiles), not by orbital order: a plan made on
    one space pair (the memory estimate's, from the initial guess) is the cached plan of
    another of the same tiling with other orbitals (the run's), and contractions on the
    second still equal numpy.einsum over its own orbitals. A pickled space (another
    process) equals its original; another name, tiling or a pair space does not."""
    import pickle
    from tessera.plan.layout import matrix_layout
    from tessera.tensor.pairs import pair_space
    o1 = IndexSpace.from_irreps("o", [0, 1, 0, 1, 2, 0], 2)
    o2 = IndexSpace.from_irreps("o", [1, 0, 0, 1, 0, 2], 2)
    v1 = IndexSpace.from_irreps("v", [3, 1, 2, 0, 1, 3, 3], 2)
    v2 = IndexSpace.from_irreps("v", [1, 3, 3, 0, 2, 3, 1], 2)
    assert (o1, v1) == (o2, v2) and hash((o1, v1)) == hash((o2, v2))
    assert not np.array_equal(o1.orbitals, o2.orbitals) and not np.array_equal(v1.orbitals, v2.orbitals)
    assert matrix_layout((o1, v1), 1) is matrix_layout((o2, v2), 1)
    assert pickle.loads(pickle.dumps(o1)) == o1 and pair_space(o1) == pair_space(o2) != o1
    assert o1 != IndexSpace("p", o1.tiles) and o1 != IndexSpace.from_irreps("o", [0, 1, 0, 1, 2, 0], 1)
    rng = np.random.default_rng(4)
    for o, v in ((o1, v1), (o2, v2)):
        a, b = rand("ijab", o, v, rng), rand("kjcb", o, v, rng)
        with ts.Context(backend):
            c = ts.einsum("ijab,kjcb->iakc", a, b)
        check("ijab,kjcb->iakc", "iakc", [a, b], c)


def test_symmetry_blocks_only():
    o, v, rng = spaces(3, nirrep=8, tile=1)
    t = rand("ijab", o, v, rng, irrep=5)
    assert all(t.is_allowed(k) for k in t.blocks)
    assert t.stored_elements < t.dense_elements
    dense = t.to_dense()
    irr = [s.irreps[np.argsort(s.orbitals)] for s in t.spaces]
    forbidden = (irr[0][:, None, None, None] ^ irr[1][None, :, None, None]
                 ^ irr[2][None, None, :, None] ^ irr[3][None, None, None, :]) != 5
    assert not dense[forbidden].any()
    back = BlockTensor.from_dense(dense, t.spaces, 5)
    np.testing.assert_array_equal(back.to_dense(), dense)
    with pytest.raises(SymmetryError):
        bad = next(k for k in __import__("itertools").product(*(range(len(s)) for s in t.spaces))
                   if not t.is_allowed(k))
        t.set_block(bad, np.zeros(t.block_shape(bad)))


def test_bad_use_errors():
    o, v, rng = spaces(5)
    A = rand("ia", o, v, rng)
    with pytest.raises(ShapeError):
        A["ijk"]
    with pytest.raises(ShapeError):
        ts.einsum("ia,ia->ij", A, A)             # output index in no factor
    with pytest.raises(ShapeError):
        ts.einsum("ia,ja->ia", A, A)             # j summed in one factor only
    with pytest.raises(ShapeError):
        ts.einsum("ia,ai->ia", A, A)             # i used for two spaces
    with pytest.raises(InputError):
        IndexSpace.from_irreps("o", [0, 1], 0)
    with pytest.raises(InputError):
        ts.Context("gpu-magic")


def _pair_symmetric(o, v, rng, irrep, letters="ijab", perm=(1, 0, 3, 2), canonical=False):
    """A random tensor declared and made symmetric: X = X.transpose(perm)."""
    x = rand(letters, o, v, rng, irrep).to_dense()
    d = x + x.transpose(perm)
    sym = (ts.PermutationalSymmetry(perm),)
    sp = tuple(o if ch in "ijklmn" else v for ch in letters)
    return BlockTensor.from_dense(d, sp, irrep, name=letters, symmetry=sym, canonical=canonical), d


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-block"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_symmetric_result_on_packed_pairs(backend, seed, flat, monkeypatch):
    from tessera.backends import sectors
    from tessera.tensor.pairs import pair_space
    """A contraction into a pair-symmetric target whose factors' declared symmetries make
    the term symmetric runs on the pairs i <= j of one factor (pack, GEMM on the pair
    space, one step that adds the pairs and their mirror images to the target, stored
    whole or canonical, on whole flat tensors or block by block) and equals
    numpy.einsum; one without declared symmetry runs in full and agrees too."""
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
    o, v, rng = spaces(100 + seed, nirrep=[1, 2, 4, 8][seed], tile=2 + seed % 2)
    g = int(rng.integers(0, 2)) if seed else 0
    sym = (ts.PermutationalSymmetry((1, 0, 3, 2)),)
    with ts.Context(backend):
        tau, tau_d = _pair_symmetric(o, v, rng, g, canonical=bool(seed % 2))     # packed from its canonical blocks too
        W, W_d = _pair_symmetric(o, v, rng, 0, "acbd", (2, 3, 0, 1))          # (ac|bd) = (bd|ac)
        Woo, Woo_d = _pair_symmetric(o, v, rng, 0, "ijkl", (1, 0, 3, 2))
        plain = BlockTensor.from_dense(W_d, W.spaces, 0, name="plain")      # same values, undeclared
        R = BlockTensor((o, o, v, v), g, name="R", symmetry=sym, canonical=seed in (1, 2))
        S = BlockTensor((o, o, v, v), g, name="S", symmetry=sym)
        with ts.equations():
            R["ijab"] = W["acbd"] * tau["ijcd"] - 0.5 * Woo["ijkl"] * tau["klab"]
            S["ijab"] = plain["acbd"] * tau["ijcd"]
        ref = np.einsum("acbd,ijcd->ijab", W_d, tau_d)
        np.testing.assert_allclose(S.to_dense(), ref, atol=1e-12 * np.abs(ref).max())
        ref = ref - 0.5 * np.einsum("ijkl,klab->ijab", Woo_d, tau_d)
        np.testing.assert_allclose(R.to_dense(), ref, atol=1e-12 * np.abs(ref).max())
    ctx = PlanningContext()
    with ctx, ts.equations():
        R["ijab"] = W["acbd"] * tau["ijcd"]
        S["ijab"] = plain["acbd"] * tau["ijcd"]
    (plan,) = ctx.plans
    kinds = [(st.kind, st.pairs) for st in plan.steps if st.label.startswith("R")]
    assert kinds == [("zero", None), ("add", "pack"), ("contract", None), ("add", "unpack")]
    half = sum(st.flops for st in plan.steps if st.label.startswith("R") and st.kind == "contract")
    full = sum(st.flops for st in plan.steps if st.label.startswith("S") and st.kind == "contract")
    count = lambda sp: np.bincount(sp.irreps, minlength=8)  # noqa: E731
    prod = lambda x, y: np.array([sum(x[h] * y[h ^ k] for h in range(8)) for k in range(8)])  # noqa: E731
    no, nv, npair = count(o), count(v), count(pair_space(o))
    vv = prod(nv, nv)
    assert npair.sum() == o.dim * (o.dim + 1) // 2
    assert full == int(np.sum(2 * prod(no, no)[[x ^ g for x in range(8)]] * vv * vv))   # rows ij of irrep g^(cd)
    assert half == int(np.sum(2 * npair[[x ^ g for x in range(8)]] * vv * vv))


def test_pair_space_and_round_trip():
    """pack, unpack_half, then the half plus its transpose restores a pair-symmetric tensor."""
    from tessera.plan.blocktasks import pair_block
    from tessera.tensor.pairs import pack_block, pair_space
    o, v, rng = spaces(9, tile=2)
    P = pair_space(o)
    assert P.dim == o.dim * (o.dim + 1) // 2 and pair_space(o) is P
    assert all(P.tiles[n].irrep == o.tiles[s].irrep ^ o.tiles[t].irrep for n, (s, t) in enumerate(P.tile_pairs))
    tau, d = _pair_symmetric(o, v, rng, 0)
    step = SimpleNamespace(pairs="unpack_half", out=SimpleNamespace(tensor=tau))
    half = {}
    for key in tau.allowed_keys():
        if key[0] <= key[1]:
            half[key] = pair_block(step, key, pack_block(tau.blocks[key], key[0] == key[1]))
    for key in tau.allowed_keys():
        mirror = half.get((key[1], key[0], key[3], key[2]))
        got = half.get(key, 0) + (0 if mirror is None else mirror.transpose(1, 0, 3, 2))
        np.testing.assert_array_equal(got, tau.blocks[key])


VVVV_SYMMETRY = tuple(ts.PermutationalSymmetry(p) for p in ((1, 0, 2, 3), (0, 1, 3, 2), (2, 3, 0, 1)))


def _eightfold(v, rng):
    """A random dense (ab|cd) with the 8-fold symmetry of real two-electron integrals."""
    x = rand("abcd", None, v, rng).to_dense()
    for perm in ((1, 0, 2, 3), (0, 1, 3, 2), (2, 3, 0, 1)):
        x = x + x.transpose(perm)
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-block"])
def test_ladder_in_plus_minus_form(backend, seed, flat, monkeypatch):
    """The ladder R[ijab] += s W[acbd] tau[ijcd] with W frozen runs on the occupied pairs
    i <= j and in the symmetric/antisymmetric form over the virtual pairs (two GEMMs with
    V+- = W[acbd] +- W[adbc] on c <= d, a <= b: tensor.pairs.plus_minus) and equals
    numpy.einsum, its pack and unpack steps on whole flat tensors (``sectors.pair_index``)
    or block by block; with the 8-fold symmetry V+- are stored as canonical halves, with only
    (ac|bd) = (bd|ac) in full. Flops: 2 x 2 sum_g pairs_v(g)^2 pairs_o(g ^ irrep(tau))."""
    from tessera.backends import sectors
    from tessera.plan.symmetric import distributed_plans
    from tessera.tensor.pairs import pair_space, plus_minus
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
    o, v, rng = spaces(300 + seed, nirrep=[1, 2, 4, 8][seed], tile=2 + seed % 2)
    g = int(rng.integers(0, [1, 2, 4, 8][seed]))
    sym = (ts.PermutationalSymmetry((1, 0, 3, 2)),)
    eightfold = seed % 2 == 0
    if eightfold:
        W_d = _eightfold(v, rng)
        W = BlockTensor.from_dense(W_d, (v,) * 4, 0, name="vvvv", symmetry=VVVV_SYMMETRY, canonical=True)
    else:
        W, W_d = _pair_symmetric(o, v, rng, 0, "acbd", (2, 3, 0, 1))
    W.freeze()
    with ts.Context(backend) as run_ctx:
        tau, tau_d = _pair_symmetric(o, v, rng, g, canonical=True)
        R = BlockTensor((o, o, v, v), g, name="R", symmetry=sym, canonical=True)
        with ts.equations():
            R["ijab"] = 0.7 * W["acbd"] * tau["ijcd"]
        ref = 0.7 * np.einsum("acbd,ijcd->ijab", W_d, tau_d)
        np.testing.assert_allclose(R.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    ctx = PlanningContext()
    with ctx, ts.equations():
        R["ijab"] = 0.7 * W["acbd"] * tau["ijcd"]
    (plan,) = ctx.plans
    assert [st.pairs for st in plan.steps if st.pairs] == [
        "pack", "plus_pack", "plus_unpack", "minus_pack", "minus_unpack", "unpack"]
    ctx = PlanningContext()
    with ctx, distributed_plans(), ts.equations():      # planned as a distributed run runs it
        R["ijab"] = 0.7 * W["acbd"] * tau["ijcd"]
    # (a distributed target takes a half H and H plus its mirror image: two adds, which
    # the cost model counts; it had planned the local run's one unpack step)
    steps = ctx.plans[0].steps
    assert [st.pairs for st in steps if st.pairs] == ["pack", "unpack_half"]
    assert [(st.kind, st.inputs[0].tensor.name, st.out.tensor is R) for st in steps[-2:]] == [("add", "half", True)] * 2
    count = lambda sp: np.bincount(sp.irreps, minlength=8)  # noqa: E731
    npo, npv = count(pair_space(o)), count(pair_space(v))
    assert plan.flops - sum(st.flops for st in plan.steps if st.kind != "contract") == \
        4 * int(np.sum(npv**2 * npo[[h ^ g for h in range(8)]]))
    vp, vm = plus_minus(W, (0, 2, 1, 3), eightfold)
    assert bool(vp.aliases) == eightfold and vp.to_dense().shape == (npv.sum(),) * 2
    G = W_d.transpose(0, 2, 1, 3)                   # G[abcd] = W[acbd]
    ab = _pair_orbitals(v)
    for got, sign in ((vp, 1.0), (vm, -1.0)):       # V+-[ab, cd] = G[abcd] +- G[abdc], pairs a <= b, c <= d
        a, b = ab[:, 0][:, None], ab[:, 1][:, None]
        ref = G[a, b, a.T, b.T] + sign * G[a, b, b.T, a.T]
        np.testing.assert_allclose(got.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(W_d).max())
    if eightfold:       # canonical halves: V[AB, CD] = V[CD, AB], diagonal blocks as triangles
        np.testing.assert_array_equal(vp.to_dense(), vp.to_dense().T)
        sizes = [n * (n + 1) // 2 if k[0] == k[1] else n * vp.spaces[1].tiles[k[1]].size
                 for k in vp.stored_keys() if k in vp.blocks for n in [vp.spaces[0].tiles[k[0]].size]]
        assert vp.stored_elements == sum(sizes) < 0.5 * vp.dense_elements + npv.sum()
        # where the run gathered V+- into the squares of its one product (V+- its right
        # operand), their off-diagonal blocks are views of those (their own arrays freed),
        # the diagonal ones stay triangles; read from their blocks, all stay
        for t in (vp, vm):
            squares = [m for key, mats in run_ctx._cache.items() if key[1] == t.uid for m in mats.values()]
            held = dict(dict.items(t.blocks))
            assert all(any(np.shares_memory(b, m) for m in squares) == bool(squares)
                       for k, b in held.items() if k[0] != k[1])
            assert all(b.ndim == 1 and b.flags.owndata for k, b in held.items() if k[0] == k[1])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(2))
def test_one_plan_packs_an_unchanged_amplitude_once(backend, seed):
    """Terms of one plan that pack the same tensor (CCSD's tau, for Woooo and the ladder)
    read one pack of it and its +- halves; after an update writes the tensor, the next
    term packs it anew. Every result equals numpy.einsum."""
    o, v, rng = spaces(700 + seed, nirrep=[1, 2][seed], tile=2 + seed)
    sym = (ts.PermutationalSymmetry((1, 0, 3, 2)),)
    W_d = _eightfold(v, rng)
    W = BlockTensor.from_dense(W_d, (v,) * 4, 0, name="vvvv", symmetry=VVVV_SYMMETRY, canonical=True).freeze()
    tau, tau_d = _pair_symmetric(o, v, rng, 0, canonical=True)
    R, S, Q = (BlockTensor((o, o, v, v), 0, name=n, symmetry=sym, canonical=True) for n in "RSQ")

    def updates():
        with ts.equations():
            R["ijab"] = 0.7 * W["acbd"] * tau["ijcd"]
            S["ijab"] = -0.3 * W["acbd"] * tau["ijcd"]         # tau's packs of the term above
            tau["ijab"] += 0.5 * R["ijab"]
            Q["ijab"] = 1.1 * W["acbd"] * tau["ijcd"]          # tau changed: packed anew
    with ts.Context(backend):
        updates()
    ladder = np.einsum("acbd,ijcd->ijab", W_d, tau_d)
    after = tau_d + 0.35 * ladder
    for got, ref in ((R, 0.7 * ladder), (S, -0.3 * ladder), (tau, after),
                     (Q, 1.1 * np.einsum("acbd,ijcd->ijab", W_d, after))):
        np.testing.assert_allclose(got.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
    ctx = PlanningContext()
    with ctx:
        updates()
    full = ["pack", "plus_pack", "plus_unpack", "minus_pack", "minus_unpack", "unpack"]
    assert [st.pairs for st in ctx.plans[0].steps if st.pairs] == \
        full + ["plus_unpack", "minus_unpack", "unpack"] + full


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("flat", [True, False], ids=["flat", "per-block"])
def test_t1_dressed_ladder(backend, seed, flat, monkeypatch):
    """The t1-dressed ladder R[ijab] += (W[acbd] - H[kcbd] t[ka] - H[kdac] t[kb]) tau[ijcd]
    (closed-shell CCSD's, H = ovvv) equals numpy.einsum: locally in the +/- form with the
    dressing on the packed tau+- (S^s = M^s tau^s, M+- = H[kcbd] +- H[kdbc] on c <= d:
    tensor.pairs.plus_minus_last), planned as a distributed run as the ladder plus the
    dressing made once and added with its mirror image; H with and without its (bd)
    symmetry, t1 of either virtual letter first. The local dressing's large GEMMs cost
    2 x 2 sum_g pairs_o(g ^ irrep(tau)) pairs_v(g) ov(g) flops, half of the 2 x 2 o^2 v^3 o
    of (H tau) t on every i, j (C1)."""
    from tessera.backends import sectors
    from tessera.plan.symmetric import distributed_plans
    from tessera.tensor.pairs import pair_space
    monkeypatch.setattr(sectors, "FLAT_BLOCK_ELEMENTS", 1 << 30 if flat else 0)
    o, v, rng = spaces(500 + seed, nirrep=[1, 2, 4, 8][seed], tile=2 + seed % 2)
    g = int(rng.integers(0, [1, 2, 4, 8][seed]))
    W_d = _eightfold(v, rng)
    W = BlockTensor.from_dense(W_d, (v,) * 4, 0, name="vvvv", symmetry=VVVV_SYMMETRY, canonical=True).freeze()
    H, H_d = _pair_symmetric(o, v, rng, 0, "kcbd", (0, 1, 3, 2)) if seed % 2 else \
        (lambda h: (h, h.to_dense()))(rand("kcbd", o, v, rng))
    H.freeze()
    t1 = rand("ia", o, v, rng)
    t_d = t1.to_dense()
    with ts.Context(backend):
        tau, tau_d = _pair_symmetric(o, v, rng, g, canonical=True)
        ref = 0.7 * (np.einsum("acbd,ijcd->ijab", W_d, tau_d) - np.einsum("kcbd,ka,ijcd->ijab", H_d, t_d, tau_d)
                     - np.einsum("kdac,kb,ijcd->ijab", H_d, t_d, tau_d))
        plans = []
        for distributed in (False, True):
            R = BlockTensor((o, o, v, v), g, name="R", symmetry=(ts.PermutationalSymmetry((1, 0, 3, 2)),),
                            canonical=True)
            with distributed_plans(distributed), ts.equations():
                if seed < 2:
                    R["ijab"] = 0.7 * (W["acbd"] - H["kcbd"] * t1["ka"] - H["kdac"] * t1["kb"]) * tau["ijcd"]
                else:       # the same, t1 on the other virtual letter first and H's letters renamed
                    R["ijab"] = 0.7 * (W["acbd"] - t1["lb"] * H["ldac"] - H["lcbd"] * t1["la"]) * tau["ijcd"]
            np.testing.assert_allclose(R.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
            ctx = PlanningContext()
            with ctx, distributed_plans(distributed), ts.equations():
                R["ijab"] = 0.7 * (W["acbd"] - H["kcbd"] * t1["ka"] - H["kdac"] * t1["kb"]) * tau["ijcd"]
            plans.append(ctx.plans[0])
    local, dist = plans
    assert [st.pairs for st in local.steps if st.pairs] == [
        "pack", "plus_pack", "plus_unpack", "minus_pack", "minus_unpack", "unpack"]
    assert [st.pairs for st in dist.steps if st.pairs] == ["pack", "unpack_half"]
    halves: dict = {}           # each half H: made once (the ladder's from its pairs), added with its mirror
    for st in dist.steps:
        for r in (st.out, *st.inputs):
            if r.tensor.name == "half":
                halves.setdefault(id(r.tensor), []).append(st.pairs or st.kind)
    assert sorted(halves.values()) == [["contract", "add", "add"], ["unpack_half", "add", "add"]]
    count = lambda sp: np.bincount(sp.irreps, minlength=8)  # noqa: E731
    npo, npv, no, nv = count(pair_space(o)), count(pair_space(v)), count(o), count(v)
    ov = np.array([sum(no[h] * nv[h ^ x] for h in range(8)) for x in range(8)])
    dressing = [st.flops for st in local.steps if st.kind == "contract" and st.inputs[1].tensor.name in ("kcbd+", "kcbd-")]
    assert len(dressing) == 2 and sum(dressing) == 4 * int(np.sum(npo[[h ^ g for h in range(8)]] * npv * ov))


def test_a_dressing_with_an_unsummed_occupied_letter_is_not_the_ladder_dressing():
    """R[ijab] += (W[acbd] - H[ibcd] t[ia] - H[jadc] t[jb]) tau[ijcd] has the dressed
    ladder's shape but sums no k (t's occupied letter is R's i): the +/- form must not take
    it (it would sum over i); planned as written it equals numpy.einsum."""
    o, v, rng = spaces(517, nirrep=1, tile=3)
    W_d = _eightfold(v, rng)
    W = BlockTensor.from_dense(W_d, (v,) * 4, 0, name="vvvv", symmetry=VVVV_SYMMETRY, canonical=True).freeze()
    H = rand("kcbd", o, v, rng).freeze()
    H_d, t1 = H.to_dense(), rand("ia", o, v, rng)
    t_d = t1.to_dense()
    with ts.Context("serial"):
        tau, tau_d = _pair_symmetric(o, v, rng, 0, canonical=True)
        R = BlockTensor((o, o, v, v), 0, name="R", symmetry=(ts.PermutationalSymmetry((1, 0, 3, 2)),),
                        canonical=True)
        with ts.equations():
            R["ijab"] = (W["acbd"] - H["ibcd"] * t1["ia"] - H["jadc"] * t1["jb"]) * tau["ijcd"]
    ref = (np.einsum("acbd,ijcd->ijab", W_d, tau_d) - np.einsum("ibcd,ia,ijcd->ijab", H_d, t_d, tau_d)
           - np.einsum("jadc,jb,ijcd->ijab", H_d, t_d, tau_d))
    np.testing.assert_allclose(R.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())


def _pair_orbitals(v):
    """(a, b) orbitals of each position of ``pair_space(v)`` (rows of pairs a <= b)."""
    from tessera.tensor.pairs import pair_space
    out = []
    for s, t in pair_space(v).tile_pairs:
        A, B = v.orbitals[v.slice(s)], v.orbitals[v.slice(t)]
        if s == t:
            i, j = np.triu_indices(len(A))
            out += list(zip(A[i], A[j]))
        else:
            out += [(a, b) for a in A for b in B]
    return np.array(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ladder_after_vvvv_is_freed(backend):
    """Once V+- are made, vvvv can be freed (``tensor.pairs.free_for_ladder``): it then
    holds no element, the ladder still equals numpy.einsum (the planner finds V+- kept on
    it), and a read of one of its blocks is an error, not a zero."""
    from tessera.tensor.pairs import free_for_ladder, kept_plus_minus, plus_minus
    o, v, rng = spaces(41, nirrep=2, tile=2)
    W_d = _eightfold(v, rng)
    W = BlockTensor.from_dense(W_d, (v,) * 4, 0, name="vvvv", symmetry=VVVV_SYMMETRY, canonical=True).freeze()
    assert not free_for_ladder(W) and W.stored_elements > 0         # no V+- yet: kept
    with ts.Context(backend):
        tau, tau_d = _pair_symmetric(o, v, rng, 0, canonical=True)
        ref = np.einsum("acbd,ijcd->ijab", W_d, tau_d)
        for n in range(2):
            R = BlockTensor((o, o, v, v), 0, name="R", symmetry=(ts.PermutationalSymmetry((1, 0, 3, 2)),),
                            canonical=True)
            with ts.equations():
                R["ijab"] = W["acbd"] * tau["ijcd"]
            np.testing.assert_allclose(R.to_dense(), ref, rtol=0, atol=1e-12 * np.abs(ref).max())
            if n == 0:
                assert kept_plus_minus(W) and free_for_ladder(W)
    assert W.stored_elements == 0 and not W.blocks
    for read in (lambda: W.blocks.get((0, 0, 0, 0)), W.to_dense, W.flat):
        with pytest.raises(SymmetryError, match="'vvvv' was freed"):
            read()
    made = kept_plus_minus(W)
    with pytest.raises(SymmetryError, match="'vvvv' was freed"):      # V+- of other axes: none from a freed W
        plus_minus(W, (1, 0, 3, 2), True)
    assert kept_plus_minus(W) is made                                 # and the kept ones stay


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(3))
def test_canonical_blocks_store_one_block_per_orbit(backend, seed):
    """canonical=True stores one block per orbit of the symmetry group; the other blocks
    are transposed views: to_dense is the full tensor, contractions with it (as any
    operand position) equal numpy.einsum, and equations cannot write into it."""
    o, v, rng = spaces(200 + seed, nirrep=[1, 2, 4][seed], tile=2)
    d = _eightfold(v, rng)
    with ts.Context(backend):
        V = BlockTensor.from_dense(d, (v,) * 4, 0, name="V", symmetry=VVVV_SYMMETRY, canonical=True)
        full = BlockTensor.from_dense(d, (v,) * 4, 0, name="full")
        np.testing.assert_array_equal(V.to_dense(), d)
        n = len(v.tiles)
        assert len(V.stored_keys()) < len(V.allowed_keys()) / 4 + n**2 and V.stored_elements < 0.5 * full.stored_elements
        assert all(np.shares_memory(V.blocks[a], V.blocks[c]) for a, (c, _) in V.aliases.items())
        tau = rand("ijcd", o, v, rng)
        R = ts.einsum("acbd,ijcd->ijab", V, tau)
        S = ts.einsum("ijcd,cdab->ijab", tau, V)
        ref = np.einsum("acbd,ijcd->ijab", d, tau.to_dense())
        np.testing.assert_allclose(R.to_dense(), ref, atol=1e-12 * np.abs(ref).max())
        np.testing.assert_allclose(S.to_dense(), np.einsum("ijcd,cdab->ijab", tau.to_dense(), d),
                                   atol=1e-12 * np.abs(ref).max())
        key = next(iter(V.aliases))                       # writing an alias writes its orbit
        blk = np.arange(np.prod(V.block_shape(key)), dtype=float).reshape(V.block_shape(key))
        V.store_block(key, blk)
        np.testing.assert_array_equal(V.blocks[key], blk)
        with pytest.raises(ShapeError, match="canonical"):
            V["abcd"] = full["abcd"]


T2_SYM = (ts.PermutationalSymmetry((1, 0, 3, 2)),)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(4))
def test_canonical_targets_equal_einsum(backend, seed):
    """Pair-symmetric tensors stored as canonical blocks (T2, tau and the residual of
    CCSD): round trips, and updates into them that mix canonical and full operands, as
    the planner writes them (canonical blocks only: symmetric terms, factors swapped into
    each other, mirror twins X + X^T, the packed-pair ladder, a denominator), equal
    numpy.einsum; an update that is not symmetric is refused."""
    from tessera.chem.integrals import denominator
    o, v, rng = spaces(300 + seed, nirrep=[1, 2, 4, 8][seed], tile=2 + seed % 2)
    with ts.Context(backend):
        T, T_d = _pair_symmetric(o, v, rng, 0, canonical=True)
        full = BlockTensor.from_dense(T_d, T.spaces, 0, name="full")
        np.testing.assert_array_equal(T.to_dense(), T_d)
        np.testing.assert_array_equal(T.copy().to_dense(), T_d)
        assert T.stored_elements < 0.75 * full.stored_elements and T.dense_elements == full.dense_elements
        assert sum(T.orbit_size(k) * np.prod(T.block_shape(k)) for k in T.stored_keys()) == full.stored_elements
        assert abs(T.norm() - np.linalg.norm(T_d)) < 1e-12 * np.linalg.norm(T_d)
        assert abs(ts.dot(full["ijab"], T["jiba"]) - float(np.vdot(T_d, T_d))) < 1e-10 * float(np.vdot(T_d, T_d))
        t1, Z, W = rand("ia", o, v, rng), rand("ijab", o, v, rng), _pair_symmetric(o, v, rng, 0, "acbd", (2, 3, 0, 1))[0]
        eo, ev = rng.random(o.dim) - 2.0, rng.random(v.dim) + 0.5
        D = denominator((o, o, v, v), (eo, eo, ev, ev), (1, 1, -1, -1), "D", T2_SYM)
        tau, R, Q = (BlockTensor(T.spaces, 0, name=n, symmetry=T2_SYM, canonical=True) for n in ("tau", "R", "Q"))
        with ts.equations():
            tau["ijab"] = T["ijab"] + t1["ia"] * t1["jb"]                     # factors swapped
            R["ijab"] = (W["acbd"] * tau["ijcd"] + Z["ijab"] + Z["jiba"]       # ladder on pairs, twins
                         + Z["ikac"] * T["kjcb"] + T["ikac"] * Z["jkbc"]           # twins through a GEMM
                         + 2.0 * Z["ikac"] * Z["jkbc"] - tau["ijba"])              # a symmetric product
            Q["ijab"] = R["ijab"] / D["ijab"]
        t_, z, w = t1.to_dense(), Z.to_dense(), W.to_dense()
        tau_d = T_d + np.einsum("ia,jb->ijab", t_, t_)
        r = (np.einsum("acbd,ijcd->ijab", w, tau_d) + z + z.transpose(1, 0, 3, 2)
             + np.einsum("ikac,kjcb->ijab", z, T_d) + np.einsum("ikac,jkbc->ijab", T_d, z)
             + 2.0 * np.einsum("ikac,jkbc->ijab", z, z) - tau_d.transpose(0, 1, 3, 2))
        d = D.to_dense()
        for got, ref in ((tau, tau_d), (R, r), (Q, np.divide(r, d, out=np.zeros_like(r), where=d != 0))):
            np.testing.assert_allclose(got.to_dense(), ref, rtol=0, atol=1e-11 * np.abs(ref).max())
            assert got.stored_elements == T.stored_elements
        # two canonical tensors in one index order: each orbit once, weighted by its size
        assert abs(ts.dot(R["ijab"], tau["ijab"]) - float(np.vdot(r, tau_d))) < 1e-12 * np.abs(r).sum() * np.abs(tau_d).max()
        with pytest.raises(ShapeError, match="canonical blocks only.*mirror") as err:
            R["ijab"] = Z["ijab"] + T["ijab"]
        assert "\n" not in str(err.value)


def test_alias_index_is_never_seen_half_built():
    """AliasMap.of builds its canonical -> aliases index on first use, from any thread
    (the threads backend stores blocks concurrently, e.g. the integral transform). A
    second thread asking while the first is still building must get the full answer, not
    a half-built index (a missing alias block gathers as zeros: a converged wrong energy)."""
    from tessera.tensor.block_tensor import AliasMap, aliases
    v = IndexSpace.uniform("v", [1] * 4)
    full = aliases((v,) * 4, 0, VVVV_SYMMETRY)
    building, resume = threading.Event(), threading.Event()

    class Paused(AliasMap):      # the first build stops after one entry until resumed
        calls = 0

        def items(self):
            Paused.calls += 1
            first = Paused.calls == 1
            for n, item in enumerate(super().items()):
                if first and n == 1:
                    building.set()
                    resume.wait(10)
                yield item

    m = Paused(full)
    last = list(full.values())[-1][0]
    worker = threading.Thread(target=m.of, args=(list(full.values())[0][0],))
    worker.start()
    assert building.wait(10)
    try:
        assert sorted(m.of(last)) == sorted((a, p) for a, (c, p) in full.items() if c == last)
    finally:
        resume.set()
        worker.join()
    assert sorted(m.of(last)) == sorted(full.of(last))


def test_alias_map_is_the_per_key_rule():
    """aliases (NumPy over the allowed keys) equals the rule written per key: of every
    allowed key, the images under the symmetry group; the largest is the canonical key,
    and perm inverts the group element that gives it (the last such in the group's
    order), entries in key order. Irregular tiles and irreps, every symmetry of the
    integral classes and T2's, and groups of 2- and 3-index tensors."""
    from tessera.chem.integrals import _SYMMETRY
    from tessera.tensor.block_tensor import aliases, allowed_keys, symmetry_group
    PS = ts.PermutationalSymmetry
    syms = [*_SYMMETRY.values(), (PS((1, 0, 3, 2)),), (PS((1, 0)),), (PS((0, 2, 1)), PS((1, 0, 2)))]
    rng = np.random.default_rng(21)
    found = 0
    for trial in range(3 * len(syms)):
        sym = syms[trial % len(syms)]
        nd, nt = len(sym[0].perm), int(rng.integers(1, 7))
        space = IndexSpace.uniform("x", rng.integers(1, 5, nt).tolist(), rng.integers(0, 4, nt).tolist())
        spaces, irrep = (space,) * nd, int(rng.integers(0, 4))
        group = symmetry_group(sym, nd)
        ref = {}
        for key in allowed_keys(spaces, irrep):
            images = {tuple(key[g[k]] for k in range(nd)): g for g in group}
            canon = max(images)
            if canon != key:
                g = images[canon]
                ref[key] = (canon, tuple(sorted(range(nd), key=lambda k: g[k])))
        got = aliases(spaces, irrep, sym)
        assert list(got.items()) == list(ref.items()), trial
        found += len(ref)
    assert found > 500
