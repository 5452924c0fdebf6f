"""Distributed CCSD(T): scaling of the MPI executors, communication counts, and peers.

    .venv/bin/python bench/scaling.py scaling [--molecule examples/water_trimer.xyz]
    .venv/bin/python bench/scaling.py counts  [--molecules trimer,tetramer] [--ranks 2,4]
    .venv/bin/python bench/scaling.py peers   [--molecules trimer,tetramer] [--basis cc-pvdz] [--repeat 2]
    .venv/bin/python bench/scaling.py all

scaling: the same molecule (CCSD(T), cc-pVDZ) with the serial backend, then at 1 and 2
  ranks for each executor (mpi-onesided cached/nxtval, mpi-collective summa and 2.5d); wall time,
  speedup over the same executor at 1 rank, computational efficiency
  E = T_compute / (T_total x ranks) (T_compute: block arithmetic summed over ranks;
  T_total: wall time of CCSD + (T)), bytes moved per rank; then 4 ranks (on this
  2-core machine: oversubscribed, so for the communication counts, not the speed).
counts: per loop order (original, inverted, cached; nxtval) and mpi-collective (summa,
  2.5d), two CCSD iterations of water trimer and tetramer (cc-pVDZ) at 2 and 4 ranks:
  gets, accumulates, bytes moved (one-sided and collective), summed over ranks.
peers: CCSD(T) of Tessera at 2 ranks (auto), NWChem's TCE at 2 ranks (``mpirun -np 2``,
  Debian package nwchem, its TCE defaults: see bench/nwchem/nwchem_tce.py; the script says
  what is missing when it is absent) and PySCF (2 threads), alternating Tessera, NWChem,
  PySCF, ... --repeat times (default 2), best time per phase (SCF, transform, CCSD, (T),
  whole process); the energies of the three and whether they agree to 1e-6 Eh; the flops
  Tessera executed per CCSD iteration and in (T) (its JSON) against the minimal counts;
  Tessera's GFLOP/s against a DGEMM peak measured in the same run, and every code's
  minimal flops over its own time; `uptime` before and after. The issue's table:
      .venv/bin/python bench/scaling.py peers --molecules tetramer_c1
  (water tetramer, examples/water_tetramer_c1.xyz: C1, 96 cc-pVDZ functions).

Every process runs with the BLAS kernels its CPU supports (`common.blas_coretype`).
Never an assertion on time: numbers go to bench/results/scaling.json and to tables on
stdout. Timings on a shared 2-core machine are noisy: see the recorded load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench" / "nwchem"))
from common import blas_kernels, dgemm_peak, table, uptime  # noqa: E402  (first: BLAS kernels)
import nwchem_tce  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = REPO / "bench" / "results" / "scaling.json"
MOLECULES = {"water": "examples/water.xyz", "trimer": "examples/water_trimer.xyz",
             "tetramer": "examples/water_tetramer.xyz", "tetramer_c1": "examples/water_tetramer_c1.xyz"}
NWCHEM_SYMMETRY = {"trimer": None, "tetramer": "c2", "water": "c2v"}   # Tessera's Abelian groups
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "100"}
EXECUTORS = [("mpi-onesided cached", "mpi-onesided", ["--variant", "cached", "--schedule", "nxtval"]),
             ("mpi-collective summa", "mpi-collective", ["--variant", "summa"]),
             ("mpi-collective 2.5d", "mpi-collective", ["--variant", "2.5d"])]


def load() -> float:
    return os.getloadavg()[0]


def tessera(xyz: str, nranks: int | None, args: list, timeout: float = 7200, basis: str = "cc-pvdz") -> dict:
    """One `tessera run` (under mpiexec -n nranks unless None); its JSON plus wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [str(BIN / "tessera"), "run", xyz, "--basis", basis, "--json", str(out), *args]
        if nranks is not None:
            cmd = [str(BIN / "mpiexec"), "-n", str(nranks), *cmd]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout,
                              env=dict(os.environ, **ENV))
        wall = time.perf_counter() - t0
        if not out.exists():
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        data = json.loads(out.read_text())
    data["wall_seconds"] = wall
    data["command"] = " ".join(cmd)
    data["load_average"] = load()
    return data


