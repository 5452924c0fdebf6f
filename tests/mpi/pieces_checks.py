"""Blocks stored in pieces over several ranks (placement ``pieces``) under `mpiexec -n K`,
with TESSERA_PIECES set by the test so that every block of a ``pieces`` tensor is cut.

1. A ``pieces`` tensor on mpi-onesided through every access path, against numpy: put_block
   from rank 0, accumulate_block from every rank, get_block, to_dense (fetch_many), the
   global array's iget / get_patch / acc_patch across blocks and pieces, a put_patch of
   part of a block, a contraction that reads it (ts.einsum) and a dot with it first; a
   local view is refused (a one-line error, reported as its message).
2. The operations CCSD performs on amplitudes, on pieced tensors (a pair-symmetric oovv
   tensor stored as canonical blocks, as T2) against numpy, for the one-sided variants
   original, cached and owner and for mpi-collective summa and 2.5d (pieces gathered
   and cut by all-to-all): copy, zero_, norm, max_abs, vdot (pieces with pieces
   and with whole blocks), ts.dot (same and swapped index order), and steps writing a
   pieced output: scaled sums with a transposed input, the division by a pieced
   denominator (from other pieces, and all in the same pieces: rank-local), a product
   of two t1-like tensors (hadamard) and contractions.
3. CCSD(T) of water (C2v, tile 2) converged with the integral classes and T2 in pieces
   on mpi-onesided (cached, original), STO-3G and 6-31G, and on mpi-collective (summa,
   2.5d), STO-3G.
4. Parts of pieced blocks cut on other axes than the first (2.5D layer parts, (T)
   windows) moved by mpi-collective's ``exchange``: the values against numpy, and the
   bytes each rank receives (the runtime's alltoallv counter) against the part's elements
   that the rank does not hold itself (from its own pieces, ``local_pieces``).
5. The same parts fetched by mpi-onesided (``fetch_blocks``: one get per run of the part in
   a piece): the values against numpy, and the bytes each rank's get counter records per
   target against the part's elements that target holds (from every rank's pieces).
6. With ``--collective`` (4 ranks as 2 emulated nodes): ``collective`` below (and 4).
7. With ``--model``: ``model_bytes`` below (the bytes of collective steps, one-sided
   sums and owner contractions on pieces against the cost model's), ``frozen_second_run``
   (a frozen operand's, and a frozen input of a sum's, second run on mpi-collective at two
   frozen-cache bounds against the model's) and ``held_bytes`` (each rank's bytes of the stored classes under
   TESSERA_PIECES against the model's).

Rank 0 prints one JSON object: the errors, whether the tensors were cut, and the
energies; tests/test_pieces_mpi.py compares them with numpy and PySCF.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.exchange import exchange
from tessera.backends.context import Context
from tessera.backends.distributed import FrozenCache
from tessera.backends.tasks import part_slice
from tessera.chem.ccsd import CCSD
from tessera.chem.ccsd_equations import T2_SYMMETRY
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.errors import TesseraError
from tessera.runtime import World
from tessera.runtime.distribution import default_layers
from tessera.tensor.block_tensor import allowed_keys

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ONESIDED = (("mpi-onesided", "cached"), ("mpi-onesided", "original"))
COLLECTIVE = (("mpi-collective", "summa"), ("mpi-collective", "2.5d"))
OPERATIONS = tuple(("mpi-onesided", v) for v in ("original", "cached", "owner")) + COLLECTIVE


def refused(fn) -> str:
    try:
        fn()
    except TesseraError as err:
        return str(err)
    return ""


def access(world) -> dict:
    rng = np.random.default_rng(11)
    o = IndexSpace.from_irreps("o", rng.integers(0, 2, 6), 3)
    v = IndexSpace.from_irreps("v", rng.integers(0, 2, 9), 4)
    out = {}
    with Context("mpi-onesided", variant="original"):
        t = BlockTensor((o, v, v), 1, name="p", placement="pieces")
        keys = t.stored_keys()
        blocks = {k: rng.standard_normal(t.block_shape(k)) for k in keys}    # the same on every rank
        if world.rank == 0:
            for k in keys:
                t.put_block(k, blocks[k])
        t.dist.sync()
        for k in keys:
            t.accumulate_block(k, blocks[k], scale=world.rank + 1.0)
        t.dist.sync()
        factor = 1.0 + sum(r + 1.0 for r in range(world.size))
        ref = {k: factor * b for k, b in blocks.items()}
        ga = t.dist.ga
        out["pieced"] = bool(t.dist.pieced)
        out["pieces_per_block"] = ga.pieces
        out["blocks_here"] = len(t.blocks)
        out["held"] = world.allreduce(t.local_nbytes, "sum") / (8 * sum(b.size for b in blocks.values()))
        err = max(float(np.abs(t.get_block(k) - ref[k]).max()) for k in keys)
        err = max(err, max(float(np.abs(ga.iget(k).wait() - ref[k]).max()) for k in keys))
        dense = np.zeros(t.shape)
        for k, b in ref.items():
            dense[np.ix_(*(s.orbitals[s.slice(x)] for s, x in zip(t.spaces, k)))] = b
        err = max(err, float(np.abs(t.to_dense() - dense).max()))
        # patches in the array's own (tile-ordered) index space: the whole, and a box across blocks
        whole = np.zeros(ga.shape)
        for k, b in ref.items():
            lo, hi = ga.block_range(k)
            whole[tuple(slice(a, c) for a, c in zip(lo, hi))] = b
        err = max(err, float(np.abs(ga.get_patch((0, 0, 0), ga.shape) - whole).max()))
        lo, hi = (1, 2, 3), (ga.shape[0] - 1, ga.shape[1] - 1, ga.shape[2] - 2)
        allowed = np.zeros(ga.shape, bool)
        for k in keys:
            a, c = ga.block_range(k)
            allowed[tuple(slice(x, y) for x, y in zip(a, c))] = True
        sub = tuple(slice(a, b) for a, b in zip(lo, hi))
        first = next(k for k in keys if min(t.block_shape(k)) >= 2)   # acc_patch: inside existing blocks
        a, c = ga.block_range(first)
        inner = (tuple(x + 1 for x in a), c)
        part = rng.standard_normal([y - x - 1 for x, y in zip(a, c)])     # the same on every rank
        ga.sync()                                      # every rank has read before rank 0 adds
        if world.rank == 0:
            ga.acc_patch(*inner, part)
        ga.sync()
        whole[tuple(slice(x, y) for x, y in zip(*inner))] += part
        err = max(err, float(np.abs(ga.get_patch(lo, hi) - np.where(allowed, whole, 0.0)[sub]).max()))
        err = max(err, float(np.abs(ga.iget_patch(*inner).wait() - whole[tuple(slice(x, y) for x, y in zip(*inner))]).max()))
        out["access_error"] = world.allreduce(err, "max")
        # a contraction that reads the pieced tensor (one-sided gets of its pieces)
        x = BlockTensor.random((v, o), 0, rng=rng, name="x")
        y = ts.einsum("iab,bj->iaj", t, x)
        expect = np.einsum("iab,bj->iaj", t.to_dense(), x.to_dense())
        out["einsum_error"] = float(np.abs(y.to_dense() - expect).max())
        w = BlockTensor.random((o, v, v), 1, rng=rng, name="w")
        out["dot_error"] = abs(ts.dot(t["iab"], w["iba"]) - float(np.einsum("iab,iba->", t.to_dense(), w.to_dense())))
        ga.sync()
        out["local_view"] = refused(lambda: ga.local_view(first))
        if world.rank == 0:             # a put of part of a block writes only the part's elements
            ga.put_patch(*inner, 2.0 * part)
        ga.sync()
        whole[tuple(slice(x, y) for x, y in zip(*inner))] = 2.0 * part
        put_err = float(np.abs(ga.get_patch((0, 0, 0), ga.shape) - np.where(allowed, whole, 0.0)).max())
        out["partial_put_error"] = world.allreduce(put_err, "max")
        out["like"] = t.like().dist.pieced
    return out


def masked(dense, spaces, irrep) -> np.ndarray:
    """``dense`` with the elements of blocks its symmetry forbids set to zero."""
    out = np.zeros_like(dense)
    for key in allowed_keys(spaces, irrep):
        idx = np.ix_(*(s.orbitals[s.slice(k)] for s, k in zip(spaces, key)))
        out[idx] = dense[idx]
    return out


def filled(dense, spaces, name, placement="pieces", pair=False) -> BlockTensor:
    """A tensor with the allowed blocks of ``dense`` (its canonical ones for ``pair``),
    each process putting the blocks it computes (their home)."""
    t = BlockTensor(spaces, 0, name=name, placement=placement, symmetry=T2_SYMMETRY if pair else (),
                    canonical=pair)
    for key in t.owned_keys():
        t.store_block(key, dense[np.ix_(*(s.orbitals[s.slice(k)] for s, k in zip(spaces, key)))])
    t.dist.sync()
    return t


def operations(world, backend, variant, **options) -> dict:
    """Section 2 of the module docstring on one variant: {check: error against numpy}."""
    rng = np.random.default_rng(5)
    o = IndexSpace.from_irreps("o", rng.integers(0, 2, 5), 2)
    v = IndexSpace.from_irreps("v", rng.integers(0, 2, 7), 3)
    oovv = (o, o, v, v)

    def pair_dense():
        x = rng.standard_normal(tuple(s.dim for s in oovv))
        return masked(x + x.transpose(1, 0, 3, 2), oovv, 0)
    td, ud, dd = pair_dense(), pair_dense(), 3.0 + np.abs(pair_dense())
    xd, md, fd = (masked(rng.standard_normal((a.dim, b.dim)), (a, b), 0) for a, b in ((o, v), (v, v), (o, o)))
    err: dict = {}

    def check(name, got, want):
        err[name] = max(err.get(name, 0.0), float(np.abs(np.asarray(got) - want).max()))
    with Context(backend, variant=variant, **options):
        T, U, D = (filled(d, oovv, n, pair=True) for d, n in ((td, "T"), (ud, "U"), (dd, "D")))
        A = filled(ud, oovv, "A", placement="balanced", pair=True)
        X, M, F = (filled(d, sp, n, "balanced") for d, sp, n in ((xd, (o, v), "x"), (md, (v, v), "m"), (fd, (o, o), "f")))
        err["pieced"] = float(all(t.pieced for t in (T, U, D)) and not A.pieced)
        C = T.copy("C")
        C.dist.sync()                   # rank-local writes: complete everywhere before reading
        check("copy", C.to_dense(), td)
        check("like", float(C.pieced), 1.0)
        check("norm", T.norm(), np.linalg.norm(td))
        check("max_abs", T.max_abs(), np.abs(td).max())
        check("vdot", T.vdot(U), np.vdot(td, ud))
        check("vdot", T.vdot(A), np.vdot(td, ud))
        check("vdot", A.vdot(T), np.vdot(td, ud))
        check("dot", ts.dot(T["ijab"], U["ijab"]), np.vdot(td, ud))
        check("dot", ts.dot(T["ijab"], U["ijba"]), np.einsum("ijab,ijba->", td, ud))
        check("dot", ts.dot(A["ijab"], T["jiab"]), np.einsum("ijab,jiab->", ud, td))
        C.zero_()
        C.dist.sync()
        check("zero", C.to_dense(), 0.0)
        Z = BlockTensor(oovv, 0, name="Z", placement="pieces")           # no pair symmetry
        with ts.equations():
            C["ijab"] = 2.0 * T["ijab"] - U["ijba"] + A["ijab"]
            Z["ijab"] = T["ijab"] / D["ijab"]
        check("add", C.to_dense(), 2.0 * td - ud.transpose(0, 1, 3, 2) + ud)
        check("divide", Z.to_dense(), np.divide(td, dd, out=np.zeros_like(td), where=dd != 0))
        with ts.equations():            # all in the same pieces: rank-local (executor.rank_local)
            C["ijab"] = T["ijab"] / D["ijab"]
            C["ijab"] += 0.5 * U["ijab"]
        check("divide", C.to_dense(), np.divide(td, dd, out=np.zeros_like(td), where=dd != 0) + 0.5 * ud)
        with ts.equations():
            C["ijab"] = T["ijab"] + X["ia"] * X["jb"]
        check("hadamard", C.to_dense(), td + masked(np.einsum("ia,jb->ijab", xd, xd), oovv, 0))
        with ts.equations():
            Z["ijab"] = T["ijcb"] * M["ca"] - 0.5 * F["ki"] * U["kjab"]
            C["ijab"] = T["ijcd"] * T["klcd"] * T["klab"]
        check("contract", Z.to_dense(), masked(np.einsum("ijcb,ca->ijab", td, md)
                                               - 0.5 * np.einsum("ki,kjab->ijab", fd, ud), oovv, 0))
        check("contract", C.to_dense(), np.einsum("ijcd,klcd,klab->ijab", td, td, td))
        check("held", world.allreduce(Z.local_nbytes, "sum") / (8 * np.count_nonzero(masked(np.ones_like(td), oovv, 0))), 1.0)
    return {k: world.allreduce(e, "max") for k, e in err.items()}


def energies(world, basis: str, runs, xyz: str = "water.xyz") -> dict:
    mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis=basis).to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
    out = {"e_hf": ref.e_hf}
    for backend, variant in runs:
        if backend == "serial":         # the same on every rank: rank 0 runs it, the others get it
            out[f"{backend}/{variant}"] = world.bcast(ccsd_t(ref, backend, variant) if world.rank == 0 else None,
                                                      root=0)
        else:
            out[f"{backend}/{variant}"] = ccsd_t(ref, backend, variant)
    return out


def ccsd_t(ref, backend: str, variant) -> dict:
    """CCSD (converged to 1e-10) and (T) on one backend, tile 2, and the tensors stored in pieces."""
    with Context(backend, variant=variant) as ctx:
        ints = transform(ref, 0, 2)
        cut = sorted(n for n, t in ints.tensors.items() if t.pieced)
        cc = CCSD(conv=1e-10, max_iter=80).kernel(ints, ctx)
        tr = triples_correction(ints, cc.t1, cc.t2, context=ctx)
        cut += ["t2"] if cc.t2.pieced else []
    return {"e_ccsd": cc.e_corr, "e_t": tr.energy, "pieced": cut}


def pair_amplitudes() -> tuple:
    """(spaces, dense values) of ``part_bytes``' pair-symmetric oovv tensor (C1, tiles 3 and 4)."""
    rng = np.random.default_rng(7)
    o = IndexSpace.from_irreps("o", np.zeros(6, int), 3)
    v = IndexSpace.from_irreps("v", np.zeros(8, int), 4)
    oovv = (o, o, v, v)
    x = rng.standard_normal(tuple(s.dim for s in oovv))
    return oovv, x + x.transpose(1, 0, 3, 2)


