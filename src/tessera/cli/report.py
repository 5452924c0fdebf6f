"""What ``tessera run`` prints while a job runs (rank 0), and the JSON saved after each phase."""

from __future__ import annotations

from tessera.chem.job import Report


class PhaseReport(Report):
    """Follows the phases in ``state`` (a ``cli.main.RunState``) on every rank; with ``save``
    (rank 0) it saves the result after each."""

    def __init__(self, state, save: bool = False):
        self.state, self.save = state, save

    def phase(self, name: str) -> None:
        self.state.phase = name

    def done(self, name: str, data: dict) -> None:
        self.state.completed = list(data["completed"])
        if self.save:
            self.state.results.save(data)


class PrintReport(PhaseReport):
    """Prints progress as tables on stdout (``quiet``: the final energies only)."""

    def __init__(self, state, quiet: bool = False):
        super().__init__(state, save=True)
        self.quiet = quiet
        self.data: dict = {}        # the job's result as it grows

    def options(self, options: dict) -> None:
        if self.quiet:
            return
        print("Options: " + ", ".join(f"{k}={v}" for k, v in options.items()))

    def molecule(self, d: dict) -> None:
        self.data = d
        if self.quiet:
            return
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

    def scf(self, d: dict) -> None:
        if not self.quiet:
            print(f"\nRHF ({d['source']}): E = {d['e_hf']:.10f} Eh  ({d['seconds']:.2f} s)")

    def memory(self, estimate) -> None:
        if not self.quiet:
            print(estimate.render())

    def iteration(self, row: dict) -> None:
        if self.quiet:
            return
        if not getattr(self, "_table_started", False):       # also when a restart resumes
            self._table_started = True
            print(f"\n{'iter':>4s} {'E(corr)':>18s} {'change':>11s} {'residual':>10s} {'seconds':>8s} {'GFLOP/s':>8s}")
        print(f"{row['iter']:4d} {row['e_corr']:18.12f} {row['delta']:11.3e} {row['residual']:10.3e} "
              f"{row['seconds']:8.2f} {row.get('gflops_per_s', 0.0):8.1f}")

    def energies(self, e: dict, t: dict) -> None:
        if not self.quiet:
            print()
        names = {"hf": "E(RHF)", "ccsd_correlation": "E(CCSD) correlation", "t_correction": "E(T) correction",
                 "total": "E total"}
        for k, label in names.items():
            if k in e:
                final = self.data.get("converged", True) or (k == "hf" and "scf" in self.data["completed"])
                print(f"{label:22s} {e[k]:18.10f} Eh{'' if final else '  NOT CONVERGED'}")
        if not self.quiet:
            print("Timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))
