#!/usr/bin/env python
"""CCSD(T) on integrals from another program, through an FCIDUMP file.

Here PySCF writes the FCIDUMP (pyscf.tools.fcidump.from_scf); any program's FCIDUMP
(Molpro, ...) is read the same way, orbital symmetries included. The same run from the
command line: `tessera run water.fcidump --method "ccsd(t)"`; `tessera run molecule.xyz
--fcidump-out FILE` writes one.
"""

import tempfile
from pathlib import Path

from pyscf import gto, scf
from pyscf.tools import fcidump

from tessera.chem.job import Job, RunOptions

mol = gto.M(atom="""O  0.000000  0.000000  0.117790
                    H  0.000000  0.755453 -0.471161
                    H  0.000000 -0.755453 -0.471161""",
            basis="6-31g", symmetry=True, verbose=0)
mf = scf.RHF(mol)
mf.conv_tol = 1e-12
mf.kernel()

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "water.fcidump"
    fcidump.from_scf(mf, str(path))
    result = Job(RunOptions(str(path), method="ccsd(t)")).kernel()   # no SCF: the file's orbitals
energies = result.data["energies"]
print(f"E(RHF)     = {energies['hf']:.10f}")       # expected -75.9838311206
print(f"E(CCSD(T)) = {energies['total']:.10f}")    # expected -76.1202446912
