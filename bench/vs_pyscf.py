"""Tessera versus PySCF on the same molecule, basis and SCF, in one process.

    .venv/bin/python bench/vs_pyscf.py [examples/benzene.xyz examples/glycine.xyz ...]
        [--basis cc-pvdz] [--backend threads] [--tile 32] [--frozen-core] [--no-triples]

Both codes start from the same PySCF RHF. PySCF: ``cc.CCSD(mf).kernel()`` (its AO->MO
transformation included) then ``ccsd_t()``. Tessera: ``transform`` + CCSD + (T). Prints a
table of wall times per phase and the Tessera/PySCF ratio; writes
bench/results/vs_pyscf.json. Timings are wall-clock on whatever machine runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from pyscf import cc, scf
from threadpoolctl import threadpool_info

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.job import frozen_core_orbitals
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction


def run_pyscf(mol, nfz, conv, triples):
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-11
    mf.kernel()
    t0 = time.perf_counter()
    mycc = cc.CCSD(mf, frozen=nfz or None)
    mycc.conv_tol = conv
    mycc.conv_tol_normt = 1e-6
    mycc.kernel()
    out = {"ccsd": time.perf_counter() - t0, "e_corr": mycc.e_corr, "e_hf": mf.e_tot}
    if triples:
        t0 = time.perf_counter()
        out["e_t"] = mycc.ccsd_t()
        out["triples"] = time.perf_counter() - t0
    return out


def run_tessera(mol, nfz, conv, triples, backend, tile):
    ref = rhf_reference(mol)
    out = {"e_hf": ref.e_hf}
    with Context(backend) as ctx:
        t0 = time.perf_counter()
        ints = transform(ref, nfz, tile)
        out["transform"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = CCSD(conv=conv).kernel(ints, ctx)
        out["ccsd_iterations"] = time.perf_counter() - t0
        out["ccsd"] = out["transform"] + out["ccsd_iterations"]
        out["e_corr"] = res.e_corr
        out["iterations"] = len(res.iterations)
        out["flops_per_iteration"] = res.flops_per_iteration
        out["storage"] = {"t2_stored": res.t2.stored_elements, "t2_dense": res.t2.dense_elements,
                          "integrals_stored": ints.stored_elements, "integrals_dense": ints.dense_elements}
        if triples:
            t0 = time.perf_counter()
            tr = triples_correction(ints, res.t1, res.t2, context=ctx)
            out["triples"] = time.perf_counter() - t0
            out["e_t"] = tr.energy
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("molecules", nargs="*", default=["examples/benzene.xyz", "examples/glycine.xyz"])
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--backend", default="threads")
    ap.add_argument("--tile", type=int, default=32)
    ap.add_argument("--frozen-core", action="store_true")
    ap.add_argument("--no-triples", action="store_true")
    ap.add_argument("--conv", type=float, default=1e-9)
    ap.add_argument("--out", default="bench/results/vs_pyscf.json")
    args = ap.parse_args(argv)
    triples = not args.no_triples
    rows = []
    for path in args.molecules:
        molecule = Molecule.from_xyz(path, basis=args.basis)
        mol = molecule.to_pyscf()
        nfz = frozen_core_orbitals(mol) if args.frozen_core else 0
        p = run_pyscf(mol, nfz, args.conv, triples)
        t = run_tessera(mol, nfz, args.conv, triples, args.backend, args.tile)
        row = {"molecule": path, "point_group": mol.groupname, "nao": mol.nao, "frozen": nfz,
               "pyscf": p, "tessera": t,
               "ratio_ccsd": t["ccsd"] / p["ccsd"],
               "delta_e_corr": t["e_corr"] - p["e_corr"]}
        if triples:
            row["ratio_triples"] = t["triples"] / p["triples"]
            row["ratio_ccsd_t"] = (t["ccsd"] + t["triples"]) / (p["ccsd"] + p["triples"])
            row["delta_e_t"] = t["e_t"] - p["e_t"]
        rows.append(row)
        print(f"\n{path} ({mol.groupname}, {mol.nao} basis functions, frozen {nfz}), backend {args.backend}; "
              "load average (1, 5, 15 min) " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        print(f"{'phase':18s} {'PySCF s':>10s} {'Tessera s':>10s} {'ratio':>7s}")
        print(f"{'CCSD (+transform)':18s} {p['ccsd']:10.2f} {t['ccsd']:10.2f} {row['ratio_ccsd']:7.3f}")
        if triples:
            print(f"{'(T)':18s} {p['triples']:10.2f} {t['triples']:10.2f} {row['ratio_triples']:7.3f}")
            print(f"{'CCSD(T)':18s} {p['ccsd'] + p['triples']:10.2f} {t['ccsd'] + t['triples']:10.2f} "
                  f"{row['ratio_ccsd_t']:7.3f}")
        print(f"  of which Tessera transform {t['transform']:.2f} s, {t['iterations']} CCSD iterations")
        print(f"  dE(corr) = {row['delta_e_corr']:.2e}" + (f", dE(T) = {row['delta_e_t']:.2e}" if triples else ""))
        s = t["storage"]
        print(f"  T2 stored/dense {s['t2_stored']}/{s['t2_dense']} = {s['t2_stored'] / s['t2_dense']:.3f}; "
              f"integrals {s['integrals_stored']}/{s['integrals_dense']} = "
              f"{s['integrals_stored'] / s['integrals_dense']:.3f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cores": os.cpu_count(), "blas": threadpool_info(), "rows": rows}, f, indent=1, default=float)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