def part_bytes(world) -> dict:
    """Section 4: parts cut along the third, the last and two axes (one of them the first) of
    every block of a pair-symmetric pieced oovv tensor, of its canonical blocks and of their
    aliases, each sent to one rank by ``exchange``: max error against numpy; bytes received
    over all ranks, as counted by the runtime and as derived from the pieces each rank
    holds (a part's elements outside the receiver's own pieces, 8 bytes each); and the
    bytes of the whole blocks the parts are cut from."""
    oovv, td = pair_amplitudes()
    with Context("mpi-collective") as ctx:
        T = filled(td, oovv, "T", pair=True)
        ga, me = T.dist.ga, world.rank
        held = {}                       # key -> this rank's elements of the stored block
        for key, start, count in ga.local_pieces():
            held.setdefault(key, np.zeros(ga.block_shape(key), bool)).reshape(-1)[start:start + count] = True
        cuts = ((2, 1, 3), (3, 0, 2), (0, 1, 2, 3, 1, 4))
        keys = sorted(T.allowed_keys())
        items = [(ga, k, n % world.size, cuts[n % len(cuts)]) for n, k in enumerate(keys)]
        snap = world.comm_log.snapshot()
        got = exchange(ctx.executor.cc, items)
        moved = int(world.comm_log.row(world.size, ("alltoallv",), since=snap).sum())
        err, expect, whole = 0.0, 0, 0
        for _, key, dest, part in items:
            if dest != me:
                continue
            canon, perm = ga.aliases.get(key, (key, None))
            mine = held.get(canon, np.zeros(ga.block_shape(canon), bool))
            mine = (mine if perm is None else mine.transpose(perm))[part_slice(4, part)]
            expect += 8 * int(mine.size - mine.sum())
            whole += 8 * int(np.prod(ga.block_shape(key)))
            ref = td[np.ix_(*(s.orbitals[s.slice(t)] for s, t in zip(oovv, key)))][part_slice(4, part)]
            err = max(err, float(np.abs(got[(ga.eid, key, part)] - ref).max()))
        total = world.allreduce(np.array([moved, expect, whole]), "sum")
        return {"err": world.allreduce(err, "max"), "aliases": len(ga.aliases), "pieced": bool(T.pieced),
                "moved": int(total[0]), "expected": int(total[1]), "whole_blocks": int(total[2])}


