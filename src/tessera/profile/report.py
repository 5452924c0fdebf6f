"""``tessera report DIR [DIR...] [--out OUTDIR]``: what a profiled run (or several) did.

Reads the directories written by ``tessera run --profile DIR`` (profile.run) and writes
``report.txt`` (also printed) and ``report.html`` (the text and every figure embedded),
with the figures as PNG files beside them (profile.plots):

- per run: time per phase and per equation term or task set, per rank min/mean/max,
  load imbalance (max/mean), flops and GFLOP/s (``terms_<run>.png``); where each rank's
  time went: compute, one-sided, collectives, counter, idle (``breakdown_<run>.png``);
  the rank x rank matrix of bytes moved by one-sided operations and collectives
  (``matrix_<run>.png``); per operation kind calls, bytes, time; E(N);
- with several runs of one calculation (same molecule, basis, method): speed-up and
  parallel efficiency against the smallest run, E(N) with T_comp the compute time of the
  smallest run (``scaling.png``), bytes moved per rank (``bytes.png``);
- energy to solution per phase where the machine's RAPL counters are readable
  (profile.energy), else "unavailable" and why;
- for mpi-collective runs: the bytes each rank received by collectives per contraction
  call against the communication lower bound of matrix multiplication,
  3 n^2 / p^(2/3) words with n^3 = m k n = flops / 2 (Solomonik and Demmel)
  (``bound.png``).
"""

from __future__ import annotations

import base64
import html
import os

import numpy as np

from tessera.errors import InputError
from tessera.profile.commlog import is_collective
from tessera.profile.records import imbalance
from tessera.profile.run import FORMAT, TIME_KINDS, load_json, render_table, rows


class Profile:
    """One profile directory: its index, result and rank records."""

    def __init__(self, directory: str):
        if not os.path.isdir(directory):
            raise InputError(f"profile directory {directory!r} does not exist; give a directory "
                             "written by tessera run --profile DIR")
        self.directory = directory
        self.index = load_json(os.path.join(directory, "records.json"))
        found = self.index.get("format") if isinstance(self.index, dict) else None
        if found != FORMAT:
            raise InputError(f"{directory}/records.json has profile format {found!r}, this tessera "
                             f"reads {FORMAT!r}; profile the run again with this version")
        self.result = load_json(os.path.join(directory, "result.json"))
        self.ranks = [load_json(os.path.join(directory, f)) for f in self.index["rank_files"]]
        self.summary = self.index["summary"]
        self.run = self.index["run"]
        self.nranks = self.summary["ranks"]
        self.label = f"{self.nranks}r_{os.path.basename(os.path.normpath(directory))}"

    def identity(self) -> tuple:
        mol = self.run.get("molecule") or {}
        return (str(mol.get("atoms")), mol.get("charge"), self.run.get("basis"), self.run.get("method"))


# ------------------------------------------------------------------------ per run tables
def phase_rows(p: Profile) -> list:
    """(phase, min, mean, max, imbalance) of seconds over ranks."""
    names = list(p.ranks[0]["phases"])
    return [(n, *_spread([r["phases"].get(n, 0.0) for r in p.ranks])) for n in names]


def term_rows(p: Profile) -> list:
    """(label, kind, calls, min, mean, max, imbalance, flops, GFLOP/s) per equation term or
    task set, slowest first. Step flops are the whole step's (the same on every rank),
    task-set flops each rank's own (summed)."""
    labels: dict = {}
    for r in p.ranks:
        for lab, t in r["table"].items():
            labels.setdefault(lab, t["kind"])
    rows = []
    for lab, kind in labels.items():
        ts = [r["table"].get(lab, {"calls": 0, "seconds": 0.0, "flops": 0}) for r in p.ranks]
        secs = [t["seconds"] for t in ts]
        flops = sum(t["flops"] for t in ts) if kind == "tasks" else max(t["flops"] for t in ts)
        lo, mean, hi, imb = _spread(secs)
        rows.append((lab, kind, max(t["calls"] for t in ts), lo, mean, hi, imb, flops,
                     flops / hi / 1e9 if hi > 0 else 0.0))
    return sorted(rows, key=lambda r: -r[5])


def _spread(values) -> tuple:
    v = np.asarray(values, dtype=float)
    return float(v.min()), float(v.mean()), float(v.max()), imbalance(v)


def matrix(p: Profile) -> np.ndarray:
    """Bytes moved between each pair of ranks: one-sided (by target) plus collectives (by
    the rank the bytes came from)."""
    m = p.summary["matrix"]
    return np.asarray(m["one_sided"], dtype=float) + np.asarray(m["collective"], dtype=float)


