"""Proxy application: TCE's 2-D block matrix multiplication on Tessera's runtime, profiled.

    .venv/bin/python bench/proxy_matmul.py [--n 768] [--blocks 48 96 192] [--ranks 2 4]
                                           [--out bench/results/proxy]
    (one run: mpiexec -n P python bench/proxy_matmul.py --kernel KERNEL --n N --block B --profile DIR)

C = A B for dense n x n matrices stored as b x b blocks in global arrays (cyclic owners),
with the block size swept, by four kernels:
  original  NWChem TCE's loop order: tasks are output blocks C(i,j) handed out by a
            shared counter (NXTVAL); per task get A(i,k) and B(k,j) for every k,
            multiply, accumulate C(i,j) once (dynamic get/compute/accumulate);
  inverted  tasks are (i,k): get A(i,k) once, then per j get B(k,j) and accumulate into
            C(i,j) (fewer gets of A, one accumulate per product);
  owner     owner computes: each rank computes the C blocks it owns, getting the A and
            B blocks it lacks one-sidedly (no counter, no accumulates);
  summa     bulk-synchronous SUMMA on a pr x pc grid of ranks (pr pc = P): panels of A
            broadcast along grid rows, of B along grid columns (Group.bcast).
Each run checks C against numpy (max abs error in the JSON), is profiled (records and
trace; `tessera report DIR` works on it), and reports the bytes each rank moved against
the communication lower bound of matrix multiplication 3 n^2 / P^(2/3) words (Solomonik
and Demmel; libtensor/CTF study). The driver runs every kernel x block size x rank count,
writes <out>/study.json and <out>/proxy.png, and one `tessera report` per kernel over the
rank counts. The original and inverted loop orders also run on Global Arrays itself
(bench/ga/ga_proxy.c, GA's C API, built against Debian's GA packages as
bench/runtime_bench.py does; skipped with a message when they are missing), in the same
run, reported as Tessera/GA time ratios (GA's bytes are those requested: it does not say
which gets were local). Timings on a shared machine: the load average is recorded
beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tessera.profile.report import matmul_bound_bytes

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
KERNELS = ("original", "inverted", "owner", "summa")


def run_kernel(a) -> None:
    """Under mpiexec: one kernel, profiled into a.profile; rank 0 prints one JSON line."""
    from tessera.profile import run as run_profile
    from tessera.profile.records import Recorder
    from tessera.runtime import GlobalArray, TaskCounter, World

    world = World.get()
    me, p = world.rank, world.size
    nb, b = a.n // a.block, a.block
    recorder = Recorder(detailed=True)
    run_profile.prepare(a.profile)
    world.comm_log.record_events(recorder.t0)
    rng = np.random.default_rng(7)
    A_full, B_full = rng.standard_normal((a.n, a.n)), rng.standard_normal((a.n, a.n))
    tiling = [[b] * nb, [b] * nb]
    A, B, C = (GlobalArray(tiling, name=x, world=world) for x in "ABC")
    for G, full in ((A, A_full), (B, B_full)):
        for key in G.local_keys():
            i, j = key
            G.local_view(key)[...] = full[i * b:(i + 1) * b, j * b:(j + 1) * b]
    world.barrier()

    def block(G, key):
        return G.local_view(key) if G.owner(key) == me else G.get(key)

    def task(name, index, fn):
        t0 = time.perf_counter()
        fn()
        recorder.task(name, index, t0, time.perf_counter() - t0)

    def gemm(x, y, out):
        t0 = time.perf_counter()
        out += x @ y
        recorder.compute += time.perf_counter() - t0

    t0 = time.perf_counter()
    if a.kernel in ("original", "inverted"):
        counter = TaskCounter("global", world=world)
        ntasks = nb * nb
        t = counter.next()
        while t < ntasks:
            i, x = divmod(t, nb)
            if a.kernel == "original":          # x = j: one output block per task
                def one(i=i, j=x):
                    c = np.zeros((b, b))
                    for k in range(nb):
                        gemm(block(A, (i, k)), block(B, (k, j)), c)
                    C.acc((i, j), c)
            else:                               # x = k: A(i,k) reused for every j
                def one(i=i, k=x):
                    aik = block(A, (i, k))
                    for j in range(nb):
                        c = np.zeros((b, b))
                        gemm(aik, block(B, (k, j)), c)
                        C.acc((i, j), c)
            task(a.kernel, t, one)
            t = counter.next()
        C.sync()
        world.barrier()
        counter.free()
    elif a.kernel == "owner":
        for key in C.local_keys():
            i, j = key

            def one(i=i, j=j):
                c = C.local_view((i, j))
                for k in range(nb):
                    gemm(block(A, (i, k)), block(B, (k, j)), c)
            task("owner", i * nb + j, one)
        world.barrier()
    else:
        summa(world, a.n, A_full, B_full, C, b, gemm, recorder)
    recorder.region(f"{a.kernel} b={b}", time.perf_counter() - t0, 2 * a.n**3, start=t0, kind="tasks")

    err = 0.0
    ref = A_full @ B_full
    for key in C.local_keys():
        i, j = key
        err = max(err, float(np.abs(C.local_view(key) - ref[i * b:(i + 1) * b, j * b:(j + 1) * b]).max()))
    err = world.allreduce(err, op="max")
    seconds = world.allreduce(time.perf_counter() - t0, op="max")
    for G in (A, B, C):
        G.free()
    data = {"molecule": None, "basis": "-", "method": f"proxy matmul n={a.n}", "backend": f"proxy-{a.kernel}",
            "ranks": p, "tile": b}
    summary = run_profile.finish(recorder, world, a.profile, data)
    if me == 0:
        ops = summary["ops"]
        moved = sum(t["moved_bytes"] for t in ops.values())
        print(json.dumps({"kernel": a.kernel, "n": a.n, "block": b, "ranks": p, "seconds": seconds,
                          "max_error": err, "bytes_per_rank": moved / p,
                          "bound_bytes_per_rank": matmul_bound_bytes(a.n**3, p),
                          "gets": ops.get("get", {}).get("calls", 0), "accs": ops.get("acc", {}).get("calls", 0),
                          "efficiency": summary["efficiency"]}), flush=True)


def summa(world, n, A_full, B_full, C, b, gemm, recorder) -> None:
    """SUMMA on a pr x pc grid: rank (r, c) computes rows block r, columns block c of C
    (contiguous panels; the result is then put into C's blocks); panels of width b (cut
    where the owning grid row or column changes) move
    by broadcasts along grid rows (A) and columns (B). A rank holds only its own panels of
    A and B at the start (its slice of the full matrices, as if distributed)."""
    p, me = world.size, world.rank
    pr = max(d for d in range(1, int(p**0.5) + 1) if p % d == 0)
    pc = p // pr
    r, c = divmod(me, pc)
    rows = np.array_split(np.arange(n), pr)[r]
    cols = np.array_split(np.arange(n), pc)[c]
    row_group = world.split(r, c)            # ranks of my grid row, ranked by column
    col_group = world.split(pr + c, r)       # ranks of my grid column, ranked by row
    a_cols = np.array_split(np.arange(n), pc)  # which k each grid column holds of A
    b_rows = np.array_split(np.arange(n), pr)  # which k each grid row holds of B
    a_mine = A_full[np.ix_(rows, a_cols[c])]   # my part of A: my rows, my column's k
    b_mine = B_full[np.ix_(b_rows[r], cols)]
    out = np.zeros((len(rows), len(cols)))
    # panels of width b, also cut where the owner of A's columns or B's rows changes
    cuts = sorted(set(range(0, n, b)) | {int(x[0]) for x in a_cols} | {int(x[0]) for x in b_rows} | {n})
    for k0, k1 in zip(cuts[:-1], cuts[1:]):
        ks = np.arange(k0, k1)
        owner_c = next(q for q in range(pc) if k0 in a_cols[q])
        owner_r = next(q for q in range(pr) if k0 in b_rows[q])
        apanel = np.ascontiguousarray(a_mine[:, ks - a_cols[c][0]]) if owner_c == c \
            else np.empty((len(rows), len(ks)))
        bpanel = np.ascontiguousarray(b_mine[ks - b_rows[r][0], :]) if owner_r == r \
            else np.empty((len(ks), len(cols)))
        row_group.bcast(apanel, owner_c, op_name="bcast_row")
        col_group.bcast(bpanel, owner_r, op_name="bcast_col")
        gemm(apanel, bpanel, out)
    row_group.free()
    col_group.free()
    world.barrier()
    # my panel into C's blocks, whichever ranks own them (one-sided put of a patch, counted)
    C.put_patch((int(rows[0]), int(cols[0])), (int(rows[-1]) + 1, int(cols[-1]) + 1), out)
    C.sync()
    world.barrier()


def launch(a) -> None:
    """The driver: every kernel x block size x rank count, a table, a figure, reports."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MPIR_CVAR_ENABLE_HEAVY_YIELD="1",
               PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    a.out.mkdir(parents=True, exist_ok=True)
    for kernel in KERNELS:
        for block in a.blocks:
            for p in a.ranks:
                d = a.out / f"{kernel}_b{block}_{p}r"
                cmd = [str(mpiexec), "-n", str(p), sys.executable, __file__, "--kernel", kernel, "--n", str(a.n),
                       "--block", str(block), "--profile", str(d)]
                load = os.getloadavg()[0]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=1800)
                if proc.returncode != 0:
                    sys.exit(f"error: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
                row = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
                rows.append({**row, "load_before": load, "profile": str(d)})
    rows += ga_rows(a)
    print(f"{'kernel':12s} {'block':>5s} {'P':>2s} {'seconds':>8s} {'MiB/rank':>9s} {'bound':>7s} {'gets':>7s} "
          f"{'accs':>7s} {'E(N)':>6s} {'error':>8s} {'load':>5s}")
    for r in rows:
        print(f"{r['kernel']:12s} {r['block']:5d} {r['ranks']:2d} {r['seconds']:8.3f} "
              f"{r['bytes_per_rank'] / 2**20:9.2f} {r['bound_bytes_per_rank'] / 2**20:7.2f} {r['gets']:7d} "
              f"{r['accs']:7d} {r.get('efficiency', float('nan')):6.3f} {r['max_error']:8.1e} {r['load_before']:5.1f}")
    for r in rows:                   # Tessera / GA, same kernel, block and ranks, same run of this script
        peer = next((g for g in rows if g["kernel"] == "ga-" + r["kernel"] and g["block"] == r["block"]
                     and g["ranks"] == r["ranks"]), None)
        if peer:
            r["seconds_over_ga"] = r["seconds"] / peer["seconds"]
            print(f"tessera/GA {r['kernel']:9s} b={r['block']:<4d} P={r['ranks']}: {r['seconds_over_ga']:.2f}x")
    (a.out / "study.json").write_text(json.dumps({"rows": rows, "n": a.n, "load_average": os.getloadavg(),
                                                  "cores": os.cpu_count()}, indent=1))
    figure(rows, a.out / "proxy.png")
    if len(a.ranks) > 1:
        for kernel in KERNELS:
            dirs = [r["profile"] for r in rows if r["kernel"] == kernel and r["block"] == a.blocks[0]]
            subprocess.run([str(Path(sys.executable).parent / "tessera"), "report", *dirs, "--out",
                            str(a.out / f"report_{kernel}")], check=True, env=env, stdout=subprocess.DEVNULL)
    print(f"wrote {a.out}/study.json, {a.out}/proxy.png")


def ga_rows(a) -> list:
    """The Global Arrays peer (bench/ga/ga_proxy.c, built here as bench/runtime_bench.py
    builds its peer) for original and inverted; [] with the reason printed when Debian's
    GA packages are missing."""
    sys.path.insert(0, str(HERE))
    from runtime_bench import GA_LIBS, GA_PACKAGES, ga_missing
    missing = ga_missing()
    if missing:
        print(f"GA peer skipped: missing {', '.join(missing)} (apt-get install {' '.join(GA_PACKAGES)})")
        return []
    exe = HERE / "ga" / "build" / "ga_proxy"
    exe.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mpicc.openmpi", "-O2", "-o", str(exe), str(HERE / "ga" / "ga_proxy.c"), *GA_LIBS], check=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    for kernel in ("original", "inverted"):
        for block in a.blocks:
            for p in a.ranks:
                cmd = ["mpirun.openmpi", "--oversubscribe", "--bind-to", "none", "-n", str(p), str(exe), kernel,
                       str(a.n), str(block)]
                load = os.getloadavg()[0]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
                if proc.returncode != 0:
                    sys.exit(f"error: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
                row = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
                rows.append({**row, "bound_bytes_per_rank": matmul_bound_bytes(a.n**3, p), "load_before": load,
                             "command": " ".join(cmd)})
    return rows


def figure(rows: list, path: Path) -> None:
    """Per rank count: MiB moved per rank and seconds against the block size; the bound's
    leading term 3n^2/P^(2/3) and, dotted, less the 3n^2/P words a rank already owns."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ranks = sorted({r["ranks"] for r in rows})
    fig, axes = plt.subplots(2, len(ranks), figsize=(4.5 * len(ranks), 6.4), squeeze=False)
    for col, p in enumerate(ranks):
        ax_b, ax_t = axes[0][col], axes[1][col]
        for kernel in KERNELS + ("ga-original", "ga-inverted"):
            rs = sorted((r for r in rows if r["kernel"] == kernel and r["ranks"] == p), key=lambda r: r["block"])
            if not rs:
                continue
            ax_b.plot([r["block"] for r in rs], [r["bytes_per_rank"] / 2**20 for r in rs], "o-", label=kernel)
            ax_t.plot([r["block"] for r in rs], [r["seconds"] for r in rs], "o-", label=kernel)
        if p > 1:
            lead = next(r["bound_bytes_per_rank"] for r in rows if r["ranks"] == p) / 2**20
            n = next(r["n"] for r in rows)
            ax_b.axhline(lead, color="grey", ls="--", label="3n²/P^(2/3)")
            ax_b.axhline(lead - 8 * 3 * n**2 / p / 2**20, color="grey", ls=":", label="… − 3n²/P owned")
        ax_b.set_title(f"MiB moved per rank, P = {p}", fontsize=10)
        ax_t.set_title(f"seconds, P = {p}", fontsize=10)
        blocks = sorted({r["block"] for r in rows})
        for ax in (ax_b, ax_t):
            ax.set_xlabel("block size b")
            ax.set_xticks(blocks)
        ax_b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=768)
    p.add_argument("--blocks", type=int, nargs="+", default=[48, 96, 192])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--out", type=Path, default=HERE / "results" / "proxy")
    p.add_argument("--kernel", choices=KERNELS, help="run one kernel (under mpiexec)")
    p.add_argument("--block", type=int)
    p.add_argument("--profile")
    a = p.parse_args()
    for b in ([a.block] if a.kernel else a.blocks):
        if not b or a.n % b:
            sys.exit(f"error: block size {b} must divide n = {a.n}")
    run_kernel(a) if a.kernel else launch(a)


if __name__ == "__main__":
    main()
