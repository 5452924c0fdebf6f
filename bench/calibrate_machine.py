"""Measure this machine's constants for the cost model of `tessera plan --ranks`.

    .venv/bin/python bench/calibrate_machine.py [--out src/tessera/backends/machine.json]

Writes (what ``tessera.backends.machine.Machine.calibrated`` reads):
  gemm_flops_per_second  single-thread DGEMM, 256^3 (best of five; backends.cost_model.gemm_rate)
  task_seconds           Python work per block product of a contraction on the one-sided
                         executor (1 rank, loop order original): (wall - flops / gemm
                         rate) / block products, for a contraction of many small blocks
                         (tile 4)
  get_seconds            one-sided get of an 8 KiB block owned by the other of 2 ranks,
  acc_seconds            and accumulate (bench/runtime_kernels.py latency, private windows
                         TESSERA_WINDOW=create: through MPI as between nodes)
  copy_bytes_per_second  8 MiB get between the 2 ranks of this node
  collective_seconds     one small allreduce on 2 ranks
  exchange_seconds       one exchange (all-to-all or grid broadcast) of mpi-collective as a CCSD iteration
                         meets it (2 ranks, water cc-pVDZ, tile 48, `tessera run --backend mpi-collective
                         --profile`): an iteration's wall over its exchanges (its compute is negligible:
                         the latency, the wait for the later rank and the executor's work around each),
                         median over iterations 4 on; best of three runs
  exchange_peer_seconds  what one more rank adds to an exchange on P ranks: on 2 ranks (no rank
                         waits for a core), the slope of an exchange of k messages of 4 KiB each
                         way (k = 1..16, non-blocking, wait for all) over k; best of three
  barrier_log2_seconds   a barrier on 2 ranks: one of the ceil(log2 P) rounds of a barrier on P;
                         ``--scaling-only`` measures both alone and updates ``--out``
  gemm_thread_efficiency DGEMM rate of the same 256^3 product on this machine's cores (threads_measured
                         says how many) over that many times the single-thread rate, best of
                         THREAD_ROUNDS rounds of both (``thread_efficiency``); the cost model takes
                         it for any threads per rank; ``--threads-only`` measures it alone and
                         updates ``--out``
  triples_task_seconds   Python work per distributed (T) task (1 rank, mpi-onesided cached, whole
                         rows): water trimer 6-31G, task tile 1 (680 tasks) against task tile 2
                         (120 tasks), the same flops: wall difference / task difference (best of
                         three); ``--triples-only`` measures it alone and updates ``--out``
with host, date and load average. Timings on a shared machine vary: rerun idle. The
network between nodes is not measured (options of `tessera plan`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
MPIEXEC = Path(sys.executable).parent / "mpiexec"
ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "TESSERA_WINDOW": "create",
       "PYTHONPATH": str(REPO / "src")}


def task_seconds() -> None:
    """Under mpiexec -n 1: Python work per block product of the one-sided executor (as JSON)."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    import tessera as ts
    from tessera.backends.cost_model import gemm_rate
    from tessera.backends.context import Context
    from tessera.tensor.block_tensor import BlockTensor
    from tessera.tensor.space import IndexSpace
    rate = gemm_rate()
    o = IndexSpace.from_irreps("o", np.zeros(16, dtype=int), 4)
    v = IndexSpace.from_irreps("v", np.zeros(32, dtype=int), 4)
    best = 1e9
    with threadpool_limits(limits=1, user_api="blas"), Context("mpi-onesided", variant="original"):
        rng = np.random.default_rng(0)
        a, b = BlockTensor.random((o, o, v, v), 0, rng=rng), BlockTensor.random((v, v, v, v), 0, rng=rng)
        for _ in range(3):
            t0 = time.perf_counter()
            ts.einsum("ijcd,abcd->ijab", a, b)
            best = min(best, time.perf_counter() - t0)
    products = 4 ** 2 * 8 ** 4                     # (i j) x (a b) output blocks x (c d) inner
    flops = 2 * 16 ** 2 * 32 ** 4
    print(json.dumps({"seconds": max(1e-7, (best - flops / rate) / products)}))