def efficiency(d: dict) -> dict:
    ranks = d.get("ranks", 1)
    t_total = d["timings"].get("ccsd", 0.0) + d["timings"].get("triples", 0.0)
    comm = d.get("communication")
    out = {"ranks": ranks, "wall": d["wall_seconds"], "ccsd+triples": t_total,
           "energy_total": d["energies"]["total"]}
    if comm:
        t_compute = sum(r["compute_seconds"] for r in comm["per_rank"])
        out["T_compute"] = t_compute
        out["E"] = t_compute / (t_total * ranks) if t_total else None
        out["bytes_moved_per_rank"] = [r["bytes_moved"] for r in comm["per_rank"]]
    return out


def scaling(args) -> dict:
    xyz = MOLECULES.get(args.molecule, args.molecule)
    rows = {}
    base = tessera(xyz, None, ["--backend", "serial", "--method", "ccsd(t)"])
    rows["serial"] = efficiency(base)
    print(f"serial: {base['wall_seconds']:.1f} s (load {base['load_average']:.1f})", flush=True)
    for label, backend, extra in EXECUTORS:
        for n in (1, 2, 4):
            d = tessera(xyz, n, ["--backend", backend, "--method", "ccsd(t)", *extra])
            rows[f"{label}/{n}"] = efficiency(d)
            rows[f"{label}/{n}"]["tile"] = d["tile"]
            print(f"{label} x{n}: {d['wall_seconds']:.1f} s (load {d['load_average']:.1f})", flush=True)
    for label, _, _ in EXECUTORS:
        t1 = rows[f"{label}/1"]["ccsd+triples"]
        for n in (1, 2, 4):
            r = rows[f"{label}/{n}"]
            r["speedup"] = t1 / r["ccsd+triples"] if r["ccsd+triples"] else None
    print(f"\nScaling, {xyz} cc-pVDZ CCSD(T) (speedup and E over CCSD+(T); 4 ranks oversubscribed on "
          f"{os.cpu_count()} cores)")
    print(f"{'run':22s} {'wall s':>8s} {'CCSD+(T) s':>10s} {'speedup':>8s} {'E':>6s} {'MiB moved/rank':>16s}")
    for k, r in rows.items():
        moved = "/".join(f"{b / 2**20:.0f}" for b in r.get("bytes_moved_per_rank", [])) or "-"
        sp = f"{r['speedup']:.2f}" if r.get("speedup") else "-"
        e = f"{r['E']:.2f}" if r.get("E") is not None else "-"
        print(f"{k:22s} {r['wall']:8.1f} {r['ccsd+triples']:10.1f} {sp:>8s} {e:>6s} {moved:>16s}")
    return {"molecule": xyz, "rows": rows}


