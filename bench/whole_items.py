"""Where a whole ``tessera run`` process spends its time outside the kernels, item by item.

Runs ``tessera run XYZ --basis B`` (CCSD(T), default options, its JSON and checkpoint in a
temporary folder) as a child process with a timer around each step the run takes once,
or per CCSD iteration, beside the CCSD contractions and the (T) kernel: the imports, the
input and memory estimate, the SCF's integral set-up, DIIS, the checkpoint and JSON
writes, the full garbage collections, and the interpreter's start and teardown (the
child's wall time as this process sees it, less what the child saw). The phases
(scf, transform, ccsd, triples) are reported whole, as in the run's JSON.

    .venv/bin/python bench/whole_items.py [--xyz examples/benzene.xyz] [--basis cc-pvdz] [--json out.json]

Seconds are wall seconds of one run: measure on an idle machine (the load is printed).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import table, uptime  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: (module, attribute) timed in the child; a phase or kernel contains the rest
ITEMS = [("tessera.chem.inputs", "load"), ("tessera.chem.job", "Job._check_memory"),
         ("tessera.chem.scf.driver", "guess_orbitals"), ("tessera.chem.scf.driver", "make_builder"),
         ("tessera.chem.ccsd_equations", "fixed_intermediates"), ("tessera.chem.ccsd_equations", "make_tau"),
         ("tessera.chem.diis", "DIIS.update"), ("tessera.chem.checkpoint", "Checkpoint.start"),
         ("tessera.chem.checkpoint", "Checkpoint.save"), ("tessera.chem.outcome", "ResultFile.save"),
         ("tessera.cli.header", "header_lines"), ("tessera.profile.run", "finish")]


def child(argv: list, out: str) -> None:
    """Run the CLI here with the ITEMS timed; write {item: [seconds, calls]} to ``out``."""
    t_start = time.perf_counter()
    spent: dict = {}
    t0 = time.perf_counter()
    import tessera.chem.job  # noqa: F401 - what a run imports first
    from tessera.cli import main as cli
    spent["imports (tessera, numpy, SciPy, PySCF)"] = [time.perf_counter() - t0, 1]
    for modname, qual in ITEMS:
        owner = importlib.import_module(modname)
        *path, name = qual.split(".")
        for p in path:
            owner = getattr(owner, p)
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*a, _fn=fn, _key=f"{modname}.{qual}", **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                s = spent.setdefault(_key, [0.0, 0])
                s[0] += time.perf_counter() - t
                s[1] += 1
        setattr(owner, name, timed)
        for mod in list(sys.modules.values()):      # names imported with ``from ... import``
            if getattr(mod, "__name__", "").startswith("tessera") and getattr(mod, name, None) is fn:
                setattr(mod, name, timed)
    full = {"seconds": 0.0, "calls": 0, "t": 0.0}

    def collected(phase, info):
        if info["generation"] == 2:
            if phase == "start":
                full["t"] = time.perf_counter()
            else:
                full["seconds"] += time.perf_counter() - full["t"]
                full["calls"] += 1
    gc.callbacks.append(collected)

    def write():
        spent["full garbage collections"] = [full["seconds"], full["calls"]]
        spent["in process"] = [time.perf_counter() - t_start, 1]
        Path(out).write_text(json.dumps({"items": spent}))
    atexit.register(write)
    sys.argv = ["tessera", *argv]
    code = cli.main()          # as the program runs it (argv None)
    if code:
        sys.exit(code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--xyz", default=str(ROOT / "examples" / "benzene.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--json", help="write the items here")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[1:], args.child[0])
        return
    load = uptime()
    with tempfile.TemporaryDirectory(prefix="tessera-items-") as folder:
        tmp = Path(folder)
        items, result = tmp / "items.json", tmp / "run.json"
        t0 = time.time()
        subprocess.run([sys.executable, __file__, "--child", str(items), "run", str(Path(args.xyz).resolve()),
                        "--basis", args.basis, "--conv", "1e-8", "--json", str(result), "-q"], check=True, cwd=tmp)
        wall = time.time() - t0
        got = json.loads(items.read_text())
        run = json.loads(result.read_text())
    rows = [{"item": k, "seconds": s, "calls": n} for k, (s, n) in got["items"].items()]
    rows.append({"item": "interpreter start and teardown",
                 "seconds": wall - got["items"]["in process"][0], "calls": 1})
    rows += [{"item": f"phase {k}", "seconds": v, "calls": 1} for k, v in run["timings"].items()]
    rows.append({"item": "process wall", "seconds": wall, "calls": 1})
    print(f"{Path(args.xyz).stem}/{args.basis} CCSD(T), one process; {load}")
    print(table(sorted(rows, key=lambda r: -r["seconds"]),
                [("seconds", "seconds", ".3f"), ("calls", "calls", "d"), ("item", "item", "s")]))
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