def onesided_part_bytes(world) -> dict:
    """Section 5: the parts of ``part_bytes`` fetched by mpi-onesided, each by the rank
    ``part_bytes`` sends it to: max error against numpy; the bytes of the gets, per target
    and summed over the ranks, as the runtime counts them and as derived from the pieces
    every rank holds (a part's elements held by each target, its own included, 8 bytes
    each); and the bytes of the whole blocks the parts are cut from."""
    oovv, td = pair_amplitudes()
    with Context("mpi-onesided", variant="original") as ctx:
        T = filled(td, oovv, "T", pair=True)
        ga, me = T.dist.ga, world.rank
        holder = {}                     # key -> the rank holding each element of the stored block
        for rank, pieces in enumerate(world.allgather(ga.local_pieces())):
            for key, start, count in pieces:
                holder.setdefault(key, np.full(ga.block_shape(key), -1)).reshape(-1)[start:start + count] = rank
        cuts = ((2, 1, 3), (3, 0, 2), (0, 1, 2, 3, 1, 4))
        mine = [(k, cuts[n % len(cuts)]) for n, k in enumerate(sorted(T.allowed_keys())) if n % world.size == me]
        snap = world.comm_log.snapshot()
        got = ctx.executor.fetch_blocks([(T, k, part) for k, part in mine])
        moved = world.comm_log.row(world.size, ("get",), since=snap)
        err, expect, whole = 0.0, np.zeros(world.size, dtype=np.int64), 0
        for key, part in mine:
            canon, perm = ga.aliases.get(key, (key, None))
            held = (holder[canon] if perm is None else holder[canon].transpose(perm))[part_slice(4, part)]
            expect += 8 * np.bincount(held.reshape(-1), minlength=world.size)
            whole += 8 * int(np.prod(ga.block_shape(key)))
            ref = td[np.ix_(*(s.orbitals[s.slice(t)] for s, t in zip(oovv, key)))][part_slice(4, part)]
            err = max(err, float(np.abs(got[(T.uid, key, part)] - ref).max()))
        return {"err": world.allreduce(err, "max"), "aliases": len(ga.aliases), "pieced": bool(T.pieced),
                "per_target_equal": bool(world.allreduce(int((moved == expect).all()), "min")),
                "moved": int(world.allreduce(int(moved.sum()), "sum")),
                "expected": int(world.allreduce(int(expect.sum()), "sum")),
                "whole_blocks": int(world.allreduce(whole, "sum"))}


