"""Benchmark of the runtime layer against the Global Arrays toolkit, on this machine.

    .venv/bin/python bench/runtime_bench.py [--busy-seconds 2] [--flood-n 100000]
                                             [--skip-ga] [--out bench/results/runtime.json]

Measurements (2 worker ranks on one node; each also run with GA's C API by
bench/ga/ga_bench.c, built here against Debian's GA, and reported as Tessera/GA):
  flood    every rank does N fetch-and-adds on its own counter, then N on random remote
           counters: aggregate operations per second, local vs remote.
  latency  rank 0 gets / accumulates a block of 8 B .. 8 MiB owned by rank 1: time per
           operation (best of 3 timed loops) and bandwidth.
  busy     rank 1 computes for --busy-seconds without calling MPI (numpy matrix products
           "blas", or a pure-Python loop "python"); rank 0 waits 0.1 s, then times one
           get, one acc (1 MiB each) and one fetch-and-add aimed at rank 1, in each
           progress mode, plus MPICH's own progress thread (MPIR_CVAR_ASYNC_PROGRESS=1);
           --busy-repeat runs each, median shown. Also the latency of get/acc in each
           progress mode when nothing is busy (what the help costs).

Tessera runs with the venv's `mpich` wheel; GA with Open MPI (Debian's GA is built for
it). Window kinds: "allocate" (MPI_Win_allocate: same-node blocks are read/written as
shared memory, no MPI call) and "create" (MPI_Win_create: every operation goes through
the target's MPI progress engine, as between nodes). The GA peer needs the Debian
packages listed in GA_PACKAGES; without them the script says so and reports Tessera only.
Writes JSON (raw numbers, commands, load average) and prints tables. No assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KERNELS = HERE / "runtime_kernels.py"
GA_SRC = HERE / "ga" / "ga_bench.c"
GA_BUILD = HERE / "ga" / "build"
GA_PACKAGES = ["libglobalarrays-dev", "libarmci-mpi-dev", "libopenmpi-dev",
               "libscalapack-openmpi-dev", "liblapack-dev", "libblas-dev",
               "libgfortran-12-dev"]
GA_LIBS = ["-lga-openmpi", "-larmci-openmpi", "-lscalapack-openmpi", "-llapack", "-lblas",
           "-lgfortran", "-lm"]
BASE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1"}


def run_json(cmd, env=None, timeout=600):
    """Run a launcher command; return (rank 0's JSON object, wall seconds)."""
    full_env = dict(os.environ, **BASE_ENV)
    full_env["PYTHONPATH"] = str(REPO / "src") + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout,
                          cwd=str(REPO))
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line), wall
    raise RuntimeError(f"no JSON from {' '.join(map(str, cmd))}:\n{proc.stdout[-2000:]}")


# -- Tessera ----------------------------------------------------------------------------
def tessera(nprocs, args, progress="none", window=None, extra_env=None):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    cmd = [str(mpiexec), "-n", str(nprocs), sys.executable, str(KERNELS), *map(str, args)]
    env = {"TESSERA_PROGRESS": progress}
    if window:
        env["TESSERA_WINDOW"] = window
    env.update(extra_env or {})
    out, wall = run_json(cmd, env)
    out["command"] = " ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(
        [f"mpiexec -n {nprocs}", "python", "bench/runtime_kernels.py", *map(str, args)])
    out["wall"] = wall
    return out


# -- Global Arrays ----------------------------------------------------------------------
def ga_missing() -> list[str]:
    missing = []
    if not shutil.which("mpicc.openmpi") or not shutil.which("mpirun.openmpi"):
        missing.append("libopenmpi-dev (mpicc.openmpi, mpirun.openmpi)")
    if not Path("/usr/include/ga.h").exists():
        missing.append("libglobalarrays-dev (/usr/include/ga.h)")
    libdir = Path("/usr/lib/x86_64-linux-gnu")
    for lib, pkg in (("libarmci-openmpi.a", "libarmci-mpi-dev"),
                     ("libscalapack-openmpi.so", "libscalapack-openmpi-dev"),
                     ("liblapack.so", "liblapack-dev"), ("libblas.so", "libblas-dev")):
        if not (libdir / lib).exists():
            missing.append(f"{pkg} ({lib})")
    return missing


def build_ga() -> Path:
    GA_BUILD.mkdir(parents=True, exist_ok=True)
    exe = GA_BUILD / "ga_bench"
    cmd = ["mpicc.openmpi", "-O2", "-o", str(exe), str(GA_SRC), *GA_LIBS]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the GA peer failed: {' '.join(cmd)}\n{proc.stderr}\n"
                           f"Install: apt-get install {' '.join(GA_PACKAGES)}")
    return exe


