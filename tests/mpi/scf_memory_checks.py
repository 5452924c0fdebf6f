"""Tessera's RHF under `mpiexec -n K` and its memory budget: mode auto keeps each rank's
share of the 8-fold integrals (water: C2v, the symmetry-unique quartets of the rank's
shell pairs; C1: the identity's) when it fits the budget per rank and is direct
otherwise (with the log line saying which); mode incore over budget is an error; the
bytes each rank keeps are the share predicted before the SCF and counted by the memory
estimate. Rank 0 prints one JSON object; tests/test_scf_memory_mpi.py checks it against
PySCF.
"""

import json
import logging

from tessera.backends.context import Context
from tessera.chem.memory import RunShape, estimate, resident_peak
from tessera.chem.scf import driver, rhf
from tessera.chem.scf.integrals import s8_shares

from scf_checks import build, error_of


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def run(ctx, mol, **kw):
    log = logging.getLogger("tessera.chem.scf.driver")
    lines = Lines()
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    try:
        ref = rhf(mol, context=ctx, **kw)
    finally:
        log.removeHandler(lines)
    return {"e_hf": ref.e_hf, "mode": ref.info["mode"], "log": lines.lines,
            "kept": [r["incore_bytes"] for r in ref.info["per_rank"]]}


def main():
    ctx = Context("mpi-onesided")
    size = ctx.ranks.size
    mol = build("water")
    with ctx:
        out = {"nranks": size, "auto": run(ctx, mol, schedule="static"), "auto_steal": run(ctx, mol)}
        # a budget of what the rank already holds leaves no room for any integral
        held = max(ctx.ranks.allgather(resident_peak())) / 2**20
        out["auto_no_room"] = run(ctx, mol, max_memory=held)
        out["incore_no_room"] = error_of(lambda: rhf(mol, context=ctx, mode="incore", max_memory=held))
        # C1: the identity's representatives, each rank's share counted (no Fock builder, no
        # integral, before the choice); without room direct from every quartet (identity)
        c1 = build("h2o2_c1")
        out["c1_shares"] = s8_shares(c1, size, ctx.ranks).tolist()
        made = driver.FockBuilder
        driver.FockBuilder = None           # the choice must not build one
        try:
            out["c1_auto"] = run(ctx, c1, schedule="static")
            out["c1_auto_no_room"] = run(ctx, c1, max_memory=held)
        finally:
            driver.FockBuilder = made
    ctx.close()
    if ctx.ranks.rank == 0:
        out["shares"] = s8_shares(mol, size).tolist()       # C2v: each rank its shell pairs
        shape = RunShape(mol, "hf", "mpi-onesided", None, size, 32, None, 0, True, scf_mode="auto")
        out["estimate_scf"] = estimate(shape).parts["scf"]
        out["estimate_scf_no_room"] = estimate(shape.but(budget=held * 2**20)).parts["scf"]
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