def bound_rows(p: Profile) -> list:
    """(label, calls, measured bytes per rank per call, bound bytes per rank per call) of
    every contraction step, from the collective bytes each rank received inside it."""
    if p.run.get("backend") != "mpi-collective" or p.nranks < 2:
        return []
    per_label: dict = {}
    for r in p.ranks:
        ops = [o for o in rows(r, "ops") if is_collective(o["op"])]
        starts = np.asarray([o["start"] for o in ops])
        cum = np.concatenate([[0.0], np.cumsum([sum(n for _, n in o["peers"]) for o in ops])])
        for g in rows(r, "regions"):
            if g["kind"] != "contract":
                continue
            lo, hi = np.searchsorted(starts, [g["start"], g["start"] + g["seconds"]], side="left")
            row = per_label.setdefault(g["name"], [0, 0.0, g["flops"]])
            row[0] += 1
            row[1] += cum[hi] - cum[lo]
    n = p.nranks
    out = []
    for lab, (calls, got, flops) in per_label.items():
        if flops <= 0:
            continue
        bound = matmul_bound_bytes(flops / 2, n)
        out.append((lab, calls // n, got / calls, bound))
    return sorted(out, key=lambda r: -r[3])


def matmul_bound_bytes(mnk: float, ranks: int, itemsize: int = 8) -> float:
    """Bytes per rank of the leading term of the communication lower bound of a matrix
    product of ``mnk`` = m n k multiply-adds over ``ranks`` ranks: 3 n^2 / p^(2/3) words
    with n^3 = m n k (Solomonik and Demmel)."""
    return itemsize * 3 * (mnk / ranks) ** (2 / 3)


def run_text(p: Profile, bound: list | None = None) -> str:
    """The text report of one run; ``bound`` is its ``bound_rows`` when already computed."""
    run = p.run
    atoms = (run.get("molecule") or {}).get("atoms") or []
    lines = [f"== {p.directory}: {len(atoms)} atoms, {run.get('basis')}, {run.get('method')}, "
             f"backend {run.get('backend')}"
             + "".join(f", {k} {run[k]}" for k in ("variant", "schedule") if run.get(k))
             + f", {p.nranks} rank(s) ==",
             "", "Phases (seconds over ranks)",
             f"{'phase':24s} {'min':>9s} {'mean':>9s} {'max':>9s} {'max/mean':>8s}"]
    for name, lo, mean, hi, imb in phase_rows(p):
        lines.append(f"{name:24s} {lo:9.3f} {mean:9.3f} {hi:9.3f} {imb:8.2f}")
    lines += ["", "Equation terms and task sets (seconds over ranks, slowest first)",
              f"{'calls':>6s} {'min':>8s} {'mean':>8s} {'max':>8s} {'max/mean':>8s} {'GFLOP':>9s} "
              f"{'GFLOP/s':>8s}  term"]
    for lab, kind, calls, lo, mean, hi, imb, flops, rate in term_rows(p)[:25]:
        lines.append(f"{calls:6d} {lo:8.3f} {mean:8.3f} {hi:8.3f} {imb:8.2f} {flops / 1e9:9.3f} "
                     f"{rate:8.2f}  {lab[:80]}")
    lines += ["", "Where each rank's time went (seconds)",
              f"{'rank':>4s} {'wall':>8s} " + " ".join(f"{k:>10s}" for k in TIME_KINDS)]
    for r in p.summary["per_rank"]:
        lines.append(f"{r['rank']:4d} {r['wall']:8.3f} " + " ".join(f"{r[k]:10.3f}" for k in TIME_KINDS))
    busy = [r["wall"] - r["idle"] for r in p.summary["per_rank"]]
    lines.append(f"busy time max/mean (load imbalance): {imbalance(busy):.2f}")
    lines.append(render_table(p.summary))
    m = matrix(p)
    lines += ["", f"Bytes moved between ranks (row: rank, column: peer; total {m.sum() / 2**20:.2f} MiB, "
              f"one-sided {np.sum(p.summary['matrix']['one_sided']) / 2**20:.2f} MiB, collectives "
              f"{np.sum(p.summary['matrix']['collective']) / 2**20:.2f} MiB)"]
    if p.nranks <= 8:
        lines += [" ".join(f"{v / 2**20:9.3f}" for v in row) for row in m]
    energy = p.summary["energy"]
    if energy["available"]:
        lines += ["", "Energy to solution (CPU packages, RAPL, all nodes): "
                  + ", ".join(f"{k} {v:.1f} J" for k, v in energy["joules"].items())
                  + f"; total {energy['total']:.1f} J"]
    else:
        lines += ["", f"Energy to solution: unavailable: {energy['reason']}"]
    lines.append(f"Energy to solution (GPU, NVML): unavailable: {energy['gpu_reason']}")
    bound = bound_rows(p) if bound is None else bound
    if bound:
        lines += ["", "Collective bytes per rank per contraction call vs the bound 3n^2/p^(2/3) (MiB)",
                  f"{'calls':>6s} {'measured':>9s} {'bound':>9s} {'ratio':>7s}  contraction"]
        for lab, calls, got, lim in bound[:25]:
            lines.append(f"{calls:6d} {got / 2**20:9.4f} {lim / 2**20:9.4f} {got / lim:7.2f}  {lab[:80]}")
    return "\n".join(lines)


# ------------------------------------------------------------------------ several runs
def scaling_rows(runs: list) -> list:
    """(ranks incl. ghosts, workers, wall, speed-up, parallel efficiency, E(N), MiB per rank,
    run label) per run, ordered by rank count; the smallest run is the reference."""
    runs = sorted(runs, key=lambda p: p.summary["ranks_total"])
    ref = runs[0].summary
    t_comp = ref["compute_seconds"]
    rows = []
    for p in runs:
        s = p.summary
        n, wall = s["ranks_total"], s["wall_seconds"]
        speedup = ref["wall_seconds"] / wall
        rows.append((n, s["ranks"], wall, speedup, speedup * ref["ranks_total"] / n,
                     t_comp / (wall * n), matrix(p).sum() / s["ranks"] / 2**20, p.label))
    return rows


def scaling_text(runs: list) -> str:
    lines = ["== Scaling (reference: the smallest run; E(N) = T_comp(smallest) / (T_N x N)) ==",
             f"{'N':>4s} {'workers':>7s} {'wall s':>9s} {'speed-up':>8s} {'par.eff':>8s} {'E(N)':>7s} "
             f"{'MiB/rank':>9s}  run"]
    for n, w, wall, sp, eff, en, mib, label in scaling_rows(runs):
        lines.append(f"{n:4d} {w:7d} {wall:9.3f} {sp:8.2f} {eff:8.2f} {en:7.3f} {mib:9.2f}  {label}")
    return "\n".join(lines)


# ------------------------------------------------------------------------ the command
def report(dirs: list, out: str | None = None) -> str:
    """Write report.txt, report.html and the figures; return the text (also printed)."""
    runs = [Profile(d) for d in dirs]
    if len({p.identity() for p in runs}) > 1:
        raise InputError("the profiles are of different calculations ("
                         + "; ".join(f"{p.directory}: {p.run.get('basis')} {p.run.get('method')}, "
                                     f"{len((p.run.get('molecule') or {}).get('atoms') or [])} atoms"
                                     for p in runs)
                         + "); a scaling report compares runs of one molecule, basis and method")
    if len({p.label for p in runs}) < len(runs):
        for i, p in enumerate(runs):
            p.label = f"{p.label}_{i}"
    out = out or (dirs[0] if len(dirs) == 1 else "report")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create report directory {out!r}: {err.strerror}") from None
    from tessera.profile import plots
    sections, figures = [], []
    bounds = [(p, bound_rows(p)) for p in runs]
    for p, bound in bounds:
        sections.append(run_text(p, bound))
        figures += [plots.terms(p, term_rows(p), out), plots.breakdown(p, out), plots.heatmap(p, matrix(p), out)]
    if len(runs) > 1:
        sections.append(scaling_text(runs))
        rows = scaling_rows(runs)
        figures += [plots.scaling(rows, out), plots.bytes_per_rank(rows, out)]
    bounds = [(p, b) for p, b in bounds if b]
    if bounds:
        figures.append(plots.bound(bounds, out))
    text = "\n\n".join(sections) + "\n\nFigures: " + ", ".join(os.path.basename(f) for f in figures) + "\n"
    _write(os.path.join(out, "report.txt"), text)
    _write(os.path.join(out, "report.html"), _html(text, figures))
    print(text, end="")
    print(f"Report written to {out}/report.txt and {out}/report.html")
    return text


def _html(text: str, figures: list) -> str:
    imgs = []
    for f in figures:
        with open(f, "rb") as fh:
            data = base64.b64encode(fh.read()).decode()
        imgs.append(f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(os.path.basename(f))}">'
                    f"<figcaption>{html.escape(os.path.basename(f))}</figcaption></figure>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>tessera report</title>"
            "<style>body{font-family:sans-serif;margin:2em} pre{font-size:12px} img{max-width:100%}"
            "</style></head><body><h1>tessera report</h1><pre>" + html.escape(text) + "</pre>"
            + "".join(imgs) + "</body></html>\n")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:
        raise InputError(f"cannot write {path}: {err.strerror}") from None
