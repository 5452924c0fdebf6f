"""``tessera run`` interrupted in the middle of (T), to test the interrupt path.

Usage: cli_interrupt.py FOLDER BACKEND. Runs water/STO-3G CCSD(T) through the command line
(signal handling on, JSON in FOLDER/out.json) with (T) replaced by a wait that never
ends: rank 0 sleeps in Python, every other rank waits in an MPI barrier (blocked inside
MPI, where Python cannot run a signal handler). Each rank writes FOLDER/rank<r>.pid when
it starts and FOLDER/rank<r>.waiting when it is in that wait; the test then signals one.
"""

import os
import sys
import time
from pathlib import Path

import tessera.chem.job as job
import tessera.cli.main as cli

folder, backend = Path(sys.argv[1]), sys.argv[2]
rank = int(os.environ.get("PMI_RANK", "0"))
(folder / f"rank{rank}.pid").write_text(str(os.getpid()))


def endless_triples(ints, t1, t2, context=None, **options):
    (folder / f"rank{rank}.waiting").write_text("")
    if context.ranks.rank == 0:
        while True:
            time.sleep(0.1)
    context.ranks.allreduce(0.0)          # rank 0 never joins: blocked inside MPI
    raise AssertionError("unreachable")


job.triples_correction = endless_triples
sys.exit(cli.main(["run", "examples/water.xyz", "--basis", "sto-3g", "--backend", backend,
                   "--json", str(folder / "out.json")], handle_signals=True))
