"""``tessera run | plan``: the command line.

Errors are one line on stderr and a non-zero exit code; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tessera.errors import TesseraError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tessera", description="Block-sparse coupled-cluster calculations.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("run", "run a calculation"), ("plan", "print the plan of one CCSD iteration")):
        s = sub.add_parser(name, help=text)
        s.add_argument("geometry", help="XYZ file (Angstrom)")
        s.add_argument("--basis", default="cc-pvdz")
        s.add_argument("--method", default="ccsd(t)", help="hf | ccsd | ccsd(t)")
        s.add_argument("--charge", type=int, default=0)
        s.add_argument("--frozen-core", action="store_true", help="freeze the chemical core orbitals")
        s.add_argument("--backend", default="threads", help="serial | threads")
        s.add_argument("--tile", type=int, default=32, help="largest tile (orbitals per block edge)")
        s.add_argument("--conv", type=float, default=1e-8, help="CCSD energy convergence (Eh)")
        s.add_argument("--max-iter", type=int, default=50, help="CCSD iterations at most")
        s.add_argument("--no-symmetry", action="store_true", help="run in C1")
        s.add_argument("--scf", default="tessera", help="tessera (own distributed RHF) | pyscf")
        s.add_argument("--scf-schedule", default="steal", help="static | nxtval | steal (with --scf tessera)")
        s.add_argument("--scf-max-iter", type=int, default=100)
        s.add_argument("--json", metavar="FILE", help="write the results as JSON")
        s.add_argument("--debug", action="store_true", help="show tracebacks and debug logging")
        if name == "run":
            s.add_argument("--plan-only", action="store_true", help="print the plan and stop")
    return p


def _options(args):
    from tessera.backends.executors import BACKENDS
    from tessera.chem.job import RunOptions
    if args.backend not in BACKENDS:
        raise TesseraError(f"unknown backend {args.backend!r}; choose one of: {', '.join(BACKENDS)}")
    return RunOptions(geometry=args.geometry, basis=args.basis, method=args.method, charge=args.charge,
                      frozen_core=args.frozen_core, backend=args.backend, tile=args.tile, conv=args.conv,
                      max_iter=args.max_iter, symmetry=not args.no_symmetry, scf=args.scf,
                      scf_schedule=args.scf_schedule, scf_max_iter=args.scf_max_iter)


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

    def scf(self, d: dict) -> None:
        print(f"\nRHF ({d['source']}): E = {d['e_hf']:.10f} Eh  ({d['seconds']:.2f} s)")

    def iteration(self, row: dict) -> None:
        if row["iter"] == 1:
            print(f"\n{'iter':>4s} {'E(corr)':>18s} {'change':>11s} {'residual':>10s} {'seconds':>8s}")
        print(f"{row['iter']:4d} {row['e_corr']:18.12f} {row['delta']:11.3e} {row['residual']:10.3e} "
              f"{row['seconds']:8.2f}")

    def energies(self, e: dict, t: dict) -> None:
        print()
        names = {"hf": "E(RHF)", "ccsd_correlation": "E(CCSD) correlation", "t_correction": "E(T) correction",
                 "total": "E total"}
        for k, label in names.items():
            if k in e:
                print(f"{label:22s} {e[k]:18.10f} Eh")
        print("Timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))


def _run(args) -> int:
    from tessera.chem.job import Job
    options = _options(args)
    if getattr(args, "plan_only", False) or args.command == "plan":
        from tessera.cli.plan import print_plan
        print_plan(options)
        return 0
    result = Job(options, PrintReport()).kernel()
    if args.json:
        try:
            with open(args.json, "w") as f:
                json.dump(result.data, f, indent=1, default=float)
        except OSError as err:
            raise TesseraError(f"cannot write --json {args.json}: {err.strerror}") from None
    if not result.converged:
        print(f"error: {result.error}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return _run(args)
    except TesseraError as err:
        if args.debug:
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
