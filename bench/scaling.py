"""Distributed CCSD(T): scaling of the MPI executors, communication counts, and peers.

    .venv/bin/python bench/scaling.py scaling [--molecule examples/water_trimer.xyz]
    .venv/bin/python bench/scaling.py counts  [--molecules trimer,tetramer] [--ranks 2,4]
    .venv/bin/python bench/scaling.py peers   [--molecules trimer,tetramer]
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
peers: CCSD(T) wall time of Tessera at 2 ranks (auto), NWChem's TCE at 2 ranks
  (``mpirun -np 2``, Debian package nwchem; the script says what is missing when it is
  absent) and PySCF (2 threads), with ratios.

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
import nwchem_tce  # noqa: E402

BIN = Path(sys.executable).parent
RESULTS = REPO / "bench" / "results" / "scaling.json"
MOLECULES = {"water": "examples/water.xyz", "trimer": "examples/water_trimer.xyz",
             "tetramer": "examples/water_tetramer.xyz"}
NWCHEM_SYMMETRY = {"trimer": None, "tetramer": "c2", "water": "c2v"}   # Tessera's Abelian groups
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "100"}
EXECUTORS = [("mpi-onesided cached", "mpi-onesided", ["--variant", "cached", "--schedule", "nxtval"]),
             ("mpi-collective summa", "mpi-collective", ["--variant", "summa"]),
             ("mpi-collective 2.5d", "mpi-collective", ["--variant", "2.5d"])]


def load() -> float:
    return os.getloadavg()[0]


def tessera(xyz: str, nranks: int | None, args: list, timeout: float = 7200) -> dict:
    """One `tessera run` (under mpiexec -n nranks unless None); its JSON plus wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        cmd = [str(BIN / "tessera"), "run", xyz, "--basis", "cc-pvdz", "--json", str(out), *args]
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


def pyscf_ccsd_t(xyz: str, threads: int = 2) -> dict:
    """PySCF RHF + CCSD + (T) in a subprocess with ``threads`` OpenMP threads."""
    code = f"""
import json, time
from pyscf import gto, scf, cc
lines = open({xyz!r}).read().splitlines()
atoms = "\\n".join(lines[2:2 + int(lines[0].split()[0])])
t0 = time.perf_counter()
mol = gto.M(atom=atoms, basis="cc-pvdz", symmetry=True, verbose=0)
mf = scf.RHF(mol); mf.conv_tol = 1e-10; mf.kernel()
t1 = time.perf_counter()
mycc = cc.CCSD(mf); mycc.conv_tol = 1e-8; mycc.kernel()
t2 = time.perf_counter()
et = mycc.ccsd_t()
t3 = time.perf_counter()
print(json.dumps({{"e_hf": mf.e_tot, "e_ccsd_corr": mycc.e_corr, "e_t": et, "scf": t1 - t0,
                  "ccsd": t2 - t1, "triples": t3 - t2, "total": t3 - t0}}))
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


def peers(args) -> dict:
    rows = {}
    why = nwchem_tce.missing()
    if why:
        print(f"NWChem: {why}; measuring Tessera and PySCF only", flush=True)
    earlier = {}
    for item in args.nwchem_json or []:       # name=file.json from bench/nwchem/nwchem_tce.py
        name, path = item.split("=", 1)
        earlier[name] = json.loads(Path(path).read_text())
        earlier[name]["measured_separately"] = path
    for name in args.molecules.split(","):
        xyz = str(REPO / MOLECULES.get(name, name))
        t = tessera(MOLECULES.get(name, name), 2, ["--method", "ccsd(t)"])
        p = pyscf_ccsd_t(xyz)
        row = {"tessera_2_ranks": {"wall": t["wall_seconds"], "backend": t["backend"], "variant": t.get("variant"),
                                   "tile": t["tile"], "energy_total": t["energies"]["total"],
                                   "load_average": t["load_average"]},
               "pyscf_2_threads": p}
        print(f"{name}: tessera x2 {t['wall_seconds']:.1f} s, pyscf {p['wall_seconds']:.1f} s", flush=True)
        if name in earlier:
            row["nwchem_tce_2_ranks"] = earlier[name]
        elif not why:
            nw = nwchem_tce.run(xyz, "cc-pvdz", 2, NWCHEM_SYMMETRY.get(name))
            nw["load_average"] = load()
            row["nwchem_tce_2_ranks"] = nw
        if "nwchem_tce_2_ranks" in row:
            print(f"{name}: nwchem x2 {row['nwchem_tce_2_ranks'].get('wall_seconds', float('nan')):.1f} s",
                  flush=True)
        rows[name] = row
    print("\nCCSD(T)/cc-pVDZ wall time (s) and ratios (peer / Tessera: > 1 means Tessera is faster)")
    print(f"{'molecule':9s} {'Tessera x2':>10s} {'NWChem TCE x2':>13s} {'PySCF 2 thr':>11s} "
          f"{'NWChem/Tessera':>14s} {'PySCF/Tessera':>13s} {'|dE| NWChem':>11s}")
    for name, r in rows.items():
        tw = r["tessera_2_ranks"]["wall"]
        nw = r.get("nwchem_tce_2_ranks", {})
        nww = nw.get("wall_seconds")
        pw = r["pyscf_2_threads"]["wall_seconds"]
        de = (abs(nw["e_ccsd_t_total"] - r["tessera_2_ranks"]["energy_total"])
              if nw.get("e_ccsd_t_total") is not None else None)
        print(f"{name:9s} {tw:10.1f} {nww if nww else float('nan'):13.1f} {pw:11.1f} "
              f"{(nww / tw) if nww else float('nan'):14.2f} {pw / tw:13.2f} "
              f"{de if de is not None else float('nan'):11.2e}")
    return {"rows": rows, "nwchem_missing": why}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("scaling", "counts", "peers", "all"))
    p.add_argument("--molecule", default="trimer", help="for scaling: name or XYZ file")
    p.add_argument("--molecules", default="trimer,tetramer", help="for counts and peers")
    p.add_argument("--ranks", default="2,4", help="for counts")
    p.add_argument("--tile", type=int, default=16, help="for counts: tile size (the same for every variant)")
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
