"""``tessera run | plan | report``: the command line.

Errors are one line on stderr and a non-zero exit code (EXIT_CODES); ``--debug`` shows
tracebacks. Under ``mpiexec`` every rank runs the same command; only rank 0 prints and
writes the JSON file (other ranks log warnings and errors only). The JSON is rewritten
after each phase (``chem.outcome``); an internal error leaves the finished phases there and
its traceback next to it; SIGINT/SIGTERM end every rank at once (``cli.interrupt``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
import time
from pathlib import Path

from tessera.backends.registry import DEFAULT_BACKEND, DEFAULT_SCHEDULE
from tessera.chem.outcome import (EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_NOT_CONVERGED, EXIT_OK,
                                 EXIT_SIGNAL_BASE, WRITE_LOCK, ResultFile, check_output_path)
from tessera.errors import TesseraError

EXIT_CODES = f"""exit codes:
  {EXIT_OK}    finished (every phase converged)
  {EXIT_NOT_CONVERGED}    SCF or CCSD did not converge (the JSON holds what was reached, "converged": false)
  {EXIT_BAD_INPUT}    bad input: options, geometry, environment variables, an output file that cannot be written
  {EXIT_INTERNAL}    internal error (a bug: please report it with the traceback file written next to the JSON)
  {EXIT_SIGNAL_BASE + 2}, {EXIT_SIGNAL_BASE + 15}  interrupted by SIGINT or SIGTERM (every rank ends; finished phases stay in the JSON)"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera", description="Block-sparse coupled-cluster calculations.",
                                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"tessera {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("run", "run a calculation"), ("plan", "print the plan of one CCSD iteration")):
        s = sub.add_parser(name, help=text, epilog=EXIT_CODES if name == "run" else None,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
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
                       help="mpi-onesided loop order: original | inverted | cached | owner (gets only); "
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
        s.add_argument("--scf-mode", default="auto", help="auto (integrals in memory when each rank's "
                       "share fits the memory budget per rank, else direct) | incore | direct (with --scf tessera)")
        s.add_argument("--max-memory", metavar="SIZE", default=None,
                       help="memory per rank a run may use: MiB, or with a unit (500M, 8G); a run "
                            "estimated to need more is refused before the SCF, and the cost model "
                            "keeps within it (default: $TESSERA_MEMORY_PER_RANK_MB, else the memory "
                            "available now, shared by the ranks on this node)")
        s.add_argument("--json", metavar="FILE", help="write the results as JSON (rewritten after each phase)")
        s.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
        loud = s.add_mutually_exclusive_group()
        loud.add_argument("-v", "--verbose", action="store_true",
                          help="also show the SCF iterations and the library's progress lines")
        loud.add_argument("-q", "--quiet", action="store_true", help="print only the final energies")
        if name == "plan":     # a machine we do not have (cli/plan_ranks.py)
            s.add_argument("--ranks", metavar="P", help="simulate P ranks: per-rank memory of every tensor "
                           "class and (T), tasks per rank, bytes per rank and time of each executor")
            s.add_argument("--ranks-per-node", metavar="N", help="with --ranks: ranks per node (default all on one)")
            s.add_argument("--memory-per-node", metavar="SIZE", help="with --ranks: memory of a node, e.g. "
                           "512GB (default half of this machine's)")
            s.add_argument("--network-bandwidth", metavar="GB/s", help="with --ranks: bandwidth per node "
                           "between nodes, GB/s (default 12.5)")
            s.add_argument("--network-latency", metavar="US", help="with --ranks: latency between nodes, "
                           "microseconds (default 2)")
            s.add_argument("--threads-per-rank", metavar="T", help="with --ranks: BLAS threads per rank "
                           "(tessera run --threads), each rank's DGEMM rate T x one thread's x the measured "
                           "efficiency; ranks per node x T must not exceed a node's cores (default 1)")
        if name == "run":
            s.add_argument("--plan-only", action="store_true", help="print the plan and stop")
            s.add_argument("--checkpoint", metavar="FILE", default=None,
                           help="HDF5 checkpoint of the orbitals and of CCSD: its first and last "
                                "iteration and those in between per --checkpoint-interval (default: "
                                "next to the JSON as <json stem>.chk.h5, else ./tessera.chk.h5)")
            s.add_argument("--checkpoint-interval", metavar="SECONDS", type=float, default=None,
                           help="write a CCSD iteration once this long has passed since the last "
                                "write (0: every iteration); default: once 50x the last write's "
                                "duration has passed (writes take at most ~2%% of CCSD)")
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
                           help="MPI progress: auto | none | thread | ghost (default: $TESSERA_PROGRESS or auto: "
                                "ghost when the ranks span several nodes, else none)")
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
                      checkpoint_interval=getattr(args, "checkpoint_interval", None),
                      max_memory=args.max_memory,
                      geometry=args.geometry, basis=args.basis, method=args.method, charge=args.charge,
                      frozen_core=args.frozen_core, backend=args.backend, tile=args.tile, conv=args.conv,
                      variant=args.variant, schedule=args.schedule,
                      max_iter=args.max_iter, symmetry=not args.no_symmetry, scf=args.scf,
                      scf_schedule=args.scf_schedule, scf_max_iter=args.scf_max_iter, units=args.units,
                      scf_mode=args.scf_mode)