def counts(args) -> dict:
    table = []
    for name in args.molecules.split(","):
        xyz = MOLECULES.get(name, name)
        for n in [int(x) for x in args.ranks.split(",")]:
            for backend, variant in [("mpi-onesided", "original"), ("mpi-onesided", "inverted"),
                                     ("mpi-onesided", "cached"), ("mpi-collective", "summa"),
                                     ("mpi-collective", "2.5d")]:
                extra = ["--variant", variant] + (["--schedule", "nxtval"] if backend == "mpi-onesided" else [])
                d = tessera(xyz, n, ["--backend", backend, "--method", "ccsd", "--max-iter", "2",
                                     "--tile", str(args.tile), *extra])
                c = d["communication"]
                ccsd_terms = [r for r in c["per_term"] if r["update"] != "(T) triples"]
                row = {"molecule": name, "ranks": n, "backend": backend, "variant": variant, "tile": d["tile"],
                       "iterations": len(d["iterations"]),
                       "gets": sum(r["gets"] for r in ccsd_terms), "accs": sum(r["accs"] for r in ccsd_terms),
                       "get_MiB": sum(r["get_bytes"] for r in ccsd_terms) / 2**20,
                       "acc_MiB": sum(r["acc_bytes"] for r in ccsd_terms) / 2**20,
                       "collective_MiB": sum(x["bytes"] for r in ccsd_terms for x in r["collectives"].values()) / 2**20,
                       "moved_MiB": sum(r["bytes_moved"] for r in ccsd_terms) / 2**20,
                       "counter_ops": sum(r["counter_ops"] for r in ccsd_terms),
                       "memory_max_over_mean": d.get("memory_per_rank", {}).get("max_over_mean"),
                       "wall": d["wall_seconds"]}
                table.append(row)
                print(f"{name} x{n} {backend} {variant}: gets {row['gets']} accs {row['accs']} "
                      f"moved {row['moved_MiB']:.1f} MiB", flush=True)
    print(f"\nCommunication of 2 CCSD iterations (cc-pVDZ, tile {args.tile}), summed over ranks")
    print(f"{'molecule':9s} {'ranks':>5s} {'executor':15s} {'variant':9s} {'gets':>8s} {'accs':>8s} "
          f"{'get MiB':>9s} {'acc MiB':>9s} {'coll. MiB':>9s} {'moved MiB':>9s} {'mem max/mean':>12s}")
    for r in table:
        print(f"{r['molecule']:9s} {r['ranks']:5d} {r['backend']:15s} {r['variant']:9s} {r['gets']:8d} "
              f"{r['accs']:8d} {r['get_MiB']:9.1f} {r['acc_MiB']:9.1f} {r['collective_MiB']:9.1f} "
              f"{r['moved_MiB']:9.1f} {r['memory_max_over_mean']:12.2f}")
    return {"tile": args.tile, "rows": table}


def pyscf_ccsd_t(xyz: str, threads: int = 2, basis: str = "cc-pvdz") -> dict:
    """PySCF RHF + AO->MO + CCSD + (T) in a subprocess with ``threads`` OpenMP threads."""
    code = f"""
import json, time
from pyscf import gto, scf, cc
lines = open({xyz!r}).read().splitlines()
atoms = "\\n".join(lines[2:2 + int(lines[0].split()[0])])
t0 = time.perf_counter()
mol = gto.M(atom=atoms, basis={basis!r}, symmetry=True, verbose=0)
mf = scf.RHF(mol); mf.conv_tol = 1e-10; mf.kernel()
t1 = time.perf_counter()
mycc = cc.CCSD(mf); mycc.conv_tol = 1e-8
eris = mycc.ao2mo()
t2 = time.perf_counter()
mycc.kernel(eris=eris)
t3 = time.perf_counter()
et = mycc.ccsd_t(eris=eris)
t4 = time.perf_counter()
print(json.dumps({{"e_hf": mf.e_tot, "e_ccsd_corr": mycc.e_corr, "e_t": et, "iterations": mycc.cycles,
                  "scf": t1 - t0, "transform": t2 - t1, "ccsd": t3 - t2, "triples": t4 - t3,
                  "total": t4 - t0}}))
"""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=7200)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = time.perf_counter() - t0
    out["threads"] = threads
    out["load_average"] = load()
    return out


PHASES = ("scf", "transform", "ccsd", "triples")


