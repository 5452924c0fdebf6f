"""Tessera versus PySCF on the same molecule, basis and SCF.

    .venv/bin/python bench/vs_pyscf.py [examples/benzene.xyz examples/glycine.xyz ...]
        [--basis cc-pvdz] [--backend threads] [--tile 32] [--frozen-core] [--no-triples]
        [--repeat 2]

Both codes start from the same PySCF RHF (not timed), and from its in-memory AO
integrals (``mf._eri``), as each code's own SCF hands them on. PySCF: ``cc.CCSD(mf).kernel()``
(its AO->MO transformation included) then ``ccsd_t()``. Tessera: ``transform`` + CCSD +
(T). Each code runs in a process of its own (so each has its own peak resident memory),
alternating PySCF, Tessera, PySCF, Tessera, ... ``--repeat`` times; the best time of
each phase is kept. Both converge CCSD alike: energy change below ``--conv`` and
amplitude change norm below 100 x ``--conv`` (PySCF's norm counts each T2 pair once,
ours both halves); both iteration counts are printed. Prints wall times per phase, the
Tessera/PySCF ratio, the machine's load, the flops Tessera executed per CCSD iteration
against the minimal count and GFLOP/s against a DGEMM peak measured in the same run, and
the peak resident memory, user and system CPU seconds and minor page faults of each
process (a machine whose first touch of memory is slow shows it in the last two); writes bench/results/vs_pyscf.json. No assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from pyscf import cc, scf
from threadpoolctl import threadpool_info

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD, minimal_flops
from tessera.chem.integrals import transform
from tessera.chem.job import frozen_core_orbitals
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction

from common import dgemm_peak


def run_pyscf(mol, nfz, conv, triples):
    mf = scf.RHF(mol)
    mf.conv_tol = 1e-11
    mf.kernel()
    t0 = time.perf_counter()
    mycc = cc.CCSD(mf, frozen=nfz or None)
    mycc.conv_tol = conv
    mycc.conv_tol_normt = 100 * conv    # Tessera's residual test (and PySCF's defaults' ratio)
    mycc.kernel()
    out = {"ccsd": time.perf_counter() - t0, "e_corr": mycc.e_corr, "e_hf": mf.e_tot, "iterations": mycc.cycles}
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
        out["minimal_flops_per_iteration"] = minimal_flops(ints.o, ints.v)
        out["ccsd_gflops_per_s"] = res.flops_per_iteration * len(res.iterations) / out["ccsd_iterations"] / 1e9
        out["storage"] = {"t2_stored": res.t2.stored_elements, "t2_dense": res.t2.dense_elements,
                          "integrals_stored": ints.stored_elements, "integrals_dense": ints.dense_elements}
        if triples:
            t0 = time.perf_counter()
            tr = triples_correction(ints, res.t1, res.t2, context=ctx)
            out["triples"] = time.perf_counter() - t0
            out["e_t"] = tr.energy
            out["triples_gflops_per_s"] = tr.flops / out["triples"] / 1e9
    return out


def one(code, path, args) -> dict:
    """One code on one molecule in this process; adds its peak resident memory (MiB)."""
    mol = Molecule.from_xyz(path, basis=args.basis).to_pyscf()
    nfz = frozen_core_orbitals(mol) if args.frozen_core else 0
    triples = not args.no_triples
    out = (run_pyscf(mol, nfz, args.conv, triples) if code == "pyscf"
           else run_tessera(mol, nfz, args.conv, triples, args.backend, args.tile))
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["peak_rss_mib"] = me.ru_maxrss / 1024
    # the whole process's CPU (its forked (T) workers included): a machine whose first
    # touch of memory is slow shows it in system seconds and minor faults, not user seconds
    out["user_s"], out["sys_s"] = me.ru_utime + kids.ru_utime, me.ru_stime + kids.ru_stime
    out["minor_faults"] = me.ru_minflt + kids.ru_minflt
    return out


def best_of(runs: list) -> dict:
    """Each timing the best over the runs (energies and counts from the first; the process's
    CPU seconds and faults from the run with the least CCSD + (T) wall time)."""
    out = dict(runs[0])
    fastest = min(runs, key=lambda r: r["ccsd"] + r.get("triples", 0.0))
    out.update({k: fastest[k] for k in ("user_s", "sys_s", "minor_faults")})
    for key in ("ccsd", "triples", "transform", "ccsd_iterations", "peak_rss_mib"):
        if key in out:
            out[key] = min(r[key] for r in runs)
    for key in ("ccsd_gflops_per_s", "triples_gflops_per_s"):
        if key in out:
            out[key] = max(r[key] for r in runs)
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
    ap.add_argument("--repeat", type=int, default=2, help="alternating repetitions (best kept)")
    ap.add_argument("--one", choices=("pyscf", "tessera"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:                         # a child: one code, one molecule, JSON on stdout
        print(json.dumps(one(args.one, args.molecules[0], args), default=float))
        return 0
    triples = not args.no_triples
    peak = dgemm_peak()[0]
    print(f"DGEMM peak (order 3000, all BLAS threads): {peak:.1f} GFLOP/s")
    rows = []
    for path in args.molecules:
        mol = Molecule.from_xyz(path, basis=args.basis).to_pyscf()
        nfz = frozen_core_orbitals(mol) if args.frozen_core else 0
        runs: dict = {"pyscf": [], "tessera": []}
        child = [sys.executable, os.path.abspath(__file__), path, "--basis", args.basis, "--backend", args.backend,
                 "--tile", str(args.tile), "--conv", str(args.conv)] + \
            (["--frozen-core"] if args.frozen_core else []) + (["--no-triples"] if args.no_triples else [])
        for _ in range(args.repeat):
            for code in ("pyscf", "tessera"):
                done = subprocess.run(child + ["--one", code], capture_output=True, text=True, check=True)
                runs[code].append(json.loads(done.stdout.strip().splitlines()[-1]))
        p, t = best_of(runs["pyscf"]), best_of(runs["tessera"])
        row = {"molecule": path, "point_group": mol.groupname, "nao": mol.nao, "frozen": nfz,
               "pyscf": p, "tessera": t, "repeat": args.repeat, "dgemm_peak_gflops_per_s": peak,
               "load_average": os.getloadavg(),
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
        print(f"  of which Tessera transform {t['transform']:.2f} s; CCSD iterations: Tessera {t['iterations']}, "
              f"PySCF {p['iterations']}")
        print(f"  dE(corr) = {row['delta_e_corr']:.2e}" + (f", dE(T) = {row['delta_e_t']:.2e}" if triples else ""))
        print(f"  CCSD flops/iteration {t['flops_per_iteration']:.3e} = "
              f"{t['flops_per_iteration'] / t['minimal_flops_per_iteration']:.2f} x minimal "
              f"{t['minimal_flops_per_iteration']:.3e}; CCSD {t['ccsd_gflops_per_s']:.1f} GFLOP/s"
              + (f", (T) {t['triples_gflops_per_s']:.1f} GFLOP/s" if triples else "")
              + f" (DGEMM peak {peak:.1f})")
        print(f"  peak resident memory: PySCF {p['peak_rss_mib']:.0f} MiB, Tessera {t['peak_rss_mib']:.0f} MiB; "
              f"best of {args.repeat} alternating runs")
        print(f"  whole-process CPU user/sys: PySCF {p['user_s']:.1f}/{p['sys_s']:.1f} s, Tessera "
              f"{t['user_s']:.1f}/{t['sys_s']:.1f} s (user ratio {t['user_s'] / p['user_s']:.3f}); minor faults "
              f"PySCF {p['minor_faults']:.3g}, Tessera {t['minor_faults']:.3g}")
        s = t["storage"]
        print(f"  T2 stored/dense {s['t2_stored']}/{s['t2_dense']} = {s['t2_stored'] / s['t2_dense']:.3f}; "
              f"integrals {s['integrals_stored']}/{s['integrals_dense']} = "
              f"{s['integrals_stored'] / s['integrals_dense']:.3f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"cores": os.cpu_count(), "blas": threadpool_info(), "dgemm_peak_gflops_per_s": peak,
                   "rows": rows}, f, indent=1, default=float)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