class RunState:
    """What a failing or interrupted run needs to know: the phase running, the phases
    finished, the JSON result (written by rank 0 only)."""

    def __init__(self):
        self.phase = "setup"
        self.completed: list = []
        self.results = ResultFile(None)


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


def _simulated(args) -> bool:
    """``tessera plan`` for a simulated machine (--ranks and its companions)."""
    return any(getattr(args, k) is not None for k in ("ranks", "ranks_per_node", "memory_per_node",
                                                      "network_bandwidth", "network_latency", "threads_per_rank"))


def _world():
    """The running MPI world, or None (never starts MPI)."""
    module = sys.modules.get("tessera.runtime.world")
    return module.World.current() if module is not None else None


def _freeze_imports() -> None:
    """What the run's imports make (~56k objects of numpy, SciPy, PySCF) lives until the
    process ends: moved out of the collector's sight, each full collection of the run
    skips it, and so do the collections of the interpreter's teardown (which took 0.55 s
    after these imports, 0.12 s frozen, measured on a loaded machine). Only for a
    program: in another caller's process it would also keep that caller's garbage.
    Before them, the imports that a run never uses are deferred (``cli.deferred``)."""
    from tessera.cli.deferred import defer
    defer()
    import tessera.chem.job  # noqa: F401 - the heaviest of the run's imports
    gc.freeze()


def _run(args, state: RunState) -> int:
    from tessera.backends.registry import check_environment
    from tessera.chem.job import Job
    from tessera.profile import run as run_profile
    from tessera.profile.records import Recorder
    if getattr(args, "threads", None):
        os.environ["OMP_NUM_THREADS"] = str(args.threads)     # read by the executors
    check_environment()
    options = _options(args)
    if args.command == "plan" and _simulated(args):
        from tessera.cli.plan_ranks import print_simulation
        print_simulation(options, args)
        return EXIT_OK
    planning = getattr(args, "plan_only", False) or args.command == "plan"
    if not planning:
        from tessera.chem.fcidump import is_fcidump
        from tessera.chem.outputs import check_outputs
        check_outputs(is_fcidump(args.geometry), qcschema=args.qcschema, molden=args.molden)
    if not planning:         # every output file checked now, not after the run
        for flag, path in (("--json", args.json), ("--qcschema", args.qcschema),
                           ("--fcidump-out", args.fcidump_out), ("--molden", args.molden)):
            if path is not None:
                check_output_path(path, flag, inputs=[args.geometry])
        state.results = ResultFile(args.json)
    rank = _rank(options.backend, getattr(args, "progress", None), getattr(args, "ghosts", None))
    if rank != 0:
        logging.getLogger().setLevel(logging.ERROR)
        logging.getLogger("tessera").setLevel(logging.ERROR)
    elif not args.quiet:
        from tessera.cli.header import header_lines
        print("\n".join(header_lines(options.backend)))
    if planning:
        from tessera.cli.plan import print_plan
        print_plan(options, rank)
        return EXIT_OK
    profile_dir = getattr(args, "profile", None)
    recorder = Recorder(detailed=profile_dir is not None)
    world = _world()
    if profile_dir is not None:
        run_profile.prepare(profile_dir)
        if world is not None:
            world.comm_log.record_events(recorder.t0)
    from tessera.cli.report import PhaseReport, PrintReport
    report = PrintReport(state, quiet=args.quiet) if rank == 0 else PhaseReport(state)
    result = Job(options, report, recorder).kernel()
    state.phase = "output"
    if rank == 0 and result.data.get("communication") and not args.quiet:
        print_communication(result.data)
    t_write = time.perf_counter()
    summary = run_profile.finish(recorder, _world(), profile_dir, result.data)
    t_write = time.perf_counter() - t_write
    if rank == 0:
        if not args.quiet:
            print(run_profile.render_table(summary))
        result.data["statistics"] = summary
        if profile_dir is not None:
            print(f"Profile written to {profile_dir}/ in {t_write:.2f} s after the run "
                  f"(tessera report {profile_dir})")
    if rank == 0:
        state.results.save(result.data)
        from tessera.chem.outputs import write_outputs
        write_outputs(result, qcschema=args.qcschema, fcidump=args.fcidump_out, molden=args.molden)
    if not result.converged:
        if rank == 0:
            print(f"\n*** NOT CONVERGED: {result.error} ***")
            print(f"error: {result.error}", file=sys.stderr)
        return EXIT_NOT_CONVERGED
    return EXIT_OK


