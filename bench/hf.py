"""Benchmark: Tessera's distributed RHF against PySCF's RHF, and the schedules.

    .venv/bin/python bench/hf.py                      # naphthalene / cc-pVDZ (180 AOs)
    .venv/bin/python bench/hf.py --basis sto-3g --quick   # smoke run

Measures, in one run, on the same machine (never a timed assertion):
1. wall time per SCF iteration of our RHF (schedule steal, ``--mode``, default direct) at 1 and 2 MPI
   ranks against PySCF's RHF with 1 and 2 OpenMP threads (same cores), same basis,
   conv_tol, and screening threshold (PySCF: ``direct_scf_tol``), PySCF forced to
   direct SCF; PySCF's default (incore ERIs when they fit) is shown for reference.
2. per-rank busy time, tasks executed/stolen and imbalance (max/mean busy) of each
   schedule at 4 ranks (oversubscribed on a 2-core machine);
3. the fetch-and-add breakdown (local/remote counter operations) of ``steal``.

Writes bench/results/hf-<molecule>-<basis>-<time>.json and prints a table.  Each MPI
configuration runs this file under ``mpiexec -n K ... --worker`` and returns JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

NAPHTHALENE = """
C   0.000000   0.714000  0.0
C   0.000000  -0.714000  0.0
C   1.243000   1.402000  0.0
C   1.243000  -1.402000  0.0
C  -1.243000   1.402000  0.0
C  -1.243000  -1.402000  0.0
C   2.433000   0.705000  0.0
C   2.433000  -0.705000  0.0
C  -2.433000   0.705000  0.0
C  -2.433000  -0.705000  0.0
H   1.244000   2.490000  0.0
H   1.244000  -2.490000  0.0
H  -1.244000   2.490000  0.0
H  -1.244000  -2.490000  0.0
H   3.381000   1.245000  0.0
H   3.381000  -1.245000  0.0
H  -3.381000   1.245000  0.0
H  -3.381000  -1.245000  0.0
"""
BENZENE = "".join((ROOT / "examples" / "benzene.xyz").read_text().splitlines(True)[2:])
MOLECULES = {"naphthalene": NAPHTHALENE, "benzene": BENZENE}
CONV_TOL = 1e-10
SCREENING = 1e-12

# MPICH busy-polls while waiting; with more ranks than cores it must yield the core.
MPI_ENV = {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "MPIR_CVAR_POLLS_BEFORE_YIELD": "100",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def build(name: str, basis: str):
    from pyscf import gto
    return gto.M(atom=MOLECULES[name], basis=basis, symmetry=True, verbose=0)


# -- worker: runs under mpiexec -------------------------------------------------------
def worker(args) -> None:
    from tessera.backends.context import Context
    from tessera.chem.scf import rhf
    from tessera.runtime import World

    world = World.get()
    ctx = Context("mpi-onesided")
    mol = build(args.molecule, args.basis)
    out = {}
    for schedule in args.schedules.split(","):
        world.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        ref = rhf(mol, schedule=schedule, screening=SCREENING, conv_tol=CONV_TOL,
                  mode=args.mode, context=ctx)
        wall = time.perf_counter() - t0
        cpu = sum(world.allgather(time.process_time() - c0))
        info = ref.info
        out[schedule] = {
            "e_hf": ref.e_hf, "iterations": ref.iterations, "wall_s": wall, "cpu_s": cpu,
            "iteration_wall_s": info["iteration_wall_s"], "setup_s": info["setup_s"],
            "busy_s": info["busy_s"], "imbalance": info["imbalance"],
            "tasks_executed": info["tasks_executed"], "tasks_stolen": info["tasks_stolen"],
            "counter_ops": info["counter_ops"], "mode": info["mode"], "threads": info["threads"],
            "busy_cpu_s": info["busy_cpu_s"], "imbalance_cpu": info["imbalance_cpu"],
            "reduce_s": [r["reduce_s"] for r in info["per_rank"]],
            **{k: info.get(k) for k in ("tasks_total", "nblocks", "shell_quartets",   # no tasks:
                                        "shell_quartets_skipped")},            # 8-fold incore
        }
    ctx.close()
    if world.rank == 0:
        print(json.dumps({"nranks": world.size, "runs": out}), flush=True)


def launch(nranks: int, args, schedules: str) -> dict:
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", str(nranks), sys.executable,
           str(Path(__file__).resolve()), "--worker", "--molecule", args.molecule,
           "--basis", args.basis, "--schedules", schedules, "--mode", getattr(args, "mode", "auto")]
    env = dict(os.environ, **MPI_ENV)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{' '.join(cmd)} printed no JSON:\n{proc.stdout[-2000:]}")


# -- PySCF peer -----------------------------------------------------------------------
def pyscf_rhf(args, threads: int, direct: bool) -> dict:
    from pyscf import lib, scf

    mol = build(args.molecule, args.basis)
    mf = scf.RHF(mol)
    mf.conv_tol = CONV_TOL
    mf.direct_scf_tol = SCREENING
    if direct:
        mf.max_memory = 1            # no room for incore ERIs: direct SCF
    stamps = []
    mf.callback = lambda env: stamps.append(time.perf_counter())
    with lib.with_omp_threads(threads):
        t0, c0 = time.perf_counter(), time.process_time()
        e = mf.kernel()
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    steps = [b - a for a, b in zip([t0] + stamps[:-1], stamps)]
    return {"e_hf": float(e), "iterations": int(mf.cycles), "wall_s": wall, "cpu_s": cpu,
            "iteration_wall_s": steps, "threads": threads,
            "mode": "direct" if direct else "default (incore if it fits)",
            "converged": bool(mf.converged)}


def per_iter(run: dict) -> float:
    steps = run["iteration_wall_s"]
    return sum(steps) / len(steps)


def table(res: dict) -> str:
    lines = []
    m = res["molecule"]
    lines.append(f"RHF {m['name']} / {m['basis']}: {m['nao']} AOs, point group "
                 f"{m['group']}, conv_tol {CONV_TOL:g}, screening {SCREENING:g}")
    lines.append("")
    lines.append(f"{'code':<34}{'cores':>6}{'iters':>7}{'s/iter':>9}{'total s':>9}"
                 f"{'ratio':>8}{'cpu s/iter':>12}{'cpu ratio':>10}  E_HF")
    for row in res["comparison"]:
        lines.append(f"{row['label']:<34}{row['cores']:>6}{row['iterations']:>7}"
                     f"{row['s_per_iter']:>9.2f}{row['wall_s']:>9.1f}"
                     f"{row['ratio'] if row['ratio'] is not None else '':>8}"
                     f"{row['cpu_per_iter']:>12.2f}"
                     f"{row['cpu_ratio'] if row['cpu_ratio'] is not None else '':>10}"
                     f"  {row['e_hf']:.10f}")
    lines.append("  ratio = our wall s/iter / PySCF direct wall s/iter on the same number of "
                 "cores;")
    lines.append("  cpu = CPU seconds of all threads/ranks per iteration (less sensitive to "
                 "machine load)")
    load = res["machine"]
    lines.append(f"  load average at start {load['loadavg_start'][0]:.1f}, at end "
                 f"{load.get('loadavg_end', [float('nan')])[0]:.1f} on {load['cpus']} CPUs")
    lines.append("")
    sched = res.get("schedules_4ranks", {})
    if sched:
        lines.append("4 ranks (oversubscribed): busy time per rank over the whole SCF")
        lines.append(f"{'schedule':<9}{'busy s per rank':<34}{'imbal':>7}  {'tasks per rank':<28}"
                     f"{'stolen':>14}{'s/iter':>8}{'imbal(cpu)':>12}")
        for s, r in sched.items():
            busy = " ".join(f"{b:6.1f}" for b in r["busy_s"])
            tasks = " ".join(f"{t:6d}" for t in r["tasks_executed"])
            stolen = " ".join(str(t) for t in r["tasks_stolen"])
            lines.append(f"{s:<9}{busy:<34}{r['imbalance']:>7.3f}  {tasks:<28}"
                         f"{stolen:>14}{per_iter(r):>8.2f}{r['imbalance_cpu']:>12.3f}")
        lines.append("  busy = wall time in tasks (inflated when ranks share a core); "
                     "imbal(cpu) uses thread CPU time")
        lines.append("")
        lines.append("fetch-and-add operations (whole SCF)")
        for s, r in sched.items():
            ops = r["counter_ops"]
            frac = ops["local_fraction"]
            lines.append(f"  {s:<8} local {ops['local']:>7}  remote {ops['remote']:>6}"
                         f"  local fraction {frac:.3f}" if frac is not None else
                         f"  {s:<8} no counter operations")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--molecule", default="naphthalene", choices=sorted(MOLECULES))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--schedules", default="static,nxtval,steal")
    ap.add_argument("--mode", default="direct", choices=("auto", "direct", "incore"),
                    help="our SCF's Fock build (default direct, as PySCF is forced to be; "
                         "auto: in memory when it fits)")
    ap.add_argument("--quick", action="store_true",
                    help="skip the PySCF default run and the 2-thread/2-rank pair")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    mol = build(args.molecule, args.basis)
    res = {"molecule": {"name": args.molecule, "basis": args.basis, "nao": mol.nao,
                        "group": mol.groupname},
           "machine": {"cpus": os.cpu_count(), "loadavg_start": os.getloadavg()},
           "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
    cores = (1,) if args.quick else (1, 2)
    runs = {}
    for n in cores:
        runs[f"pyscf_direct_{n}"] = pyscf_rhf(args, n, direct=True)
        runs[f"tessera_steal_{n}"] = launch(n, args, "steal")["runs"]["steal"]
    if not args.quick:
        runs["pyscf_default_1"] = pyscf_rhf(args, 1, direct=False)
    rows = []
    for n in cores:
        peer = runs[f"pyscf_direct_{n}"]
        base, base_cpu = per_iter(peer), peer["cpu_s"] / peer["iterations"]
        for key, label in ((f"pyscf_direct_{n}", f"PySCF RHF direct, {n} thread(s)"),
                           (f"tessera_steal_{n}", f"Tessera RHF steal, {n} rank(s)")):
            r = runs[key]
            cpu = r["cpu_s"] / r["iterations"]
            ours = not key.startswith("pyscf")
            rows.append({"label": label, "cores": n, "iterations": r["iterations"],
                         "s_per_iter": per_iter(r), "wall_s": r["wall_s"],
                         "ratio": f"{per_iter(r) / base:.2f}" if ours else None,
                         "cpu_per_iter": cpu,
                         "cpu_ratio": f"{cpu / base_cpu:.2f}" if ours else None,
                         "e_hf": r["e_hf"]})
    if "pyscf_default_1" in runs:
        r = runs["pyscf_default_1"]
        rows.append({"label": "PySCF RHF default (incore), 1 thr", "cores": 1,
                     "iterations": r["iterations"], "s_per_iter": per_iter(r),
                     "wall_s": r["wall_s"], "ratio": None,
                     "cpu_per_iter": r["cpu_s"] / r["iterations"], "cpu_ratio": None,
                     "e_hf": r["e_hf"]})
    res["runs"] = runs
    res["comparison"] = rows
    res["schedules_4ranks"] = launch(4, args, args.schedules)["runs"]
    res["machine"]["loadavg_end"] = os.getloadavg()
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"hf-{args.molecule}-{args.basis}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1))
    print(table(res))
    print(f"\nwritten: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