def peers(args) -> dict:
    """Tessera (2 ranks, auto), NWChem TCE (2 ranks) and PySCF (2 threads) on each molecule,
    alternating Tessera, NWChem, PySCF, ... ``--repeat`` times; the best time of each phase."""
    why = nwchem_tce.missing()
    if why:
        print(f"NWChem: {why}; measuring Tessera and PySCF only", flush=True)
    earlier = {}
    for item in args.nwchem_json or []:       # name=file.json from bench/nwchem/nwchem_tce.py
        name, path = item.split("=", 1)
        earlier[name] = json.loads(Path(path).read_text())
        earlier[name]["measured_separately"] = path
    rows = {}
    for name in args.molecules.split(","):
        xyz = MOLECULES.get(name, name)
        before = uptime()
        peak = dgemm_peak()[0]
        runs: dict = {"tessera": [], "nwchem": [], "pyscf": []}
        for rep in range(args.repeat):
            t = tessera(xyz, 2, ["--method", "ccsd(t)"], basis=args.basis)
            runs["tessera"].append({**{k: t["timings"].get(k) for k in PHASES}, "total": t["wall_seconds"],
                                    "e_hf": t["energies"]["hf"], "e_ccsd": t["energies"]["hf"]
                                    + t["energies"]["ccsd_correlation"], "e_ccsd_t": t["energies"]["total"],
                                    "iterations": len(t["iterations"]), "flops": t["flops"],
                                    "backend": t["backend"], "variant": t.get("variant"), "tile": t["tile"],
                                    "load_average": t["load_average"]})
            if name in earlier or not why:
                nw = earlier.get(name) or nwchem_tce.run(str(REPO / xyz), args.basis, 2,
                                                          NWCHEM_SYMMETRY.get(name),
                                                          memory_mb=args.nwchem_memory)
                if nw.get("returncode", 0) != 0 or nw.get("e_ccsd_t_total") is None:
                    sys.exit(f"error: NWChem failed ({nw.get('command')}); its output is kept with --keep")
                runs["nwchem"].append({**{k: nw.get(k) for k in PHASES}, "total": nw["wall_seconds"],
                                       "e_hf": nw["e_hf"], "e_ccsd": nw["e_ccsd_total"],
                                       "e_ccsd_t": nw["e_ccsd_t_total"], "iterations": nw.get("iterations"),
                                       "tile_dim": nw.get("tile_dim"), "load_average": load()})
            p = pyscf_ccsd_t(str(REPO / xyz), basis=args.basis)
            runs["pyscf"].append({**{k: p[k] for k in PHASES}, "total": p["wall_seconds"], "e_hf": p["e_hf"],
                                  "e_ccsd": p["e_hf"] + p["e_ccsd_corr"],
                                  "e_ccsd_t": p["e_hf"] + p["e_ccsd_corr"] + p["e_t"],
                                  "iterations": p["iterations"], "load_average": p["load_average"]})
            print(f"{name} repetition {rep + 1}: " + ", ".join(
                f"{code} {r[-1]['total']:.1f} s" for code, r in runs.items() if r), flush=True)
        best = {code: _best(r) for code, r in runs.items() if r}
        row = {"molecule": xyz, "basis": args.basis, "repeat": args.repeat, "dgemm_peak_gflops_per_s": peak,
               "uptime_before": before, "uptime_after": uptime(),
               "blas_kernels": blas_kernels(), "best": best, "runs": runs}
        rows[name] = row
        print(peers_text(name, row))
    return {"rows": rows, "nwchem_missing": why}