ERROR_GRACE_SECONDS = 2.0


def _running_world():
    """The MPI world when one was started with several processes, else None (never starts MPI)."""
    world = _world()
    return world if world is not None and world.full_size > 1 else None


def _abort_all(world, message: str, code: int = EXIT_BAD_INPUT) -> None:
    """An error after MPI started may have been raised on some ranks only: the others would
    wait forever in their next collective. Report it once and end every rank (exit
    ``code``). Rank 0 speaks at once; another rank first waits a moment, so an error that
    every rank raised is printed once, by rank 0."""
    if world.rank != 0:
        time.sleep(ERROR_GRACE_SECONDS)
    suffix = f" (on rank {world.rank})" if world.rank else ""
    print(f"{message}{suffix}", file=sys.stderr, flush=True)
    world.abort(code)


def _speaks() -> bool:
    """Whether this process prints an error that every rank raised before MPI started:
    rank 0 of a launch (runtime.launch), or the one process (a stray PMI_RANK without
    PMI_SIZE does not silence it)."""
    from tessera.runtime.launch import detect
    try:
        return detect().rank == 0
    except TesseraError:          # a malformed launcher variable: say it
        return True


def _fail(state: RunState, message: str, code: int, error: dict) -> int:
    """Report an error once, record it in the JSON (if one was written), end every rank."""
    state.results.add_error(error)
    world = _running_world()
    if world is not None:
        _abort_all(world, message, code)
    if _speaks():
        print(message, file=sys.stderr, flush=True)
    return code


def _internal_error(state: RunState, err: Exception) -> int:
    world = _running_world()
    rank = world.rank if world is not None else 0
    what = " ".join(f"{type(err).__name__}: {err}".split())       # one line
    where = state.results.save_traceback(err, f"tessera: internal error during {state.phase}", rank)
    saved = (f"; finished phases ({', '.join(state.completed)}) are in {state.results.path}"
             if state.completed and state.results.path is not None else "")
    message = (f"error: internal error during {state.phase}, please report: {what} "
               f"(traceback: {where}{saved})")
    return _fail(state, message, EXIT_INTERNAL,
                 {"phase": state.phase, "kind": "internal error", "message": what, "traceback": where})


def _interrupted(state: RunState, sig) -> None:
    """On the watcher thread (cli.interrupt): say so once, keep what finished, end every
    rank now (MPI_Abort, or os._exit in one process) -- no collective shutdown."""
    code = EXIT_SIGNAL_BASE + int(sig)
    world = _running_world()
    rank = world.rank if world is not None else 0
    if rank != 0:                  # rank 0, if it got the signal too, speaks and ends all
        time.sleep(ERROR_GRACE_SECONDS)
    # a rename in progress finishes first (then the lock stays held: no write starts after)
    saved = WRITE_LOCK.acquire(timeout=30) and state.results.add_error(
        {"phase": state.phase, "kind": "interrupted", "signal": sig.name})
    kept = (f"; finished phases ({', '.join(state.completed) or 'none'}) are in {state.results.path}"
            if saved else "")
    suffix = f" (on rank {rank})" if rank else ""
    print(f"error: interrupted by {sig.name} during {state.phase}{kept}{suffix}", file=sys.stderr, flush=True)
    if world is not None:
        world.abort(code)
    os._exit(code)


