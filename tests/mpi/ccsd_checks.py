"""Distributed CCSD(T) under `mpiexec -n K`: every executor, loop order and schedule
(mpi-collective: operands kept stationary where that costs less, and always the grid).

For each molecule (water 6-31G in C2v, H2O2 distorted to C1 in 6-31G) the RHF reference
is computed once (rank 0, shared); then every combination runs the transform, CCSD for
a fixed number of iterations (``--iters``; the serial backend in the test does the same,
so the energies must agree to rounding) and (T) on those amplitudes, and two
combinations run CCSD to convergence. Rank 0 prints one JSON object with, per run: the
energies, the gets/accumulates/bytes of the contraction steps summed over ranks, the
broadcast bytes per rank (mpi-collective: grid rows and columns, from the step
accounting), the executor's description (grid, layers), the bytes held per rank for T2
and the integrals, and the largest share of a four-index tensor on one rank. tests/test_distributed_mpi.py compares it with the serial backend.
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.job import memory_per_rank
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.errors import ConvergenceError
from tessera.runtime import World

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
MOLECULES = {            # name -> (xyz, basis, tile): tiles small enough for many blocks
    "water": ("water.xyz", "6-31g", 3),
    "h2o2_c1": ("h2o2_distorted.xyz", "6-31g", 8),
}
COMBOS = [("mpi-onesided", v, s) for v in ("original", "inverted", "cached") for s in ("nxtval", "steal")] \
    + [("mpi-onesided", "owner", "nxtval"), ("mpi-collective", "summa", None), ("mpi-collective", "2.5d", None),
       ("mpi-collective", "summa", "stationary=never"), ("mpi-collective", "2.5d", "stationary=never")]
CONVERGED = [("mpi-onesided", "cached", "nxtval"), ("mpi-collective", "summa", None)]


# contraction patterns of the CCSD equations, random tilings and irreps (as tests/test_tensor.py)
PATTERNS = ["kcld,ilcd->ki", "kcld,ld->kc", "kilj->klij", "lckd,ilad->akic", "kc,kica->ia",
            "acbd,ijcd->ijab", "kdac,ijcd->kaij", "akic,kjcb->ijab", "ia,jb->ijab",
            "kdac,kb,ijcd->ijab", "ijab,ijab->ijab", "iajm,mkbc->ijkabc"]


def layer_options(world) -> dict:
    """2.5d with an explicit layer count: every rank its own layer (1 x 1 x P), and the
    errors for a count that does not divide P and for layers with summa."""
    from tessera.errors import InputError
    out = {"explicit": {"variant": "2.5d", "layers": world.size}, "errors": {}}
    for name, opts in (("not_divisor", {"variant": "2.5d", "layers": world.size + 1}),
                       ("summa_layers", {"variant": "summa", "layers": 2})):
        try:
            Context("mpi-collective", **opts).close()
            out["errors"][name] = None
        except InputError as err:
            out["errors"][name] = str(err)
    return out


def tensor_ops(world) -> dict:
    """Max |error| against numpy.einsum per combination (and for 2.5d with P layers, under
    the key ``mpi-collective/2.5d/layers=P``), over the patterns and a batch with
    permutations, division by a denominator, aliasing, dot and norm."""
    from tessera.chem.integrals import denominator
    errors = {}
    extra = [("mpi-collective", "2.5d", f"layers={world.size}")] + \
        [("mpi-collective", "summa", f"stationary={m}") for m in ("a", "b", "c")]
    for backend, variant, schedule in COMBOS + extra:
        ctx = Context(backend, **options(variant, schedule))
        rng = np.random.default_rng(7)
        o = IndexSpace.from_irreps("o", rng.integers(0, 4, 7), 3)
        v = IndexSpace.from_irreps("v", rng.integers(0, 4, 10), 4)
        worst = 0.0
        with ctx:
            for expr in PATTERNS:
                ins = expr.split("->")[0].split(",")
                tens = [BlockTensor.random(tuple(o if c in "ijklm" else v for c in s_), int(rng.integers(0, 4)),
                                           rng=rng, name=s_) for s_ in ins]
                out = ts.einsum(expr, *tens, scale=-0.5)
                ref = -0.5 * np.einsum(expr, *[t.to_dense() for t in tens])
                worst = max(worst, float(np.abs(out.to_dense() - ref).max()) / max(1.0, float(np.abs(ref).max())))
            W = BlockTensor.random((v, v, v, v), 0, rng=rng, name="W")
            tau = BlockTensor.random((o, o, v, v), 0, rng=rng, name="tau")
            eo, ev = rng.random(o.dim) - 2.0, rng.random(v.dim) + 0.5
            D = denominator((o, o, v, v), (eo, eo, ev, ev), (1, 1, -1, -1))
            R = BlockTensor((o, o, v, v), 0, name="R")
            with ts.equations():
                R["ijab"] = 0.5 * W["acbd"] * tau["ijcd"] - tau["jiba"]
                R["ijab"] += R["jiba"]
                R["ijab"] = R["ijab"] / D["ijab"]
            w_, t_ = W.to_dense(), tau.to_dense()
            z = 0.5 * np.einsum("acbd,ijcd->ijab", w_, t_) - t_.transpose(1, 0, 3, 2)
            dd = eo[:, None, None, None] + eo[None, :, None, None] - ev[None, None, :, None] - ev[None, None, None, :]
            ref = (z + z.transpose(1, 0, 3, 2)) / dd
            worst = max(worst, float(np.abs(R.to_dense() - ref).max()) / float(np.abs(ref).max()))
            worst = max(worst, abs(ts.dot(R["ijab"], tau["jiba"]) - float(np.einsum("ijab,jiba", ref, t_)))
                        / abs(float(np.einsum("ijab,jiba", ref, t_))))
            worst = max(worst, abs(R.norm() - float(np.linalg.norm(ref))) / float(np.linalg.norm(ref)))
            # a symmetric result on the packed pairs i <= j (planner: pack, GEMM, unpack_half)
            sym = (ts.PermutationalSymmetry((1, 0, 3, 2)),)
            tauS = BlockTensor((o, o, v, v), 0, name="tauS", symmetry=sym)
            WS = BlockTensor((v,) * 4, 0, name="WS", symmetry=(ts.PermutationalSymmetry((2, 3, 0, 1)),))
            RS = BlockTensor((o, o, v, v), 0, name="RS", symmetry=sym)
            with ts.equations():
                tauS["ijab"] = tau["ijab"] + tau["jiba"]
                WS["acbd"] = W["acbd"] + W["bdac"]
                RS["ijab"] = WS["acbd"] * tauS["ijcd"]
            t_s, w_s = t_ + t_.transpose(1, 0, 3, 2), w_ + w_.transpose(2, 3, 0, 1)
            ref = np.einsum("acbd,ijcd->ijab", w_s, t_s)
            worst = max(worst, float(np.abs(RS.to_dense() - ref).max()) / float(np.abs(ref).max()))
            # a canonical-block operand (one block per orbit, aliases fetched and permuted)
            w8 = w_s + w_s.transpose(1, 0, 2, 3)
            w8 = w8 + w8.transpose(0, 1, 3, 2)
            W8 = BlockTensor.from_dense(w8, (v,) * 4, 0, name="W8", canonical=True, symmetry=tuple(
                ts.PermutationalSymmetry(p) for p in ((1, 0, 2, 3), (0, 1, 3, 2), (2, 3, 0, 1))))
            R8 = BlockTensor((o, o, v, v), 0, name="R8")
            with ts.equations():
                R8["ijab"] = W8["acbd"] * tau["ijcd"] + tau["ijcd"] * W8["cdab"]
            ref = np.einsum("acbd,ijcd->ijab", w8, t_) + np.einsum("ijcd,cdab->ijab", t_, w8)
            worst = max(worst, float(np.abs(R8.to_dense() - ref).max()) / float(np.abs(ref).max()))
            worst = max(worst, float(np.abs(W8.to_dense() - w8).max()) / float(np.abs(w8).max()))
            # canonical targets (T2, tau, residual): canonical blocks written only, by
            # symmetric terms, swapped factors, mirror twins, the packed-pair ladder, a
            # canonical denominator
            t1 = BlockTensor.random((o, v), 0, rng=rng, name="t1")
            TC = BlockTensor.from_dense(t_s, (o, o, v, v), 0, name="TC", symmetry=sym, canonical=True)
            DC = denominator((o, o, v, v), (eo, eo, ev, ev), (1, 1, -1, -1), "DC", sym)
            tauC, RC = (BlockTensor((o, o, v, v), 0, name=n, symmetry=sym, canonical=True) for n in ("tauC", "RC"))
            with ts.equations():
                tauC["ijab"] = TC["ijab"] + t1["ia"] * t1["jb"]
                RC["ijab"] = (WS["acbd"] * tauC["ijcd"] + tau["ijab"] + tau["jiba"]
                              + tau["ikac"] * TC["kjcb"] + TC["ikac"] * tau["jkbc"] - tauC["ijba"])
                RC["ijab"] = RC["ijab"] / DC["ijab"]
            x1 = t1.to_dense()
            tc = t_s + np.einsum("ia,jb->ijab", x1, x1)
            ref = (np.einsum("acbd,ijcd->ijab", w_s, tc) + t_ + t_.transpose(1, 0, 3, 2)
                   + np.einsum("ikac,kjcb->ijab", t_, t_s) + np.einsum("ikac,jkbc->ijab", t_s, t_)
                   - tc.transpose(0, 1, 3, 2)) / dd
            worst = max(worst, float(np.abs(RC.to_dense() - ref).max()) / float(np.abs(ref).max()))
            worst = max(worst, float(np.abs(tauC.to_dense() - tc).max()) / float(np.abs(tc).max()))
            if RC.stored_elements >= RC.dense_elements:
                worst = float("inf")
        ctx.close()
        errors[f"{backend}/{variant}/{schedule}"] = worst
    return errors


def reference(world, name):
    xyz, basis, _ = MOLECULES[name]
    mol = Molecule.from_xyz(str(EXAMPLES / xyz), basis=basis).to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    shared = world.bcast(None if ref is None else replace(ref, mol=None), root=0)
    return replace(shared, mol=mol)


def options(variant, schedule) -> dict:
    """Context options of a combination: its third field is a schedule, None, or an
    executor option ``name=value`` (mpi-collective's layers or stationary)."""
    if schedule is None:
        return {"variant": variant}
    if "=" in schedule:
        name, value = schedule.split("=")
        return {"variant": variant, name: int(value) if value.isdigit() else value}
    return {"variant": variant, "schedule": schedule}


def one_run(world, ref, tile, backend, variant, schedule, iters, conv):
    ctx = Context(backend, **options(variant, schedule))
    t0 = time.perf_counter()
    try:
        with ctx:
            ints = transform(ref, 0, tile)
            try:
                cc = CCSD(conv=conv, max_iter=iters).kernel(ints, ctx)
            except ConvergenceError as err:
                cc = err.result
            snap = world.comm_log.snapshot()
            tr = triples_correction(ints, cc.t1, cc.t2, context=ctx)
            share = max(t.local_nbytes / t.nbytes for t in [cc.t2, *ints.tensors.values()])
            mem = memory_per_rank(ctx, cc.t2, ints)
            comm = ctx.executor.account.summary()
            executor = ctx.executor.describe()
            onesided_in_triples = sum(r.count for r in world.comm_log.records(since=snap)
                                      if r.op in ("get", "acc", "put"))
            onesided_in_triples = world.allreduce(onesided_in_triples, "sum")
    finally:
        ctx.close()
    out = {"e_ccsd": cc.e_corr, "e_t": tr.energy, "iterations": len(cc.iterations),
           "converged": cc.converged, "seconds": time.perf_counter() - t0,
           "memory_max_over_mean": mem["max_over_mean"], "memory_total": mem["total"],
           "largest_share": world.allreduce(share, "max"),
           "triples_onesided_ops": onesided_in_triples}
    if comm is not None:
        # the equations' terms (task sets, (T) and the transform, are accounted beside them)
        contract = [r for r in comm["per_term"] if not r["update"].startswith(("(T)", "transform:"))]
        out["gets"] = sum(r["gets"] for r in contract)
        out["accs"] = sum(r["accs"] for r in contract)
        out["bytes_moved"] = sum(r["bytes_moved"] for r in contract)
        out["collective_bytes"] = sum(c["bytes"] for r in contract for c in r["collectives"].values())
        out["per_term_fields"] = sorted(comm["per_term"][0]) if comm["per_term"] else []
        # broadcast bytes (grid rows and columns) per rank, from the step accounting
        out["bcast_bytes_per_rank"] = [sum(c["bytes"] for op, c in r["collectives"].items()
                                           if op in ("bcast_row", "bcast_col")) for r in comm["per_rank"]]
        out["bcast_bytes_per_term"] = sum(c["bytes"] for r in contract for op, c in r["collectives"].items()
                                          if op in ("bcast_row", "bcast_col"))
        out["executor"] = executor
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--conv", type=float, default=1e-9)
    p.add_argument("--molecules", default=",".join(MOLECULES))
    p.add_argument("--no-converged", action="store_true", help="skip the runs to convergence")
    args = p.parse_args()
    world = World.get()
    runs = {}
    t_start = time.perf_counter()
    ops = tensor_ops(world)
    layers = layer_options(world)
    for name in args.molecules.split(","):
        ref = reference(world, name)
        tile = MOLECULES[name][2]
        runs[f"{name}/hf"] = {"e_hf": ref.e_hf}
        for backend, variant, schedule in COMBOS:
            key = f"{name}/{backend}/{variant}/{schedule}"
            runs[key] = one_run(world, ref, tile, backend, variant, schedule, args.iters, 1e-14)
        for backend, variant, schedule in ([] if args.no_converged else CONVERGED):
            key = f"{name}/{backend}/{variant}/{schedule}/converged"
            runs[key] = one_run(world, ref, tile, backend, variant, schedule, 60, args.conv)
    if world.rank == 0:
        print(json.dumps({"nranks": world.size, "runs": runs, "tensor_ops": ops, "layer_options": layers,
                          "seconds": time.perf_counter() - t_start}),
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