def triples_task_seconds() -> None:
    """Under mpiexec -n 1: Python work per distributed (T) task (as JSON): the wall time of
    many small tasks less that of few large ones, the same flops, per task more."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from tessera.backends.context import Context
    from tessera.chem.integrals import transform
    from tessera.chem.molecule import Molecule
    from tessera.chem.pyscf_reference import rhf_reference
    from tessera.chem.triples import triples_correction
    from tessera.tensor.block_tensor import BlockTensor
    ref = rhf_reference(Molecule.from_xyz(str(REPO / "examples" / "water_trimer.xyz"), basis="6-31g").to_pyscf())
    best = {}
    with threadpool_limits(limits=1, user_api="blas"), Context("mpi-onesided", variant="cached") as ctx:
        ints = transform(ref, 0, 16)
        no, nv = ints.o.dim, ints.v.dim
        rng = np.random.default_rng(0)
        t2 = 1e-3 * rng.standard_normal((no, no, nv, nv))
        t1 = BlockTensor.from_dense(1e-3 * rng.standard_normal((no, nv)), (ints.o, ints.v), name="t1")
        t2 = BlockTensor.from_dense(t2 + t2.transpose(1, 0, 3, 2), (ints.o, ints.o, ints.v, ints.v), name="t2")
        for _ in range(3):
            for tile in (1, 2):
                t0 = time.perf_counter()
                res = triples_correction(ints, t1, t2, context=ctx, occ_tile=tile)
                wall = time.perf_counter() - t0
                if tile not in best or wall < best[tile][0]:
                    best[tile] = (wall, res.tasks)
    (w1, n1), (w2, n2) = best[1], best[2]
    print(json.dumps({"seconds": max(1e-7, (w1 - w2) / (n1 - n2)), "tasks": [n1, n2], "walls": [w1, w2]}))


THREAD_ROUNDS = 20   # rounds of single- and multi-thread timings in ``thread_efficiency``


def thread_efficiency() -> dict:
    """The DGEMM rate on all of this machine's cores over that many times the single-thread
    rate (``backends.cost_model.gemm_seconds``, unclamped), each the best of THREAD_ROUNDS
    rounds taken in turn, with when, the threads and the load."""
    from tessera.backends.cost_model import gemm_seconds
    threads = os.cpu_count() or 1
    one, many = 1e9, 1e9
    for _ in range(THREAD_ROUNDS):
        one, many = min(one, gemm_seconds(1)), min(many, gemm_seconds(threads))
    return {"gemm_thread_efficiency": one / (threads * many),
            "threads_measured": f"{platform.node()}, {time.strftime('%Y-%m-%d')}, {threads} threads, load "
                                f"{round(os.getloadavg()[0], 2)}; 1 thread {one * 1e6:.0f} us, "
                                f"{threads} threads {many * 1e6:.0f} us per 256^3 DGEMM"}


def mpi_json(args: list, nranks: int = 2) -> dict:
    proc = subprocess.run([str(MPIEXEC), "-n", str(nranks), sys.executable, *args], capture_output=True, text=True,
                          env=dict(os.environ, **ENV), timeout=600, cwd=str(REPO))
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed: {proc.stderr[-2000:]}")
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def collective() -> None:
    """Under mpiexec: seconds per small allreduce (best of three loops), as JSON on rank 0."""
    from tessera.runtime import World
    world = World.get()
    best = 1e9
    for _ in range(3):
        world.comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(2000):
            world.comm.allreduce(1)
        best = min(best, (time.perf_counter() - t0) / 2000)
    if world.rank == 0:
        print(json.dumps({"seconds": best}))
    world.stop()


MESSAGES = (1, 2, 4, 8, 16)     # messages each way per exchange in ``scaling``
MESSAGE_BYTES = 4096           # bytes per message
SCALING_CALLS = 500


def scaling() -> None:
    """Under mpiexec -n 2: seconds per exchange of k messages of MESSAGE_BYTES each way
    (k non-blocking sends to and receives from the other rank, then wait for all), for k
    in MESSAGES, and per ``World.barrier``: the slowest rank's loop of SCALING_CALLS calls
    over the calls, best of three loops; as JSON on rank 0."""
    import numpy as np

    from tessera.runtime import World
    world = World.get()
    comm, MPI, peer = world.comm, world._MPI, 1 - world.rank
    send = np.ones(MESSAGE_BYTES // 8)
    recv = [np.empty_like(send) for _ in range(max(MESSAGES))]

    def exchange(k):
        reqs = [comm.Irecv(recv[t], source=peer, tag=t) for t in range(k)]
        reqs += [comm.Isend(send, dest=peer, tag=t) for t in range(k)]
        MPI.Request.Waitall(reqs)

    def best(op) -> float:
        out = 1e9
        for _ in range(3):
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(SCALING_CALLS):
                op()
            out = min(out, max(comm.allgather(time.perf_counter() - t0)) / SCALING_CALLS)
        return out
    out = {"messages": {k: best(lambda: exchange(k)) for k in MESSAGES}, "barrier": best(world.barrier)}
    if world.rank == 0:
        print(json.dumps(out))
    world.stop()


def fit_line(x: list, y: list) -> tuple:
    """(intercept, slope) of the least-squares line through the points (x, y)."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)
    return my - slope * mx, slope


