"""The figures of ``tessera report`` (PNG, matplotlib with the Agg backend).

matplotlib is an optional extra (``pip install 'tessera[plot]'``; ``make run`` and
``make test`` install it) and is imported only here, only when a report is drawn.
Each function draws one figure into the output directory and returns its path.
"""

from __future__ import annotations

import os

import numpy as np

from tessera.errors import InputError
from tessera.profile.run import TIME_KINDS

COLOURS = {"compute": "#2a9d8f", "one_sided": "#e76f51", "collective": "#264653",
           "counter": "#e9c46a", "idle": "#cccccc"}


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise InputError("tessera report draws its figures with matplotlib, which is not installed; "
                         "pip install 'tessera[plot]' (or matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, out: str, name: str) -> str:
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    fig.clf()
    import matplotlib.pyplot as plt
    plt.close(fig)
    return path


def breakdown(p, out: str) -> str:
    """Stacked bar per rank: compute, one-sided, collectives, counter, idle."""
    plt = _plt()
    per = p.summary["per_rank"]
    fig, ax = plt.subplots(figsize=(max(5.5, 2.5 + 0.5 * len(per)), 3.6))
    x = np.arange(len(per))
    bottom = np.zeros(len(per))
    for kind in TIME_KINDS:
        v = np.array([r[kind] for r in per])
        ax.bar(x, v, bottom=bottom, color=COLOURS[kind], label=kind.replace("_", "-"), width=0.7)
        bottom += v
    ax.set_xticks(x, [str(r["rank"]) for r in per])
    ax.set_xlabel("rank")
    ax.set_ylabel("seconds")
    ax.set_title(f"Time per rank ({p.nranks} rank(s), E(N) = {p.summary['efficiency']:.3f})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, out, f"breakdown_{p.label}.png")


def heatmap(p, m: np.ndarray, out: str) -> str:
    """Rank x rank bytes moved (one-sided + collectives), MiB."""
    plt = _plt()
    n = m.shape[0]
    fig, ax = plt.subplots(figsize=(4.6, 3.8))
    top = m.max() if m.size else 0
    im = ax.imshow(m / 2**20, cmap="viridis", origin="upper", vmin=0, vmax=max(top / 2**20, 1e-3))
    fig.colorbar(im, ax=ax, label="MiB")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xlabel("peer rank")
    ax.set_ylabel("rank")
    ax.set_title("MiB moved (one-sided + collectives)" + ("" if top else ": none"), fontsize=10)
    if n <= 8:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{m[i, j] / 2**20:.3g}", ha="center", va="center", fontsize=9,
                        color="white" if m[i, j] < 0.6 * top or not top else "black")
    return _save(fig, out, f"matrix_{p.label}.png")


def terms(p, rows: list, out: str, limit: int = 15) -> str:
    """Slowest equation terms and task sets: mean seconds over ranks, min..max as a bar;
    GFLOP/s beside those that count flops."""
    plt = _plt()
    rows = rows[:limit]
    fig, ax = plt.subplots(figsize=(8.0, 0.8 + 0.32 * max(1, len(rows))))
    y = np.arange(len(rows))
    mean = np.array([r[4] for r in rows])
    err = np.array([[r[4] - r[3] for r in rows], [r[5] - r[4] for r in rows]])
    ax.barh(y, mean, xerr=err if len(rows) else None, color="#2a9d8f", capsize=2)
    ax.set_yticks(y, [_short(r[0]) + (f"  ({r[8]:.3g} GFLOP/s)" if r[7] else "") for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds (mean over ranks; bar: min..max)")
    ax.set_title(f"Slowest terms and task sets ({p.nranks} rank(s))", fontsize=10)
    return _save(fig, out, f"terms_{p.label}.png")


def _short(label: str, width: int = 55) -> str:
    return label if len(label) <= width else label[:width - 1] + "…"


def _per_run(ax, rows: list, column: int, marker: str = "o-", label: str | None = None) -> None:
    """One point per run against ranks: a line through them when every rank count has one
    run, else each point named by its run."""
    n = [r[0] for r in rows]
    y = [r[column] for r in rows]
    one_each = len(set(n)) == len(n)
    line, = ax.plot(n, y, marker if one_each else marker[0], label=label)
    if not one_each:
        seen: dict = {}
        for x, v, r in zip(n, y, rows):        # runs at the same N: names stacked, not overlaid
            k = seen[x] = seen.get(x, -1) + 1
            ax.annotate(r[7], (x, v), textcoords="offset points", xytext=(6, 9 * k - 3), fontsize=7,
                        color=line.get_color())
    ax.set_xticks(sorted(set(n)))
    ax.set_xlabel("ranks N")


def scaling(rows: list, out: str) -> str:
    """Speed-up, parallel efficiency and E(N) against ranks."""
    plt = _plt()
    n = np.array(sorted({r[0] for r in rows}))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.0, 3.6))
    _per_run(a1, rows, 3, label="measured")
    a1.plot(n, n / n[0], "--", color="grey", label="ideal")
    a1.set_ylabel("speed-up")
    a1.set_title("Speed-up against the smallest run", fontsize=10)
    a1.legend(fontsize=8)
    _per_run(a2, rows, 4, label="parallel efficiency")
    _per_run(a2, rows, 5, "s-", label="E(N)")
    a2.set_ylim(0, max(1.05, max(max(r[4], r[5]) for r in rows) * 1.05))
    a2.set_title("Parallel efficiency and E(N)", fontsize=10)
    a2.legend(fontsize=8)
    return _save(fig, out, "scaling.png")


def bytes_per_rank(rows: list, out: str) -> str:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.0, 3.6))
    _per_run(ax, rows, 6)
    ax.set_ylabel("MiB moved per rank")
    ax.set_title("Bytes moved per rank", fontsize=10)
    return _save(fig, out, "bytes.png")


def bound(runs: list, out: str) -> str:
    """Per contraction call: collective bytes received per rank against 3n^2/p^(2/3)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.0, 4.0))
    lo, hi = np.inf, 0.0
    for p, rows in runs:
        b = np.array([r[3] for r in rows]) / 2**20
        m = np.array([r[2] for r in rows]) / 2**20
        keep = m > 0                   # a contraction whose inputs were all local moved nothing
        ax.scatter(b[keep], m[keep], s=14, label=f"{p.nranks} ranks")
        lo, hi = min(lo, b.min()), max(hi, b.max(), m.max())
    grid = np.array([lo, hi])
    ax.plot(grid, grid, "--", color="grey", label="bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("lower bound 3n²/p^(2/3) per rank (MiB)")
    ax.set_ylabel("measured per rank (MiB)")
    ax.set_title("Collective executor: bytes per contraction call\n(calls that moved nothing not shown)",
                 fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, out, "bound.png")