def model_bytes(world) -> dict:
    """Section 7 (``--model``): steps on tensors in pieces, each run alone. On
    mpi-collective (``collective``): a contraction with each operand stationary (a: pieced
    T, b: whole M, c: the pieced output) and on the grid (summa, and 2.5d on its layers:
    parts of pieced blocks to their homes, panels broadcast, outputs cut at pieces), an
    outer product of one tensor with itself (its blocks move once for both operands), a
    sum with a transposed input and a Hadamard product writing a pieced output: per step
    and rank the bytes the runtime's all-to-all and broadcast counters record received, and
    the model's (``step_bytes.step_recv`` of the same equations planned on structure
    alone, with the run's TESSERA_PIECES). On mpi-onesided (``onesided``; variants original
    and owner): the sums, a division and the Hadamard product, the bytes each rank's get,
    accumulate and put counters record with other ranks, and the model's
    (``step_bytes.onesided_step_bytes``); variant owner's contraction and outer product,
    its get and put counters against ``step_bytes.onesided_owner_counts``."""
    from tessera.backends.context import PlanningContext
    from tessera.backends.step_bytes import onesided_step_bytes, owner_other_ops, step_recv
    rng = np.random.default_rng(5)
    o = IndexSpace.from_irreps("o", rng.integers(0, 2, 5), 2)
    v = IndexSpace.from_irreps("v", rng.integers(0, 2, 7), 3)
    oovv = (o, o, v, v)
    dense = {"T": masked(rng.standard_normal((o.dim, o.dim, v.dim, v.dim)), oovv, 0),
             "M": masked(rng.standard_normal((v.dim, v.dim)), (v, v), 0),
             "X": masked(rng.standard_normal((o.dim, v.dim)), (o, v), 0)}
    dense["T"] = dense["T"] + dense["T"].transpose(1, 0, 3, 2)
    dense["D"] = 3.0 + np.abs(dense["T"])

    def contract(t):
        t["Z"]["ijab"] = t["T"]["ijcb"] * t["M"]["ca"]

    def add(t):
        t["C"]["ijab"] = 2.0 * t["T"]["ijab"] - t["T"]["ijba"]

    def divide(t):
        t["Z"]["ijab"] = t["T"]["ijba"] / t["D"]["ijab"]

    def outer(t):
        t["C"]["ijab"] = t["X"]["ia"] * t["X"]["jb"]

    def hadamard(t):
        t["Z"]["ijab"] = t["T"]["ijab"] * t["T"]["jiab"]

    def tensors(fill):
        made = {"T": (oovv, "pieces", True), "M": ((v, v), "balanced", False), "X": ((o, v), "balanced", False),
                "D": (oovv, "balanced", True)}
        out = {n: (filled(dense[n], sp, n, pl, pair) if fill else
                   BlockTensor(sp, 0, name=n, placement=pl, symmetry=T2_SYMMETRY if pair else (), canonical=pair))
               for n, (sp, pl, pair) in made.items()}
        out["Z"] = BlockTensor(oovv, 0, name="Z", placement="pieces")
        out["C"] = BlockTensor(oovv, 0, name="C", placement="pieces", symmetry=T2_SYMMETRY, canonical=True)
        return out

    def planned(eq, make=tensors):
        with PlanningContext() as plan:
            with ts.equations():
                eq(make(False))
        return [step for p in plan.plans for step in p.steps]

    def counted(eq, ops, backend, variant, **options):
        """(bytes this rank's counters ``ops`` record with other ranks in ``eq``, whether
        T, Z and C are in pieces, [gets, puts] this rank makes with other ranks)."""
        with Context(backend, variant=variant, **options):
            t = tensors(True)
            snap = world.comm_log.snapshot()
            with ts.equations():
                eq(t)
            row = world.comm_log.row(world.size, ops, since=snap)
            made = [sum(r.count for r in world.comm_log.records(since=snap) if r.op == op and r.peer != world.rank)
                    for op in ("get", "put")]
            return int(row.sum() - row[world.rank]), all(t[n].pieced for n in ("T", "Z", "C")), made
    collective = [("contract/" + m, contract, "summa", m) for m in ("a", "b", "c")] + \
        [("contract/summa", contract, "summa", "never"), ("contract/2.5d", contract, "2.5d", "never"),
         ("outer/c", outer, "summa", "c"), ("outer/summa", outer, "summa", "never"),
         ("add", add, "summa", "c"), ("hadamard", hadamard, "summa", "c")]
    out = {"collective": {}, "onesided": {}, "onesided_owner": {}}
    for name, eq, variant, mode in collective:
        got, pieced, _ = counted(eq, ("alltoallv", "bcast_row", "bcast_col"), "mpi-collective", variant, stationary=mode)
        steps = planned(eq)
        layers = 1 if variant == "summa" else default_layers(world.size)
        model = sum(step_recv(s, world.size, "summa" if mode == "never" else mode, layers=layers) for s in steps)
        out["collective"][name] = {"counted": world.allgather(got), "model": [float(x) for x in model],
                                   "pieced": pieced, "kinds": sorted({s.kind for s in steps} - {"zero"})}
    from tessera.backends.registry import least_pieces
    for name, eq in (("add", add), ("divide", divide), ("hadamard", hadamard)):
        for variant in ("original", "owner"):
            got, pieced, made = counted(eq, ("get", "acc", "put"), "mpi-onesided", variant)
            cache = {"least": least_pieces()}
            steps = planned(eq)
            model = sum(onesided_step_bytes(s, world.size, cache, variant != "owner") for s in steps)
            out["onesided"][f"{name}/{variant}"] = {"counted": world.allgather(got),
                                                    "model": [float(x) for x in model], "pieced": pieced}
            if variant == "owner":      # and its gets and puts (``step_bytes.owner_other_ops``)
                ops = [sum(owner_other_ops(s, world.size, cache)[n] for s in steps) for n in (0, 1)]
                out["onesided"][f"{name}/{variant}"].update(
                    ops_counted=world.allgather(made), ops_model=np.array(ops).T.astype(int).tolist())
    # mpi-onesided's contractions under variant owner (a static deal by ownership): each
    # rank's gets and puts as its deal places the tasks (``step_bytes.onesided_owner_counts``)
    from tessera.backends.step_bytes import onesided_owner_counts
    for name, eq in (("contract", contract), ("outer", outer)):
        got, pieced, made = counted(eq, ("get", "put", "acc"), "mpi-onesided", "owner")
        cache = {"least": least_pieces()}
        counts = [onesided_owner_counts(s, world.size, cache) for s in planned(eq) if s.kind == "contract"]
        model = sum(c["bytes"] for c in counts)
        ops = [sum(c[k] for c in counts) for k in ("gets", "puts")]
        out["onesided_owner"][name] = {"counted": world.allgather(got), "pieced": pieced,
                                       "model": [float(x) for x in model], "ops_counted": world.allgather(made),
                                       "ops_model": np.array(ops).T.astype(int).tolist()}
    out["frozen"] = frozen_second_run(world, tensors, contract, planned, "M", "bytes_per_rank")

    def with_y(fill):
        t = tensors(fill)
        t["Y"] = BlockTensor(oovv, 0, name="Y", placement="balanced")
        return t

    def copy_frozen(t):
        t["Y"]["ijab"] = t["D"]["ijba"]
    out["frozen_sums"] = {"divide": frozen_second_run(world, tensors, divide, planned, "D", "other_bytes"),
                          "copy": frozen_second_run(world, with_y, copy_frozen, planned, "D", "other_bytes")}

    def cycled(fill):
        """T, three frozen matrices M0..M2 and an output for each (``cyclic_frozen_bytes``)."""
        t = tensors(fill)
        for n in range(3):
            t[f"M{n}"] = (filled((n + 1.0) * dense["M"], (v, v), f"M{n}", "balanced") if fill else
                          BlockTensor((v, v), 0, name=f"M{n}", placement="balanced")).freeze()
            t[f"Z{n}"] = BlockTensor(oovv, 0, name=f"Z{n}", placement="pieces")
        return t
    out["cyclic"] = cyclic_frozen_bytes(world, cycled, planned)

    def with_w(fill):
        t = tensors(fill)
        t["W"] = BlockTensor((o, o, o, o), 0, name="W")
        return t

    def pair_products(t):
        t["W"]["ijkl"] = t["T"]["ijcd"] * t["T"]["klcd"]
    out["grid"] = grid_choice(world, with_w, pair_products, planned)
    out["held"] = held_bytes(world)
    return out


