#!/usr/bin/env python
"""Checkpoint and restart: a CCSD stopped early (here by --max-iter; a kill or a batch
time limit works the same) resumes from its checkpoint, without a second SCF.

The same as `tessera run examples/water.xyz --basis 6-31g --max-iter 4 --checkpoint w.chk.h5`
followed by the same command with `--restart` (and the default --max-iter).
"""

import tempfile
from pathlib import Path

from tessera.chem.job import Job, RunOptions

here = Path(__file__).resolve().parent
with tempfile.TemporaryDirectory() as tmp:
    chk = str(Path(tmp) / "water.chk.h5")
    first = Job(RunOptions(str(here / "water.xyz"), basis="6-31g", method="ccsd(t)", max_iter=4,
                           checkpoint=chk)).kernel()
    print(f"stopped after {len(first.data['iterations'])} iterations, converged: {first.converged}")
    second = Job(RunOptions(str(here / "water.xyz"), basis="6-31g", method="ccsd(t)", checkpoint=chk,
                            restart=True)).kernel()
    print(f"resumed at iteration {second.data['iterations'][0]['iter']}, converged: {second.converged}")
    print(f"E(CCSD(T)) = {second.data['energies']['total']:.10f}")   # expected -76.1202446912
