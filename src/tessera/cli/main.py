"""``tessera run | plan | report``: the command line.

Errors are one line on stderr and a non-zero exit code; ``--debug`` shows tracebacks.
Under ``mpiexec`` every rank runs the same command; only rank 0 prints and writes the
JSON file (other ranks log warnings and errors only).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from tessera.backends.registry import DEFAULT_BACKEND, DEFAULT_SCHEDULE
from tessera.errors import TesseraError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera", description="Block-sparse coupled-cluster calculations.")
    p.add_argument("--version", action="version", version=f"tessera {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("run", "run a calculation"), ("plan", "print the plan of one CCSD iteration")):
        s = sub.add_parser(name, help=text)
        s.add_argument("geometry", help="XYZ file (Angstrom, or see --units), Z-matrix (.zmat), "
                                        "QCSchema molecule or AtomicInput (.json), or FCIDUMP")
        s.add_argument("--units", default="angstrom", help="of an XYZ or Z-matrix geometry: angstrom | bohr")
        s.add_argument("--basis", default="cc-pvdz")
        s.add_argument("--method", default="ccsd(t)", help="hf | ccsd | ccsd(t)")
        s.add_argument("--charge", type=int, default=0)
        s.add_argument("--frozen-core", action="store_true", help="freeze the chemical core orbitals")
        s.add_argument("--backend", default=DEFAULT_BACKEND,
                       help="auto (default: threads on one process, a cost-model choice under mpiexec) | serial | threads | mpi-onesided | mpi-collective")
        s.add_argument("--variant", default=None,
                       help="mpi-onesided loop order: original | inverted | cached; "
                            "mpi-collective: summa | 2.5d (default: the cost model's choice)")
        s.add_argument("--schedule", default=None, help="mpi-onesided task schedule: nxtval | steal "
                                                        f"(default {DEFAULT_SCHEDULE})")
        s.add_argument("--tile", type=int, default=None,
                       help="largest tile (orbitals per block edge); default 32, or chosen by the "
                            "cost model for the MPI backends")
        s.add_argument("--conv", type=float, default=1e-8, help="CCSD energy convergence (Eh)")
        s.add_argument("--max-iter", type=int, default=50, help="CCSD iterations at most")
        s.add_argument("--no-symmetry", action="store_true", help="run in C1")
        s.add_argument("--scf", default="tessera", help="tessera (own distributed RHF) | pyscf")
        s.add_argument("--scf-schedule", default="steal", help="static | nxtval | steal (with --scf tessera)")
        s.add_argument("--scf-max-iter", type=int, default=100)
        s.add_argument("--max-memory", metavar="SIZE", default=None,
                       help="memory per rank a run may use: MiB, or with a unit (500M, 8G); a run "
                            "estimated to need more is refused before the SCF (default: the memory "
                            "available now, shared by the ranks)")
        s.add_argument("--json", metavar="FILE", help="write the results as JSON")
        s.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
        if name == "run":
            s.add_argument("--plan-only", action="store_true", help="print the plan and stop")
            s.add_argument("--checkpoint", metavar="FILE", default=None,
                           help="HDF5 checkpoint written at every CCSD iteration (default: next to "
                                "the JSON as <json stem>.chk.h5, else ./tessera.chk.h5)")
            s.add_argument("--restart", action="store_true",
                           help="resume from the checkpoint (no SCF: its orbitals are used)")
            s.add_argument("--threads", type=_positive_int, default=None,
                           help="threads per rank (BLAS and the threads backend); default "
                                "OMP_NUM_THREADS, else all cores (1 BLAS thread per MPI rank)")
            s.add_argument("--qcschema", metavar="FILE", help="write a QCSchema AtomicResult (JSON)")
            s.add_argument("--fcidump-out", metavar="FILE", help="write the integrals as an FCIDUMP")
            s.add_argument("--molden", metavar="FILE", help="write the orbitals in Molden format")
            s.add_argument("--profile", metavar="DIR",
                           help="write DIR/result.json, DIR/records.json (+ one records.<rank>.json "
                                "per rank) and DIR/trace.json (Chrome trace); see docs/profile.md")
            s.add_argument("--progress", default=None,
                           help="MPI progress: none | thread | ghost (default: $TESSERA_PROGRESS or none)")
            s.add_argument("--ghosts", type=int, default=None,
                           help="ghost ranks per node with --progress ghost (default 1)")
    r = sub.add_parser("report", help="summarise and plot profiles written by run --profile")
    r.add_argument("dirs", nargs="+", metavar="DIR", help="profile directories (several: a scaling study)")
    r.add_argument("--out", metavar="OUTDIR", help="where report.txt, report.html and the figures go "
                                                  "(default: the single DIR, or ./report)")
    r.add_argument("--debug", action="store_true", help="show tracebacks")
    return p


def _version() -> str:
    from tessera import __version__
    return __version__


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise TesseraError(f"--threads {text!r} is not a positive integer; expected e.g. --threads 4")
    return int(text)


def _checkpoint_path(args) -> str | None:
    """--checkpoint, or its default: <json stem>.chk.h5 beside the JSON, else ./tessera.chk.h5."""
    if args.command != "run" or args.plan_only:
        return None
    if args.checkpoint is not None:
        if args.json and args.checkpoint.strip() and Path(args.checkpoint).resolve() == Path(args.json).resolve():
            raise TesseraError(f"--checkpoint {args.checkpoint} is also the --json file; choose another name")
        return args.checkpoint
    if args.json:
        json_path = Path(args.json)
        return str(json_path.with_name(json_path.stem + ".chk.h5"))
    return "tessera.chk.h5"


def _options(args):
    from tessera.chem.job import RunOptions
    return RunOptions(checkpoint=_checkpoint_path(args), restart=getattr(args, "restart", False),
                      max_memory=args.max_memory,
                      geometry=args.geometry, basis=args.basis, method=args.method, charge=args.charge,
                      frozen_core=args.frozen_core, backend=args.backend, tile=args.tile, conv=args.conv,
                      variant=args.variant, schedule=args.schedule,
                      max_iter=args.max_iter, symmetry=not args.no_symmetry, scf=args.scf,
                      scf_schedule=args.scf_schedule, scf_max_iter=args.scf_max_iter, units=args.units)


class PrintReport:
    """Prints progress as tables on stdout."""

    def options(self, options: dict) -> None:
        print("Options: " + ", ".join(f"{k}={v}" for k, v in options.items()))

    def molecule(self, d: dict) -> None:
        print(f"\nMolecule: {len(d['molecule']['atoms'])} atoms, charge {d['molecule']['charge']}, "
              f"point group {d['molecule']['point_group_full']} -> using {d['point_group']}")
        for sym, xyz in d["molecule"]["atoms"]:
            print(f"  {sym:2s} {xyz[0]:12.6f} {xyz[1]:12.6f} {xyz[2]:12.6f}")
        print(f"Basis {d['basis']}: {d['nao']} functions; {d['nocc']} occupied "
              f"({d['frozen_core']} frozen), {d['nvir']} virtual")
        print("  occupied per irrep: " + ", ".join(f"{k} {v}" for k, v in d["occupied_per_irrep"].items()))
        print("  virtual per irrep:  " + ", ".join(f"{k} {v}" for k, v in d["virtual_per_irrep"].items()))
        extra = ", ".join(f"{k} {d[k]}" for k in ("variant", "schedule") if d.get(k))
        print(f"Backend {d['backend']}{' (' + extra + ')' if extra else ''} on {d.get('ranks', 1)} rank(s), "
              f"{d['threads_per_rank']} thread(s) per rank, tile {d['tile']}"
              + (f" (occupied {d['occ_tile']})" if d.get("occ_tile") != d["tile"] else ""))
        if "auto" in d:
            from tessera.backends.auto import render
            print(render(d["auto"], limit=6))

    def memory(self, estimate) -> None:
        print(estimate.render())

    def scf(self, d: dict) -> None:
        print(f"\nRHF ({d['source']}): E = {d['e_hf']:.10f} Eh  ({d['seconds']:.2f} s)")

    def iteration(self, row: dict) -> None:
        if not getattr(self, "_table_started", False):       # also when a restart resumes
            self._table_started = True
            print(f"\n{'iter':>4s} {'E(corr)':>18s} {'change':>11s} {'residual':>10s} {'seconds':>8s} {'GFLOP/s':>8s}")
        print(f"{row['iter']:4d} {row['e_corr']:18.12f} {row['delta']:11.3e} {row['residual']:10.3e} "
              f"{row['seconds']:8.2f} {row.get('gflops_per_s', 0.0):8.1f}")

    def energies(self, e: dict, t: dict) -> None:
        print()
        names = {"hf": "E(RHF)", "ccsd_correlation": "E(CCSD) correlation", "t_correction": "E(T) correction",
                 "total": "E total"}
        for k, label in names.items():
            if k in e:
                print(f"{label:22s} {e[k]:18.10f} Eh")
        print("Timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))


def print_communication(data: dict, limit: int = 12) -> None:
    """Per-term gets, accumulates and bytes (summed over ranks), busiest terms first."""
    comm = data["communication"]
    print(f"\nCommunication ({data['backend']}, {data.get('ranks', 1)} ranks; counts summed over ranks)")
    print(f"{'gets':>9s} {'accs':>9s} {'MiB moved':>10s} {'collective MiB':>14s}  update")
    rows = sorted(comm["per_term"], key=lambda r: -r["bytes_moved"])
    for r in rows[:limit] + [{"update": "total", **comm["total"]}]:
        coll = sum(c["bytes"] for c in r["collectives"].values())
        print(f"{r['gets']:9d} {r['accs']:9d} {r['bytes_moved'] / 2**20:10.2f} {coll / 2**20:14.2f}  "
              f"{r['update'][:90]}")
    mem = data.get("memory_per_rank")
    if mem:
        print("Memory per rank (T2 + integrals, MiB): "
              + ", ".join(f"{b / 2**20:.1f}" for b in mem["total"])
              + f"; max/mean {mem['max_over_mean']:.2f}")


def _rank(backend: str, progress: str | None = None, ghosts: int | None = None) -> int:
    """This process's rank when the backend runs over MPI (0 otherwise); starts MPI only
    then, with the progress mode and ghost ranks asked for (a ghost rank serves its node
    inside World.get and exits there)."""
    from tessera.backends.context import ranks_of
    from tessera.backends.registry import runs_distributed
    if progress is not None or ghosts is not None:
        if not runs_distributed(backend):
            raise TesseraError(f"--progress/--ghosts apply to MPI runs; backend {backend!r} runs in "
                               "one process. Use --backend mpi-onesided or mpi-collective under mpiexec")
        from tessera.runtime import World
        World.get(progress=progress, ghosts=ghosts)
    return ranks_of(backend).rank


def _world():
    """The running MPI world, or None (never starts MPI)."""
    module = sys.modules.get("tessera.runtime.world")
    return module.World.current() if module is not None else None


def _run(args) -> int:
    from tessera.chem.job import Job, Report
    from tessera.profile import run as run_profile
    from tessera.profile.records import Recorder
    if getattr(args, "threads", None):
        os.environ["OMP_NUM_THREADS"] = str(args.threads)     # read by the executors
    options = _options(args)
    if args.command == "run":
        from tessera.chem.fcidump import is_fcidump
        from tessera.chem.outputs import check_outputs
        check_outputs(is_fcidump(args.geometry), qcschema=args.qcschema, molden=args.molden)
    rank = _rank(options.backend, getattr(args, "progress", None), getattr(args, "ghosts", None))
    if rank != 0:
        logging.getLogger().setLevel(logging.ERROR)
    if getattr(args, "plan_only", False) or args.command == "plan":
        from tessera.cli.plan import print_plan
        print_plan(options, rank)
        return 0
    profile_dir = getattr(args, "profile", None)
    recorder = Recorder(detailed=profile_dir is not None)
    world = _world()
    if profile_dir is not None:
        run_profile.prepare(profile_dir)
        if world is not None:
            world.comm_log.record_events(recorder.t0)
    result = Job(options, PrintReport() if rank == 0 else Report(), recorder).kernel()
    if rank == 0 and result.data.get("communication"):
        print_communication(result.data)
    t_write = time.perf_counter()
    summary = run_profile.finish(recorder, _world(), profile_dir, result.data)
    t_write = time.perf_counter() - t_write
    if rank == 0:
        print(run_profile.render_table(summary))
        result.data["statistics"] = summary
        if profile_dir is not None:
            print(f"Profile written to {profile_dir}/ in {t_write:.2f} s after the run "
                  f"(tessera report {profile_dir})")
    if args.json and rank == 0:
        try:
            with open(args.json, "w") as f:
                json.dump(result.data, f, indent=1, default=float)
        except OSError as err:
            raise TesseraError(f"cannot write --json {args.json}: {err.strerror}") from None
    if rank == 0:
        from tessera.chem.outputs import write_outputs
        write_outputs(result, qcschema=args.qcschema, fcidump=args.fcidump_out, molden=args.molden)
    if not result.converged:
        if rank == 0:
            print(f"error: {result.error}", file=sys.stderr)
        return 1
    return 0


ERROR_GRACE_SECONDS = 2.0


def _running_world():
    """The MPI world when one was started with several processes, else None (never starts MPI)."""
    module = sys.modules.get("tessera.runtime.world")
    world = module.World.current() if module is not None else None
    return world if world is not None and world.full_size > 1 else None


def _abort_all(world, err) -> None:
    """An error after MPI started may have been raised on some ranks only: the others would
    wait forever in their next collective. Report it once and end every rank (exit 2).
    Rank 0 speaks at once; another rank first waits a moment, so an error that every rank
    raised is printed once, by rank 0."""
    if world.rank != 0:
        time.sleep(ERROR_GRACE_SECONDS)
    suffix = f" (on rank {world.rank})" if world.rank else ""
    print(f"error: {err}{suffix}", file=sys.stderr, flush=True)
    world.abort(2)


def main(argv=None) -> int:
    try:
        args = _parser().parse_args(argv)
    except TesseraError as err:          # an option's own check (argparse types)
        print(f"error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "report":
            from tessera.profile.report import report
            report(args.dirs, args.out)
            return 0
        return _run(args)
    except TesseraError as err:
        if args.debug:
            raise
        world = _running_world()
        if world is not None:
            _abort_all(world, err)
        if os.environ.get("PMI_RANK", "0") == "0":     # under mpiexec: rank 0 speaks
            print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