def ga(exe, nprocs, args):
    cmd = ["mpirun.openmpi", "--oversubscribe", "--bind-to", "none", "-n", str(nprocs),
           str(exe), *map(str, args)]
    env = {}
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out, wall = run_json(cmd, env)
    out["command"] = " ".join(cmd[:-len(args) - 1]) + " bench/ga/build/ga_bench " + \
        " ".join(map(str, args))
    out["wall"] = wall
    return out


def summarize_busy(label, compute, runs):
    out = {"label": label, "compute": compute, "runs": runs, "command": runs[0]["command"]}
    for op in ("get_wait", "acc_wait", "fetch_add_wait"):
        values = sorted(r[op] for r in runs if r.get(op) is not None)
        out[op] = values[len(values) // 2] if values else None
        out[op + "_range"] = [values[0], values[-1]] if values else None
    return out


# -- tables -----------------------------------------------------------------------------
def fmt_t(seconds):
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n // f} {unit}"
    return f"{n} B"


def ratio(a, b):
    return None if (a is None or not b) else a / b


def fmt_r(r):
    return "-" if r is None else f"{r:.2f}x"


def rows_by(result, op):
    return {r["bytes"]: r["seconds"] for r in result["rows"] if r["op"] == op}


def print_tables(res):
    lines = []
    fl = res["flood"]
    gfl = fl.get("ga")
    lines.append(f"Flood: {fl['tessera_allocate']['n']} fetch-and-adds per rank, 2 ranks; "
                 "aggregate operations per second")
    lines.append(f"  {'':28s} {'local':>12s} {'remote':>12s}")
    for name, r in (("tessera (allocate)", fl["tessera_allocate"]),
                    ("tessera (create)", fl["tessera_create"]), ("GA NGA_Read_inc", gfl)):
        if r:
            lines.append(f"  {name:28s} {r['local_ops_per_s']:12.3g} {r['remote_ops_per_s']:12.3g}")
    if gfl:
        t = fl["tessera_allocate"]
        lines.append(f"  {'tessera(allocate)/GA':28s} "
                     f"{fmt_r(ratio(t['local_ops_per_s'], gfl['local_ops_per_s'])):>12s} "
                     f"{fmt_r(ratio(t['remote_ops_per_s'], gfl['remote_ops_per_s'])):>12s}")
    lines.append("")
    lat = res["latency"]
    ta, tc, g = lat["tessera_allocate"], lat["tessera_create"], lat.get("ga")
    for op in ("get", "acc"):
        a, c = rows_by(ta, op), rows_by(tc, op)
        gg = rows_by(g, op) if g else {}
        ia = rows_by(ta, "iacc") if op == "acc" else {}
        lines.append(f"{op}: rank 0 <- rank 1, time per operation (bandwidth)"
                     + ("; tessera acc returns at remote completion, GA's NGA_Acc at local "
                        "completion (loop ends with GA_Fence), tessera iacc = issue all, "
                        "wait all" if op == "acc" else ""))
        head = f"  {'size':>8s} {'tessera alloc':>22s} {'tessera create':>22s} {'GA':>22s}"
        head += f" {'alloc/GA':>9s}" + (f" {'iacc alloc':>11s} {'iacc/GA':>8s}" if ia else "")
        lines.append(head)
        for nbytes in sorted(a):
            def cell(t):
                return "-" if t is None else f"{fmt_t(t)} ({nbytes / t / 1e9:.2f} GB/s)"
            row = (f"  {fmt_bytes(nbytes):>8s} {cell(a.get(nbytes)):>22s} "
                   f"{cell(c.get(nbytes)):>22s} {cell(gg.get(nbytes)):>22s} "
                   f"{fmt_r(ratio(a.get(nbytes), gg.get(nbytes))):>9s}")
            if ia:
                row += (f" {fmt_t(ia.get(nbytes)):>11s} "
                        f"{fmt_r(ratio(ia.get(nbytes), gg.get(nbytes))):>8s}")
            lines.append(row)
        lines.append("")
    lines.append("Cost of progress help when no rank is busy (window create unless noted): "
                 "time per operation")
    cols = [("none", lat["tessera_create"]), ("thread", lat["tessera_thread_create"]),
            ("ghost (shared)", lat["tessera_ghost"])]
    lines.append(f"  {'op':5s} {'size':>8s}" + "".join(f" {c:>16s}" for c, _ in cols))
    for op in ("get", "acc"):
        for nbytes in (8, 32768, 2097152):
            lines.append(f"  {op:5s} {fmt_bytes(nbytes):>8s}" + "".join(
                f" {fmt_t(rows_by(r, op).get(nbytes)):>16s}" for _, r in cols))
    lines.append("")
    lines.append(f"Busy target: rank 1 computes {res['busy_seconds']} s without MPI; time "
                 "rank 0 waits for one operation on rank 1's data (1 MiB get/acc, 8 B "
                 f"fetch-and-add); median of {len(res['busy'][0]['runs'])} runs [min-max]")
    lines.append(f"  {'configuration':42s} {'compute':>7s} {'get':>24s} {'acc':>24s} "
                 f"{'fetch_add':>24s}")

    def cell(r, op):
        rng = r.get(op + "_range")
        if r.get(op) is None:
            return "-"
        return f"{fmt_t(r[op])} [{fmt_t(rng[0])}-{fmt_t(rng[1])}]"

    for r in res["busy"]:
        lines.append(f"  {r['label']:42s} {r['compute']:>7s} {cell(r, 'get_wait'):>24s} "
                     f"{cell(r, 'acc_wait'):>24s} {cell(r, 'fetch_add_wait'):>24s}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy-seconds", type=float, default=2.0)
    ap.add_argument("--flood-n", type=int, default=100000)
    ap.add_argument("--busy-repeat", type=int, default=3,
                    help="runs per busy-target configuration (the table shows the median)")
    ap.add_argument("--skip-ga", action="store_true", help="do not build/run the GA peer")
    ap.add_argument("--out", default=str(HERE / "results" / "runtime.json"))
    args = ap.parse_args(argv)

    res = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "python": sys.version.split()[0], "loadavg_start": os.getloadavg()},
           "busy_seconds": args.busy_seconds}
    exe = None
    if not args.skip_ga:
        missing = ga_missing()
        if missing:
            print("GA peer not measured: missing " + "; ".join(missing) + "\n  install with: "
                  f"apt-get install {' '.join(GA_PACKAGES)}", file=sys.stderr)
            res["ga_missing"] = missing
        else:
            exe = build_ga()

    n = args.flood_n
    res["flood"] = {"tessera_allocate": tessera(2, ["flood", n], window="allocate"),
                    "tessera_create": tessera(2, ["flood", n], window="create"),
                    "ga": ga(exe, 2, ["flood", n]) if exe else None}
    res["latency"] = {"tessera_allocate": tessera(2, ["latency"], window="allocate"),
                      "tessera_create": tessera(2, ["latency"], window="create"),
                      "tessera_thread_create": tessera(2, ["latency"], "thread", "create"),
                      "tessera_ghost": tessera(3, ["latency"], "ghost"),
                      "ga": ga(exe, 2, ["latency"]) if exe else None}
    s = args.busy_seconds
    busy = []
    configs = [
        ("tessera none, window allocate", 2, "none", "allocate", {}, ("blas",)),
        ("tessera none, window create", 2, "none", "create", {}, ("blas", "python")),
        ("tessera none, create + MPICH async thread", 2, "none", "create",
         {"MPIR_CVAR_ASYNC_PROGRESS": "1"}, ("blas", "python")),
        ("tessera thread, window create", 2, "thread", "create", {}, ("blas", "python")),
        ("tessera ghost (2 workers + 1 ghost)", 3, "ghost", None, {}, ("blas", "python")),
    ]
    for label, nprocs, progress, window, extra, kinds in configs:
        for kind in kinds:
            runs = [tessera(nprocs, ["busy", s, kind], progress, window, extra)
                    for _ in range(args.busy_repeat)]
            busy.append(summarize_busy(label, kind, runs))
    if exe:
        runs = [ga(exe, 2, ["busy", s]) for _ in range(args.busy_repeat)]
        busy.append(summarize_busy("GA (Open MPI, ARMCI-MPI)", "C loop", runs))
    res["busy"] = busy
    res["machine"]["loadavg_end"] = os.getloadavg()

    if exe:
        fl, lat = res["flood"], res["latency"]
        res["ratios_tessera_over_ga"] = {
            "flood_local_ops": ratio(fl["tessera_allocate"]["local_ops_per_s"],
                                     fl["ga"]["local_ops_per_s"]),
            "flood_remote_ops": ratio(fl["tessera_allocate"]["remote_ops_per_s"],
                                      fl["ga"]["remote_ops_per_s"]),
            "latency_time": {op: {b: ratio(t, rows_by(lat["ga"], op).get(b))
                                  for b, t in rows_by(lat["tessera_allocate"], op).items()}
                             for op in ("get", "acc")},
        }
    table = print_tables(res)
    res["table"] = table
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(table)
    print(f"\nload average at start {res['machine']['loadavg_start']}, end "
          f"{res['machine']['loadavg_end']} on {os.cpu_count()} CPUs; results: {out}")


if __name__ == "__main__":
    main()
