"""Remake tests/data/decide_water.json, the golden decisions of ``auto.decide``.

    python bench/decide_water.py --note "why remade" [--out tests/data/decide_water.json]

For (H2O)n cc-pVDZ as a C1 structure (``CCSDStructure(zeros(24 n), 5 n, distributed=True)``)
on P ranks, cases 4:64 and 8:256: ``auto.decide(structure, P, rate=10e9, budget=8 GiB,
ranks_per_node=64)``, the decision and every candidate's estimates as JSON (what
tests/test_granularity.py compares), with ``made_by``: the file's history and ``--note``.
Prints each case's decision and its best candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
CASES = ("4:64", "8:256")


def decisions() -> dict:
    """{case: the decision as JSON} for every case."""
    from tessera.backends import auto
    from tessera.chem.ccsd import CCSDStructure
    out = {}
    for case in CASES:
        n, nranks = map(int, case.split(":"))
        structure = CCSDStructure(np.zeros(24 * n, dtype=int), 5 * n, distributed=True)
        got = auto.decide(structure, nranks, rate=10e9, budget=8 * 2**30, ranks_per_node=64)
        out[case] = json.loads(json.dumps(got, sort_keys=True))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--note", required=True, help="why the file is remade (appended to made_by)")
    ap.add_argument("--out", default=str(REPO / "tests" / "data" / "decide_water.json"))
    args = ap.parse_args(argv)
    old = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    cases = decisions()
    made_by = "; ".join(x for x in (old.get("made_by"), args.note) if x)
    Path(args.out).write_text(json.dumps({"cases": cases, "made_by": made_by}, sort_keys=True) + "\n")
    for case, d in cases.items():
        print(f"{case}: {d['backend']} {d['variant']} {d['tile']}/{d['occ_tile']} "
              f"{d['estimated_seconds_per_iteration']:.4f} s")
        for c in d["candidates"][:4]:
            print(f"   {c['backend']} {c['variant']} {c['tile']}/{c['occ_tile']} {c['seconds']:.4f} s, "
                  f"{c['collectives']} collectives")


if __name__ == "__main__":
    main()
