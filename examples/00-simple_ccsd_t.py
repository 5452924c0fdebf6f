#!/usr/bin/env python
"""The simplest CCSD(T): a molecule from an XYZ file, Tessera's own SCF, CCSD and (T).

The same run as `tessera run examples/water.xyz --basis 6-31g --method "ccsd(t)"`.
"""

from pathlib import Path

from tessera.chem.job import Job, RunOptions

here = Path(__file__).resolve().parent
options = RunOptions(str(here / "water.xyz"), basis="6-31g", method="ccsd(t)")
result = Job(options).kernel()          # SCF, AO->MO transform, CCSD, (T)
energies = result.data["energies"]
print(f"E(RHF)     = {energies['hf']:.10f}")
print(f"E(CCSD(T)) = {energies['total']:.10f}")   # expected -76.1202446912
