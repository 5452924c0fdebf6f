#!/usr/bin/env python
"""From a converged PySCF mean field: no second SCF, PySCF's names and array layouts.

tessera.CCSD(mf) takes mf's orbitals and energies; frozen, conv_tol, max_cycle and
verbose mean what they mean in pyscf.cc.CCSD; t1[i, a] and t2[i, j, a, b] are numpy
arrays over the active orbitals, as PySCF's.
"""

from pyscf import gto, scf

import tessera

mol = gto.M(atom="""O  0.000000  0.000000  0.117790
                    H  0.000000  0.755453 -0.471161
                    H  0.000000 -0.755453 -0.471161""",
            basis="6-31g", symmetry=True, verbose=0)
mf = scf.RHF(mol)
mf.conv_tol = 1e-12
mf.kernel()

mycc = tessera.CCSD(mf, frozen=1, conv_tol=1e-10).run()     # the O 1s orbital frozen
e_t = mycc.ccsd_t()
print(f"E(CCSD) correlation = {mycc.e_corr:.10f}")   # expected -0.1345087061
print(f"t1 {mycc.t1.shape}, t2 {mycc.t2.shape}")      # (4, 8), (4, 4, 8, 8)
print(f"E(CCSD(T)) = {mycc.e_tot + e_t:.10f}")       # expected -76.1193256726

# Tessera's own SCF on the same Mole works the same way:
mf2 = tessera.RHF(mol).run()
print(f"E(RHF, tessera) = {mf2.e_tot:.10f}")         # expected -75.9838311206