def frozen_second_run(world, make, eq, planned, name: str, part: str) -> dict:
    """mpi-collective (summa, modes by cost) running ``eq`` twice with tensor ``name``
    frozen: per rank the bytes the all-to-all and broadcast counters record in the second
    run (what every later iteration moves), with the executor's frozen cache at its default
    bound and at 0 MiB (nothing is kept), and the model's busiest rank
    (``collective_model.collective_traffic``'s ``part`` at the same bound:
    ``bytes_per_rank`` of contractions, ``other_bytes`` of sums); the all-to-alls and
    broadcasts this rank's counters record in that run (``ops``) and the model's
    (``exchanges`` of contractions + ``other_exchanges`` of sums)."""
    from tessera.backends.collective_model import collective_traffic
    from tessera.backends.iteration_counts import structure_stats
    from tessera.backends.budget import EXECUTOR_CACHE_MB

    def frozen(fill):
        t = make(fill)
        t[name].freeze()
        return t
    run = SimpleNamespace(plans=[SimpleNamespace(steps=planned(eq, frozen))], tensors=[], tiles={})
    s = structure_stats(lambda *_: run, 0, 0, world.size)
    out = {}
    for limit_mb in (EXECUTOR_CACHE_MB, 0):
        with Context("mpi-collective", variant="summa") as ctx:
            ctx.executor.frozen.limit = limit_mb << 20
            t = frozen(True)
            for _ in range(2):
                snap = world.comm_log.snapshot()
                with ts.equations():
                    eq(t)
            row = world.comm_log.row(world.size, ("alltoallv", "bcast_row", "bcast_col"), since=snap)
            ops = sum(t.count for op, t in world.comm_log.totals(since=snap).items()
                      if op in ("alltoallv", "bcast_row", "bcast_col"))
        tr = collective_traffic(s, world.size, "summa", limit_mb << 20)
        out[str(limit_mb)] = {"counted": world.allgather(int(row.sum() - row[world.rank])), "model": tr[part],
                              "ops": world.allgather(ops), "model_ops": tr["exchanges"] + tr["other_exchanges"]}
    return out


