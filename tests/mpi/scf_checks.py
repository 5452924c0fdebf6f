"""Tessera's RHF under `mpiexec -n K`: every test molecule with every schedule, the
symmetric ones also in memory (the 8-fold skeleton build over the ranks), plus
(with --extras) screening off/on, incore mode and the non-convergence error (the
memory budget: scf_memory_checks.py).  Rank 0 prints one JSON object; tests/test_scf_mpi.py compares it
with PySCF computed in the test.  Every rank checks that it returns the same Reference.
"""

import argparse
import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
from pyscf import gto

from tessera.backends.context import Context
from tessera.chem.scf import rhf
from tessera.chem.scf.incore import IncoreFock
from tessera.errors import TesseraError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# name -> (xyz file, basis, symmetry)
MOLECULES = {
    "water": ("water.xyz", "6-31g", True),
    "n2": ("n2.xyz", "6-31g", "D2h"),
    "benzene": ("benzene.xyz", "sto-3g", True),
    "h2o2_c1": ("h2o2_distorted.xyz", "6-31g", True),
}
SCHEDULES = ("static", "nxtval", "steal")


def build(name):
    xyz, basis, symmetry = MOLECULES[name]
    atoms = "".join((EXAMPLES / xyz).read_text().splitlines(True)[2:])
    return gto.M(atom=atoms, basis=basis, symmetry=symmetry, verbose=0)


def fingerprint(ref):
    h = hashlib.sha256()
    for a in (np.float64(ref.e_hf), ref.mo_coeff, ref.mo_energy, ref.orbsym):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def summary(ctx, ref, seconds):
    return {
        "e_hf": ref.e_hf, "e_nuc": ref.e_nuc, "iterations": ref.iterations,
        "converged": ref.converged, "source": ref.source, "nocc": ref.nocc,
        "point_group": ref.point_group,
        "irrep_names": {str(k): v for k, v in ref.irrep_names.items()},
        "mo_energy": ref.mo_energy.tolist(), "orbsym": ref.orbsym.tolist(),
        "same_on_all_ranks": len(set(ctx.ranks.allgather(fingerprint(ref)))) == 1,
        "seconds": seconds,
        **{k: ref.info.get(k) for k in ("schedule", "mode", "screening", "nranks", "imbalance",
                                    "busy_s", "tasks_executed", "tasks_stolen", "steals",
                                    "counter_ops", "shell_quartets",
                                    "shell_quartets_skipped", "block_quartets_skipped",
                                    "tasks_total", "fock_builds", "tasks_per_build",
                                    "incremental_builds", "threads")},
    }


def run(ctx, name, **kw):
    t0 = time.perf_counter()
    ref = rhf(build(name), context=ctx, **kw)
    return summary(ctx, ref, time.perf_counter() - t0)


def slowed_rank(ctx):
    """The in-memory build's integral tasks with the last rank slowed (a sleep before each
    of its ranges): its shell pairs kept per rank, static and steal."""
    from tessera.chem.scf import integrals
    part = integrals.ShellPairQuartets.part

    def slow(self, *args, **kw):
        time.sleep(0.05)
        return part(self, *args, **kw)
    out = {}
    for schedule in ("static", "steal"):
        if ctx.ranks.rank == ctx.ranks.size - 1:
            integrals.ShellPairQuartets.part = slow
        try:
            ref = rhf(build("h2o2_c1"), context=ctx, mode="incore", schedule=schedule)
        finally:
            integrals.ShellPairQuartets.part = part
        out[schedule] = {"e_hf": ref.e_hf, **{k: [r.get(k) for r in ref.info["per_rank"]] for k in (
            "integral_tasks", "integral_pairs_kept", "integral_pairs_recomputed", "integral_tasks_stolen")}}
    return out


def error_of(fn):
    try:
        fn()
    except TesseraError as exc:
        return {"type": type(exc).__name__, "message": str(exc),
                "result_e_hf": getattr(getattr(exc, "result", None), "e_hf", None)}
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--extras", action="store_true")
    args = ap.parse_args()
    ctx = Context("mpi-onesided")
    with ctx:
        out = checks(ctx, args.extras)
    ctx.close()
    if ctx.ranks.rank == 0:
        print(json.dumps(out), flush=True)


def checks(ctx, extras):
    size = ctx.ranks.size
    out = {"nranks": size, "runs": {}}
    for name in MOLECULES:
        for schedule in SCHEDULES:
            out["runs"][f"{name}/{schedule}"] = run(ctx, name, schedule=schedule, mode="direct")
    # in memory: the representatives computed as a task set dealt by each schedule, each
    # rank keeping those it computed (the 8-fold skeleton with a point group; C1: identity)
    out["incore"] = {f"{name}/{schedule}": run(ctx, name, mode="incore", schedule=schedule)
                     for name in MOLECULES
                     for schedule in (SCHEDULES if name in ("benzene", "h2o2_c1") else ("steal",))}
    # one build of it: G of an invariant density; a density the group changes is refused
    fock = IncoreFock(build("water"), 1, ctx)
    d = np.random.default_rng(7).random((fock.skeleton.nao,) * 2)
    d = fock.skeleton.symmetrize(d + d.T)
    out["incore_build"] = {"dm": d.tolist(), "g": fock.build(d).tolist(),
                           "refused": error_of(lambda: fock.build(d + np.eye(len(d))[::-1]))}
    # a budget with no room: every range computed anew in each build, none kept
    said, log = [], logging.getLogger("tessera.chem.scf.incore")
    handler = logging.Handler()
    handler.emit = said.append
    log.addHandler(handler)
    bare = IncoreFock(build("water"), 1, ctx, budget=0.0)
    log.removeHandler(handler)
    out["incore_build"]["no_room"] = {"g": bare.build(d).tolist(), **bare.history[-1],
                                      "warned": [r.getMessage() for r in said]}
    if extras:
        out["benzene_no_screening"] = run(ctx, "benzene", schedule="steal", screening=0.0,
                                          mode="direct")
        out["water_auto"] = run(ctx, "water", schedule="steal")
        out["water_incore"] = {s: run(ctx, "water", schedule=s, mode="incore")
                               for s in SCHEDULES}
        # without one (C1): the identity's representatives
        out["c1_incore"] = {s: run(ctx, "h2o2_c1", schedule=s, mode="incore")
                            for s in SCHEDULES}
        out["slowed_rank"] = slowed_rank(ctx)
        out["convergence_error"] = error_of(
            lambda: rhf(build("n2"), context=ctx, max_iter=3))
    return out


if __name__ == "__main__":
    main()
