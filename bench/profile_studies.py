"""The seeds' experiments as profiled runs, one command each; every run feeds `tessera report`.

    .venv/bin/python bench/profile_studies.py loop-order [--molecules water_trimer water_tetramer]
        [--ranks 2 4] [--basis cc-pvdz] [--method ccsd] [--max-iter 3] [--out bench/results/loop_order]
    .venv/bin/python bench/profile_studies.py progress [--molecule water] [--cores 4]
        [--basis cc-pvdz] [--method "ccsd(t)"] [--out bench/results/progress]

loop-order (NWChem TCE): every mpi-onesided loop order (original, inverted, cached) x
    schedule (nxtval, steal) x molecule x rank count, `tessera run --profile`; a table and
    a figure (loop_order.png) of gets, accumulates, MiB moved and seconds per variant and
    schedule, and one `tessera report` per (molecule, variant, schedule) over the rank
    counts (scaling).
progress (Casper): CCSD(T) on the same number of cores with no progress help (--cores
    ranks), a progress thread per rank (--cores / 2 ranks, each with its thread), and
    ghost ranks (--cores processes, one of them a ghost); per mode two rows, the whole
    CCSD(T) and (T) alone (the triples phase of the same run, from the rank files: its
    wall time, the work of its tasks, the waits that started in it): wall, compute,
    seconds waiting in one-sided and counter operations, E(N) (N = every process);
    progress.png and one `tessera report` per mode.

Energy to solution comes with every profile: joules per phase where the machine's RAPL
counters are readable, else the report says "unavailable" and why.

Writes <out>/study.json (rows, commands, load average) and prints the table. No
assertions; timings on a shared machine are what they are: the load average is printed
beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tessera.profile.commlog import LOCAL_OPS, ONE_SIDED_OPS

from common import table

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BIN = Path(sys.executable).parent
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
       "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1", "PYTHONUNBUFFERED": "1"}


def profiled_run(nprocs: int, xyz: str, out: Path, args: list, env=None) -> dict:
    """One `mpiexec -n nprocs tessera run xyz --profile out args...`; its summary and result."""
    cmd = [str(BIN / "mpiexec"), "-n", str(nprocs), str(BIN / "tessera"), "run", xyz, "--profile", str(out),
           *args]
    full = dict(os.environ, **ENV, **(env or {}))
    full["PYTHONPATH"] = str(REPO / "src") + os.pathsep + full.get("PYTHONPATH", "")
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=str(REPO), timeout=3600)
    if proc.returncode not in (0, 1):          # 1: CCSD stopped at --max-iter (still profiled)
        sys.exit(f"error: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    summary = json.loads((out / "records.json").read_text())["summary"]
    result = json.loads((out / "result.json").read_text())
    return {"command": " ".join(cmd), "load_before": load, "summary": summary, "result": result}


def report(dirs: list, out: Path) -> None:
    subprocess.run([str(BIN / "tessera"), "report", *map(str, dirs), "--out", str(out)], check=True,
                   cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
                   stdout=subprocess.DEVNULL)


def loop_order(a) -> dict:
    rows = []
    for mol in a.molecules:
        for variant in ("original", "inverted", "cached"):
            for schedule in ("nxtval", "steal"):
                dirs = []
                for n in a.ranks:
                    d = a.out / f"{mol}_{n}r_{variant}_{schedule}"
                    r = profiled_run(n, f"examples/{mol}.xyz", d,
                                     ["--basis", a.basis, "--method", a.method, "--max-iter", str(a.max_iter),
                                      "--backend", "mpi-onesided", "--variant", variant, "--schedule", schedule])
                    ops, comm = r["summary"]["ops"], r["result"]["communication"]["total"]
                    rows.append({"molecule": mol, "ranks": n, "variant": variant, "schedule": schedule,
                                 "gets": comm["gets"], "accs": comm["accs"],
                                 "mib_moved": sum(t["moved_bytes"] for t in ops.values()) / 2**20,
                                 "ccsd_seconds": r["result"]["timings"]["ccsd"],
                                 "efficiency": r["summary"]["efficiency"], "load_before": r["load_before"],
                                 "command": r["command"]})
                    dirs.append(d)
                if len(dirs) > 1:
                    report(dirs, a.out / f"report_{mol}_{variant}_{schedule}")
    print(table(rows, [("molecule", "molecule", "15s"), ("N", "ranks", "2d"), ("variant", "variant", "9s"),
                       ("schedule", "schedule", "8s"), ("gets", "gets", "8d"), ("accs", "accs", "8d"),
                       ("MiB", "mib_moved", "8.1f"), ("ccsd s", "ccsd_seconds", "7.2f"),
                       ("E(N)", "efficiency", "6.3f"), ("load", "load_before", "5.1f")]))
    _loop_order_figure(rows, a.out / "loop_order.png")
    return {"rows": rows}


def _loop_order_figure(rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    keys = sorted({(r["molecule"], r["ranks"]) for r in rows})
    combos = [(v, s) for v in ("original", "inverted", "cached") for s in ("nxtval", "steal")]
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6))
    width = 0.8 / len(combos)
    for ax, field, title in zip(axes, ("gets", "accs", "mib_moved", "ccsd_seconds"),
                                ("gets", "accumulates", "MiB moved", "CCSD seconds")):
        for c, (v, s) in enumerate(combos):
            vals = [next((r[field] for r in rows if (r["molecule"], r["ranks"]) == k and r["variant"] == v
                          and r["schedule"] == s), 0) for k in keys]
            ax.bar([i + c * width for i in range(len(keys))], vals, width, label=f"{v}/{s}")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(keys))], [f"{m}\n{n} ranks" for m, n in keys],
                      fontsize=7)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def progress(a) -> dict:
    modes = [("none", a.cores, []), ("thread", a.cores // 2, ["--progress", "thread"]),
             ("ghost", a.cores, ["--progress", "ghost", "--ghosts", "1"])]
    rows, dirs = [], []
    for mode, n, extra in modes:
        d = a.out / f"{a.molecule}_{mode}"
        r = profiled_run(n, f"examples/{a.molecule}.xyz", d,
                         ["--basis", a.basis, "--method", a.method, "--backend", "mpi-onesided", *extra])
        s = r["summary"]
        common = {"mode": mode, "processes": n, "workers": s["ranks"], "load_before": r["load_before"],
                  "command": r["command"]}
        rows.append({**common, "part": "CCSD(T)", "wall": s["wall_seconds"], "compute": s["compute_seconds"],
                     "one_sided_wait": sum(p["one_sided"] for p in s["per_rank"]),
                     "counter_wait": sum(p["counter"] for p in s["per_rank"]),
                     "efficiency": s["efficiency"], "energy": s["energy"]})
        triples = phase_window(d, "triples", s["ranks_total"])
        if triples:
            rows.append({**common, "part": "(T) alone", **triples})
        dirs.append(d)
    print(table(rows, [("mode", "mode", "7s"), ("part", "part", "9s"), ("procs", "processes", "5d"),
                       ("workers", "workers", "7d"), ("wall s", "wall", "7.2f"), ("compute", "compute", "8.2f"),
                       ("1-sided", "one_sided_wait", "8.2f"), ("counter", "counter_wait", "8.2f"),
                       ("E(N)", "efficiency", "6.3f"), ("load", "load_before", "5.1f")]))
    _progress_figure(rows, a.out / "progress.png")
    for d in dirs:
        report([d], d)
    return {"rows": rows}


def phase_window(directory: Path, phase: str, ranks_total: int) -> dict | None:
    """One phase of a profiled run on its own, from the rank files: wall (the slowest
    rank's phase), compute (the work of the tasks that started in it), seconds waiting in
    one-sided and counter operations that started in it (summed over ranks), E(N) over
    every process (ghosts included). None when the run has no such phase."""
    from tessera.profile.run import load_json, rows
    index = load_json(str(directory / "records.json"))
    wall = compute = one_sided = counter = 0.0
    for name in index["rank_files"]:
        rec = load_json(str(directory / name))
        window = [g for g in rows(rec, "regions") if g["kind"] == "phase" and g["name"] == phase]
        if not window:
            return None
        lo, hi = window[0]["start"], window[0]["start"] + window[0]["seconds"]
        wall = max(wall, window[0]["seconds"])
        compute += sum(t["seconds"] for t in rows(rec, "tasks") if lo <= t["start"] < hi)
        for o in rows(rec, "ops"):
            if lo <= o["start"] < hi:
                if o["op"] == "fetch_add":
                    counter += o["seconds"]
                elif o["op"] in ONE_SIDED_OPS + LOCAL_OPS:
                    one_sided += o["seconds"]
    return {"wall": wall, "compute": compute, "one_sided_wait": one_sided, "counter_wait": counter,
            "efficiency": compute / (wall * ranks_total) if wall > 0 else 0.0}


def _progress_figure(rows: list, path: Path) -> None:
    """One row of panels per part (CCSD(T), (T) alone): where the time went per mode, E(N)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = list(dict.fromkeys(r["part"] for r in rows))
    fig, axes = plt.subplots(len(parts), 2, figsize=(9, 3.2 * len(parts)), squeeze=False)
    for (a1, a2), part in zip(axes, parts):
        mine = [r for r in rows if r["part"] == part]
        x = range(len(mine))
        names = [f"{r['mode']}\n{r['workers']} worker(s)" for r in mine]
        bottom = [0.0] * len(mine)
        for field, colour in (("compute", "#2a9d8f"), ("one_sided_wait", "#e76f51"),
                              ("counter_wait", "#e9c46a")):
            vals = [r[field] for r in mine]
            a1.bar(x, vals, bottom=bottom, color=colour, label=field.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
        a1.set_xticks(list(x), names, fontsize=8)
        a1.set_ylabel("seconds summed over ranks")
        a1.set_title(f"{part}: compute and waiting", fontsize=10)
        a1.legend(fontsize=7)
        a2.bar(x, [r["efficiency"] for r in mine], color="#264653")
        a2.set_xticks(list(x), names, fontsize=8)
        a2.set_ylabel("E(N)")
        a2.set_title(f"{part}: computational efficiency", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="study", required=True)
    lo = sub.add_parser("loop-order")
    lo.add_argument("--molecules", nargs="+", default=["water_trimer", "water_tetramer"])
    lo.add_argument("--ranks", nargs="+", type=int, default=[2, 4])
    lo.add_argument("--basis", default="cc-pvdz")
    lo.add_argument("--method", default="ccsd")
    lo.add_argument("--max-iter", type=int, default=3)
    lo.add_argument("--out", type=Path, default=HERE / "results" / "loop_order")
    pr = sub.add_parser("progress")
    pr.add_argument("--molecule", default="water")
    pr.add_argument("--cores", type=int, default=4)
    pr.add_argument("--basis", default="cc-pvdz")
    pr.add_argument("--method", default="ccsd(t)")
    pr.add_argument("--out", type=Path, default=HERE / "results" / "progress")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    result = loop_order(a) if a.study == "loop-order" else progress(a)
    result.update(study=a.study, load_average=os.getloadavg(), cores=os.cpu_count())
    (a.out / "study.json").write_text(json.dumps(result, indent=1, default=float))
    print(f"wrote {a.out}/study.json")


if __name__ == "__main__":
    main()