def _configure_output(args) -> None:
    """Line-buffered stdout (a batch log shows each line as it is printed); warnings and
    errors on stderr; progress lines of long phases on stdout unless -q; with -v also the
    library's INFO lines (SCF iterations, phase summaries) on stdout."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    quiet, verbose = getattr(args, "quiet", False), getattr(args, "verbose", False)      # run, plan
    for name, on in (("tessera.progress", not quiet), ("tessera", verbose)):
        logger = logging.getLogger(name)
        for h in [h for h in logger.handlers if getattr(h, "tessera_cli", False)]:
            logger.removeHandler(h)
        logger.setLevel(logging.DEBUG if args.debug else logging.INFO if on else logging.WARNING)
        logger.propagate = not on
        if on:       # INFO on stdout, plain; warnings and errors on stderr as before
            out = logging.StreamHandler(sys.stdout)
            out.setFormatter(logging.Formatter("%(message)s"))
            # the CLI's iteration table already shows CCSD's iteration lines
            out.addFilter(lambda r: r.levelno < logging.WARNING and not r.getMessage().startswith("CCSD iter"))
            err = logging.StreamHandler(sys.stderr)
            err.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            err.setLevel(logging.WARNING)
            for h in (out, err):
                h.tessera_cli = True
                logger.addHandler(h)


def _end_program(code: int) -> None:
    """End the program now with ``code``, once the run has returned: run the ``atexit``
    handlers (logging's flush among them) with the standard streams flushed before and
    after them, and leave without the
    interpreter's teardown of every module and the shared libraries' exit handlers (BLAS
    and OpenMP thread pools), with nothing left to write: from the last ``atexit`` handler
    to the end of the process 0.25-0.29 s after a benzene cc-pVDZ CCSD run, 0.11-0.15 s
    ended so (measured under load 6-7). Not under MPI (MPI_Finalize comes in that
    teardown) and not while a thread that the interpreter would wait for still runs."""
    import threading
    if "mpi4py.MPI" in sys.modules or any(t is not threading.main_thread() and not t.daemon
                                          for t in threading.enumerate()):
        return
    import atexit

    def flush():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):      # closed (a broken pipe was handled already)
                pass
    flush()
    atexit._run_exitfuncs()
    flush()                     # what the handlers wrote too
    os._exit(code)


def main(argv=None, *, handle_signals: bool | None = None) -> int:
    """The command line. ``handle_signals`` (default: when ``argv`` is None, i.e. run as a
    program) routes SIGINT/SIGTERM to the interrupt path that ends every rank. As a program
    it ends the process itself when the run returns (``_end_program``)."""
    code = _main(argv, handle_signals)
    if argv is None:
        _end_program(code)
    return code


def _main(argv, handle_signals: bool | None) -> int:
    try:
        args = _parser().parse_args(argv)
    except TesseraError as err:          # an option's own check (argparse types)
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _configure_output(args)
    state = RunState()
    if argv is None if handle_signals is None else handle_signals:
        from tessera.cli import interrupt
        interrupt.install(lambda sig: _interrupted(state, sig))
    try:
        if args.command == "report":
            from tessera.profile.report import report
            report(args.dirs, args.out)
            return EXIT_OK
        if argv is None:          # run as a program
            _freeze_imports()
        return _run(args, state)
    except TesseraError as err:
        if args.debug:
            raise
        return _fail(state, f"error: {err}", EXIT_BAD_INPUT,
                     {"phase": state.phase, "kind": "error", "message": str(err)})
    except KeyboardInterrupt:       # in-process use without handle_signals
        print("error: interrupted", file=sys.stderr)
        return EXIT_SIGNAL_BASE + 2
    except BrokenPipeError:         # stdout closed (`tessera run ... | head`): not a bug
        sys.stdout = open(os.devnull, "w")           # nothing more can be printed there
        return _fail(state, f"error: standard output closed during {state.phase}", EXIT_SIGNAL_BASE + 13,
                     {"phase": state.phase, "kind": "interrupted", "signal": "SIGPIPE"})
    except Exception as err:        # noqa: BLE001 - a bug: exit 3 with the traceback on disk
        if args.debug:
            raise
        return _internal_error(state, err)


if __name__ == "__main__":
    sys.exit(main())