def grid_choice(world, make, eq, planned) -> dict:
    """mpi-collective (summa, on the grid only) running ``eq``: the grid shape the executor
    ran it on, the bytes each rank's all-to-all and broadcast counters record received;
    the model's grid (``stationary.summa_grid``: the least cost of the busiest rank as
    ``summa_recv`` counts it) and its bytes per rank there, and the grid of the older even
    count (``summa_layout.choose_grid``) and the bytes per rank ``summa_recv`` counts there."""
    from tessera.backends import stationary
    from tessera.backends.registry import least_pieces
    from tessera.backends.step_bytes import operands
    from tessera.backends.summa_layout import choose_grid
    with Context("mpi-collective", variant="summa", stationary="never") as ctx:
        t = make(True)
        snap = world.comm_log.snapshot()
        with ts.equations():
            eq(t)
        row = world.comm_log.row(world.size, ("alltoallv", "bcast_row", "bcast_col"), since=snap)
        grids = sorted({tuple(grid) for _, grid, _ in ctx.executor._modes.values()})
    step = next(s for s in planned(eq, make) if s.kind == "contract")
    sig = tuple((sec.irrep, sec.rows, sec.inner, sec.cols) for sec in step.sectors)
    perms = (step.perms["a"], step.perms["b"], step.perms["c"])
    ops = operands({"least": least_pieces()}, step, world.size)
    grid, _ = stationary.summa_grid(sig, perms, 1, ops, world.size)
    old = (*choose_grid(sig, perms[0], perms[1], world.size, 1), 1)

    def received(g):
        recv = stationary.summa_recv(sig, perms, g, ops, world.size)
        return (recv["a"] + recv["b"] + recv["panels"] + recv["c"]).tolist()
    return {"executor_grids": [list(g) for g in grids], "model_grid": list(grid), "old_grid": list(old),
            "counted": world.allgather(int(row.sum() - row[world.rank])), "model": received(grid),
            "model_old": received(old)}


