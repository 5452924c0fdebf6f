"""Per-rank memory and bytes of a CCSD iteration on many simulated ranks (no MPI, no SCF).

    .venv/bin/python bench/layouts_at_scale.py [--waters 8,16] [--ranks 64,256,1024] [--tile 32]
                                               [--json bench/results/layouts_at_scale.json]

For water clusters (H2O)n in cc-pVDZ (C1, geometries built deterministically), every
stored tensor class (T2 and the integral classes) is placed over P ranks with Tessera's
own placement code (``runtime.distribution.block_owners``, what ``TensorStore`` uses),
and the per-rank bytes of each class are summed: max, mean and max/mean per class.
The bytes each rank moves per CCSD iteration come from the cost model
(``backends.auto.structure_stats`` and ``estimate``) for each executor and variant.
Also the Python time and memory (tracemalloc peak) of building the owner maps of every
class at the largest rank count for the issue's example (C1, 100 occupied, 800
virtual, tile 48).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from tessera.backends.auto import estimate, structure_stats  # noqa: E402
from tessera.chem.ccsd import CCSDStructure  # noqa: E402
from tessera.chem.integrals import CLASSES, class_tensor, make_spaces  # noqa: E402
from tessera.runtime.distribution import block_owners  # noqa: E402
from tessera.tensor.block_tensor import BlockTensor  # noqa: E402

EXECUTORS = [("mpi-onesided", "original"), ("mpi-onesided", "inverted"), ("mpi-onesided", "cached"),
             ("mpi-collective", "summa"), ("mpi-collective", "2.5d")]
NBAS_WATER = 24      # cc-pVDZ functions of one water


def class_tensors(orbsym, nocc, tile):
    o, v = make_spaces(orbsym, nocc, 0, tile)
    out = {"t2": BlockTensor((o, o, v, v), 0, name="t2")}
    out.update({name: class_tensor(name, o, v) for name in CLASSES})
    return out


def per_rank(tensors, nranks) -> dict:
    """{class: {max_bytes, mean_bytes, max_over_mean}} and the total."""
    out, total = {}, np.zeros(nranks)
    for name, t in tensors.items():
        load = np.zeros(nranks)
        for k, r in block_owners(t.spaces, t.irrep, t.stored_keys(), nranks, t.placement).items():
            load[r] += 8 * int(np.prod(t.block_shape(k)))
        total += load
        out[name] = _stats(load)
    out["total"] = _stats(total)
    return out


def _stats(load) -> dict:
    mean = float(load.mean())
    return {"max_bytes": int(load.max()), "mean_bytes": mean,
            "max_over_mean": float(load.max() / mean) if mean else 1.0}


def layout_cost(nranks: int) -> dict:
    """Seconds and tracemalloc peak of the owner maps of every class of the issue's example."""
    orbsym, nocc = np.zeros(900, dtype=int), 100
    tensors = class_tensors(orbsym, nocc, 48)
    for t in tensors.values():          # the key lists are cached structure, not layout work
        t.stored_keys()
    tracemalloc.start()
    t0 = time.perf_counter()
    maps = {n: block_owners(t.spaces, t.irrep, t.stored_keys(), nranks, t.placement) for n, t in tensors.items()}
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    ranks_used = {n: len(set(m.values())) for n, m in maps.items()}
    return {"ranks": nranks, "seconds": seconds, "tracemalloc_peak_bytes": peak,
            "blocks": {n: len(m) for n, m in maps.items()}, "ranks_holding_blocks": ranks_used,
            "memory": per_rank(tensors, nranks)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waters", default="8,16")
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--tile", type=int, default=32)
    ap.add_argument("--json", default=str(REPO / "bench" / "results" / "layouts_at_scale.json"))
    args = ap.parse_args(argv)
    waters = [int(x) for x in args.waters.split(",")]
    ranks = [int(x) for x in args.ranks.split(",")]
    result = {"tile": args.tile, "load": os.getloadavg()[0], "clusters": {}}
    for n in waters:
        nocc, nmo = 5 * n, NBAS_WATER * n
        orbsym = np.zeros(nmo, dtype=int)
        tensors = class_tensors(orbsym, nocc, args.tile)
        structure = CCSDStructure(orbsym, nocc)
        rows = {}
        for P in ranks:
            s = structure_stats(structure, args.tile, args.tile, P)
            moved = {f"{b} {v}": estimate(s, P, b, v, 10e9)["bytes_per_rank"] for b, v in EXECUTORS}
            rows[P] = {"memory_per_rank": per_rank(tensors, P), "bytes_per_rank": moved}
        result["clusters"][f"(H2O){n}"] = rows
        print(f"\n(H2O){n} cc-pVDZ, C1, o={nocc} v={nmo - nocc}, tile {args.tile}: per-rank memory "
              "(MiB max / MiB mean / max/mean) per class")
        names = list(next(iter(rows.values()))["memory_per_rank"])
        print(f"{'ranks':>6s} " + " ".join(f"{c:>22s}" for c in names))
        for P, row in rows.items():
            cells = [f"{m['max_bytes'] / 2**20:8.1f}/{m['mean_bytes'] / 2**20:7.1f}/{m['max_over_mean']:5.2f}"
                     for m in row["memory_per_rank"].values()]
            print(f"{P:6d} " + " ".join(f"{c:>22s}" for c in cells))
        print("bytes moved per rank per CCSD iteration (MiB), by executor and variant")
        print(f"{'ranks':>6s} " + " ".join(f"{e:>22s}" for e in rows[ranks[0]]["bytes_per_rank"]))
        for P, row in rows.items():
            print(f"{P:6d} " + " ".join(f"{b / 2**20:22.1f}" for b in row["bytes_per_rank"].values()))
    cost = layout_cost(max(ranks))
    result["layout_cost"] = cost
    print(f"\nissue example (C1, o=100, v=800, tile 48) at {cost['ranks']} ranks: owner maps of every class "
          f"built in {cost['seconds']:.2f} s, tracemalloc peak {cost['tracemalloc_peak_bytes'] / 2**20:.1f} MiB")
    for n, m in cost["memory"].items():
        used = cost["ranks_holding_blocks"].get(n, "")
        print(f"  {n:6s} blocks {cost['blocks'].get(n, ''):>7} ranks holding blocks {used:>5} "
              f"max {m['max_bytes'] / 2**30:7.2f} GiB mean {m['mean_bytes'] / 2**30:7.3f} GiB "
              f"max/mean {m['max_over_mean']:7.2f}")
    print(f"(load average {result['load']:.2f})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