def _best(runs: list) -> dict:
    """Each time the best over the repetitions; energies and counts from the first."""
    out = dict(runs[0])
    for key in (*PHASES, "total"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = min(values) if values else None
    return out


def peers_text(name: str, row: dict) -> str:
    """The table of one molecule: times per phase, energies, flops and GFLOP/s."""
    best, peak = row["best"], row["dgemm_peak_gflops_per_s"]
    codes = [c for c in ("tessera", "nwchem", "pyscf") if c in best]
    title = {"tessera": "Tessera x2", "nwchem": "NWChem TCE x2", "pyscf": "PySCF 2 thr"}
    t = best["tessera"]
    lines = [f"\n{row['molecule']} {row['basis']} CCSD(T): best of {row['repeat']} alternating repetitions "
             f"(Tessera {t['backend']} {t.get('variant') or ''} tile {t['tile']}"
             + (f"; NWChem tile_dim {best['nwchem'].get('tile_dim')}" if "nwchem" in best else "") + ")",
             f"uptime before: {row['uptime_before']}", f"uptime after:  {row['uptime_after']}",
             f"{row.get('blas_kernels', 'BLAS kernels: not recorded')}"]
    phases = [dict(phase=k, **{c: best[c][k] for c in codes}) for k in (*PHASES, "total")]
    for r in phases:
        for c in codes[1:]:
            r[f"{c}/tessera"] = r[c] / r["tessera"] if r[c] and r["tessera"] else None
    lines.append(table(phases, [("seconds", "phase", "9s"), *[(title[c], c, ".2f") for c in codes],
                                *[(f"{title[c].split()[0]}/Tessera", f"{c}/tessera", ".2f") for c in codes[1:]]]))
    lines.append("(total: the whole process, start-up included; NWChem's phases as it prints them, 0.1 s steps)")
    energies = [dict(energy=k, **{c: best[c][k] for c in codes}) for k in ("e_hf", "e_ccsd", "e_ccsd_t")]
    spread = max(max(r[c] for c in codes) - min(r[c] for c in codes) for r in energies)
    lines.append(table(energies, [("energy (Eh)", "energy", "11s"), *[(title[c], c, ".8f") for c in codes]]))
    lines.append(f"largest difference between the codes: {spread:.1e} Eh: "
                 + ("all agree to 1e-6" if spread <= 1e-6 else "*** they do NOT agree to 1e-6 ***"))
    f = t["flops"]
    n_it = t["iterations"]
    rates = []
    for c in codes:
        b = best[c]
        ccsd_it = b["ccsd"] / b["iterations"] if b.get("ccsd") and b.get("iterations") else None
        rates.append({"code": title[c], "iterations": b.get("iterations"),
                      "s_per_it": ccsd_it,
                      "eff_ccsd": f["ccsd_minimal_per_iteration"] / ccsd_it / 1e9 if ccsd_it else None,
                      "eff_t": f["triples_minimal"] / b["triples"] / 1e9 if b.get("triples") else None})
    lines.append(f"CCSD flops per iteration: Tessera executes {f['ccsd_per_iteration']:.3e}, the minimal count "
                 f"is {f['ccsd_minimal_per_iteration']:.3e} ({f['ccsd_over_minimal']:.2f}x); "
                 f"(T): {f['triples']:.3e} executed, {f['triples_minimal']:.3e} minimal")
    ccsd_rate = f["ccsd_per_iteration"] * n_it / t["ccsd"] / 1e9
    t_rate = f["triples"] / t["triples"] / 1e9
    lines.append(f"Tessera executed GFLOP/s: CCSD {ccsd_rate:.2f} ({ccsd_rate / peak:.0%} of peak), (T) "
                 f"{t_rate:.2f} ({t_rate / peak:.0%}); DGEMM peak {peak:.1f} GFLOP/s (order 3000, all BLAS threads, "
                 "this run)")
    lines.append(table(rates, [("code", "code", "14s"), ("CCSD iter.", "iterations", "d"),
                               ("s/iter.", "s_per_it", ".3f"), ("CCSD min-GFLOP/s", "eff_ccsd", ".2f"),
                               ("(T) min-GFLOP/s", "eff_t", ".2f")]))
    lines.append("(min-GFLOP/s: the minimal flop count over each code's own time, the same yardstick for all)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("scaling", "counts", "peers", "all"))
    p.add_argument("--molecule", default="trimer", help="for scaling: name or XYZ file")
    p.add_argument("--molecules", default="trimer,tetramer", help="for counts and peers")
    p.add_argument("--ranks", default="2,4", help="for counts")
    p.add_argument("--tile", type=int, default=16, help="for counts: tile size (the same for every variant)")
    p.add_argument("--basis", default="cc-pvdz", help="for peers")
    p.add_argument("--repeat", type=int, default=2, help="for peers: alternating repetitions (best kept)")
    p.add_argument("--nwchem-memory", type=int, default=3000,
                   help="for peers: NWChem's memory total per process, MB (half of it Global Arrays)")
    p.add_argument("--nwchem-json", action="append", metavar="NAME=FILE",
                   help="for peers: use an NWChem result measured earlier by bench/nwchem/nwchem_tce.py")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args(argv)
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    results["machine"] = {"cores": os.cpu_count(), "load_average_start": load()}
    for what in (("scaling", "counts", "peers") if args.what == "all" else (args.what,)):
        results[what] = globals()[what](args)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=1, default=float))
    print(f"\nresults in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