class LeastRecentOut(FrozenCache):
    """The frozen cache's policy before: least recently used out (for comparison)."""

    def get(self, t, key):
        hit = super().get(t, key)
        if hit is not None:                 # now the most recent
            k = (t.uid, t.version, *key)
            self._d[k] = self._d.pop(k)
        return hit

    def put(self, t, key, value, nbytes):
        while t.constant and self.bytes + nbytes > self.limit and self._d:
            self.bytes -= self._d.pop(next(iter(self._d)))[1]
        return super().put(t, key, value, nbytes)


def cyclic_frozen_bytes(world, cycled, planned) -> dict:
    """mpi-collective (summa, modes by cost) running Z_n = T * M_n for three frozen M_n, in
    that order, three times (CCSD's iterations read their frozen operands so), with the
    frozen cache bounded below what the three keep (5/6 of it: the first run's entries at
    the default bound): per contraction of the third run the most bytes a rank's all-to-all
    and broadcast counters record, summed, with the cache keeping what it holds when full
    and with least recently used out; the model's busiest rank per contraction, summed
    (``collective_model.collective_traffic`` at the bound), and the bound."""
    from tessera.backends.collective_model import collective_traffic
    from tessera.backends.iteration_counts import structure_stats

    def contraction(t, n):
        t[f"Z{n}"]["ijab"] = t["T"]["ijcb"] * t[f"M{n}"]["ca"]

    def third_run(limit, cache=FrozenCache):
        """(per contraction, the bytes this rank received in the third run; what its frozen
        cache held after the first run)."""
        with Context("mpi-collective", variant="summa") as ctx:
            if limit is not None:
                ctx.executor.frozen = cache(limit)
            t = cycled(True)
            for run in range(3):
                got = []
                for n in range(3):
                    snap = world.comm_log.snapshot()
                    with ts.equations():
                        contraction(t, n)
                    row = world.comm_log.row(world.size, ("alltoallv", "bcast_row", "bcast_col"), since=snap)
                    got.append(int(row.sum() - row[world.rank]))
                if run == 0:
                    held = ctx.executor.frozen.bytes
            return got, held
    _, total = third_run(None)
    limit = total * 5 // 6
    kept, _ = third_run(limit)
    lru, _ = third_run(limit, LeastRecentOut)
    run = SimpleNamespace(plans=[SimpleNamespace(steps=planned(lambda t: [contraction(t, n) for n in range(3)], cycled))],
                          tensors=[], tiles={})
    s = structure_stats(lambda *_: run, 0, 0, world.size)
    busiest = [np.max(np.array(world.allgather(x)), axis=0) for x in (kept, lru)]
    return {"limit": limit, "frozen_total": total, "counted": int(sum(busiest[0])), "lru": int(sum(busiest[1])),
            "model": collective_traffic(s, world.size, "summa", limit)["bytes_per_rank"],
            "model_unbounded": collective_traffic(s, world.size, "summa", total)["bytes_per_rank"],
            "model_nothing_kept": collective_traffic(s, world.size, "summa", 0)["bytes_per_rank"]}