def scaling_constants() -> dict:
    """How an exchange and a barrier grow with the ranks, from 2 ranks (no rank waits for a
    core): ``exchange_peer_seconds``, the slope of an exchange's seconds over its messages
    each way (``scaling``; an all-to-all among P ranks sends and receives P - 1), and
    ``barrier_log2_seconds``, a barrier of 2 ranks: one of the log2 P rounds of a
    dissemination barrier; best of three launches."""
    runs = [mpi_json([__file__, "--scaling"]) for _ in range(3)]
    seconds = {k: min(r["messages"][str(k)] for r in runs) for k in MESSAGES}
    _, peer = fit_line(list(seconds), list(seconds.values()))
    return {"exchange_peer_seconds": max(0.0, peer), "barrier_log2_seconds": min(r["barrier"] for r in runs),
            "scaling_measured": f"{time.strftime('%Y-%m-%d')}, load {round(os.getloadavg()[0], 2)}; "
                                f"exchange of k x {MESSAGE_BYTES} B each way on 2 ranks: " +
                                ", ".join(f"k={k} {s * 1e6:.1f} us" for k, s in seconds.items())}


def exchange_seconds() -> dict:
    """Seconds per exchange (all-to-all or grid broadcast) of mpi-collective inside a CCSD
    iteration of water cc-pVDZ on 2 ranks, tile 48: an iteration's wall over the exchanges
    it makes (its compute, 1.4 MFLOP, is negligible: the exchanges' latency, the wait for
    the later rank and the executor's work around each), the median over iterations 4 on
    (the first ones make the plans) of both ranks' ``--profile`` records; best of three runs."""
    import statistics
    import tempfile
    best = None
    for _ in range(3):
        with tempfile.TemporaryDirectory() as out:
            cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "tessera.cli.main", "run",
                   str(REPO / "examples" / "water.xyz"), "--basis", "cc-pvdz", "--method", "ccsd", "--max-iter", "50",
                   "--backend", "mpi-collective", "--tile", "48", "--profile", out, "-q"]
            run = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, **ENV), timeout=600, cwd=out)
            if run.returncode:
                raise SystemExit(f"{' '.join(cmd)} failed: {run.stderr.strip().splitlines()[-1:]}")
            per = []
            for rank in (0, 1):
                try:
                    rec = json.loads((Path(out) / f"records.{rank}.json").read_text())
                except OSError:
                    raise SystemExit(f"{' '.join(cmd)} wrote no profile") from None
                reg, ops = rec["regions"], rec["ops"]
                starts = [t for op, t in zip(ops["op"], ops["start"]) if op in ("alltoallv", "bcast_row", "bcast_col")]
                for name, t, dt in zip(reg["name"], reg["start"], reg["seconds"]):
                    if name == "CCSD iteration":
                        n = sum(t <= x < t + dt for x in starts)
                        per.append(dt / n if n else None)
            per = [p for p in per[3:len(per) // 2] + per[len(per) // 2 + 3:] if p is not None]
            if not per:
                raise SystemExit(f"{' '.join(cmd)} recorded no exchange in CCSD iterations 4 on")
            seconds = statistics.median(per)
            if best is None or seconds < best["seconds"]:
                best = {"seconds": seconds, "iterations": len(per)}
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "src" / "tessera" / "backends" / "machine.json"))
    ap.add_argument("--collective", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tasks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--triples", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scaling", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--triples-only", action="store_true",
                    help="measure triples_task_seconds alone and update it (with its date and load) in --out")
    ap.add_argument("--exchange-only", action="store_true",
                    help="measure exchange_seconds alone and update it (with its date and load) in --out")
    ap.add_argument("--scaling-only", action="store_true",
                    help="measure exchange_peer_seconds and barrier_log2_seconds alone and update them in --out")
    ap.add_argument("--threads-only", action="store_true",
                    help="measure gemm_thread_efficiency alone and update it (with threads_measured) in --out")
    args = ap.parse_args(argv)
    if args.collective:
        return collective()
    if args.tasks:
        return task_seconds()
    if args.triples:
        return triples_task_seconds()
    if args.scaling:
        return scaling()
    load = round(os.getloadavg()[0], 2)
    if args.exchange_only:
        exchange = {"exchange_seconds": exchange_seconds()["seconds"],
                    "exchange_measured": f"{time.strftime('%Y-%m-%d')}, load {load}"}
        out = {**json.loads(Path(args.out).read_text()), **exchange}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return print(json.dumps(out, indent=1))
    if args.scaling_only or args.threads_only:
        out = {**json.loads(Path(args.out).read_text()),
               **(scaling_constants() if args.scaling_only else thread_efficiency())}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return print(json.dumps(out, indent=1))
    triples = {"triples_task_seconds": mpi_json([__file__, "--triples"], 1)["seconds"],
               "triples_task_measured": f"{time.strftime('%Y-%m-%d')}, load {load}"}
    if args.triples_only:
        out = {**json.loads(Path(args.out).read_text()), **triples}
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
        return print(json.dumps(out, indent=1))
    from tessera.backends.cost_model import gemm_rate
    rate = gemm_rate()
    lat = mpi_json([str(REPO / "bench" / "runtime_kernels.py"), "latency"])["rows"]
    at = {(r["op"], r["bytes"]): r["seconds"] for r in lat}
    big = max(b for op, b in at if op == "get")
    out = {"gemm_flops_per_second": rate, "task_seconds": mpi_json([__file__, "--tasks"], 1)["seconds"],
           "get_seconds": at[("get", 8192)], "acc_seconds": at[("acc", 8192)],
           "collective_seconds": mpi_json([__file__, "--collective"])["seconds"],
           "exchange_seconds": exchange_seconds()["seconds"], **scaling_constants(),
           "copy_bytes_per_second": big / at[("get", big)], **triples, **thread_efficiency(),
           "host": platform.node(), "date": time.strftime("%Y-%m-%d"), "load": round(os.getloadavg()[0], 2),
           "command": "python bench/calibrate_machine.py"}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