def held_bytes(world) -> dict:
    """The classes a CCSD run stores (``CCSDStructure.stored``: the integral classes, T2
    and its kin, C1, 5 occupied and 7 virtual orbitals, tile 3) made on mpi-onesided under
    the run's TESSERA_PIECES: each rank's bytes of each (``local_nbytes``), the cost
    model's per rank (``balance.loads``) and the memory estimate's stored bytes of the
    fullest rank (``iteration_counts.structure_stats``: T2 and the integrals) against the ranks'."""
    from tessera.backends.iteration_counts import structure_stats
    from tessera.backends.balance import loads
    from tessera.chem.ccsd import CCSDStructure
    structure = CCSDStructure(np.zeros(12, int), 5, distributed=True)
    out = {"classes": {}}
    with Context("mpi-onesided"):
        stored = structure.stored(3, 3)
        for name, t in stored.items():
            out["classes"][name] = {"counted": world.allgather(t.local_nbytes),
                                    "model": loads(t, world.size).tolist(),
                                    "whole_cut": loads(t, world.size, least=1).tolist()}
        run = structure(3, 3)
        mine = sum(stored[n].local_nbytes for n in [*(t.name for t in run.tensors)])
    out["stored_max"] = {"counted": max(world.allgather(mine)),
                         "model": structure_stats(structure, 3, 3, world.size)["memory_per_rank_max"],
                         "whole_cut": structure_stats(structure, 3, 3, world.size, least_pieces=1)["memory_per_rank_max"]}
    out["names"] = sorted(t.name for t in run.tensors)
    return out


def collective(world) -> dict:
    """Section 4 (``--collective``): the operations on mpi-collective with each operand kept
    stationary (a, b, c) and the grid only (never), and CCSD(T) of water (C2v) and H2O2
    (C1), STO-3G, on mpi-collective summa and 2.5d and on serial (rank 0 alone, shared)."""
    return {"part_bytes": part_bytes(world),
            "operations": {f"mpi-collective/{s}": operations(world, "mpi-collective", "summa", stationary=s)
                           for s in ("a", "b", "c", "never")},
            "energies": {xyz: energies(world, "sto-3g", COLLECTIVE + (("serial", None),), xyz)
                         for xyz in ("water.xyz", "h2o2_distorted.xyz")}}


def main() -> int:
    world = World.get()
    if "--model" in sys.argv:
        result = {"ranks": world.size, "model_bytes": model_bytes(world)}
        if world.rank == 0:
            print(json.dumps(result), flush=True)
        return 0
    if "--collective" in sys.argv:
        result = {"ranks": world.size, **collective(world)}
        if world.rank == 0:
            print(json.dumps(result), flush=True)
        return 0
    result = {"ranks": world.size, "access": access(world), "part_bytes": part_bytes(world),
              "onesided_part_bytes": onesided_part_bytes(world),
              "operations": {f"{b}/{v}": operations(world, b, v) for b, v in OPERATIONS},
              "energies": energies(world, "sto-3g", ONESIDED + COLLECTIVE),
              "energies_631g": energies(world, "6-31g", ONESIDED)}
    if world.rank == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
