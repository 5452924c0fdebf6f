#!/bin/sh
# CCSD(T) over 2 MPI ranks, tensors spread over the ranks (mpi-onesided, NWChem TCE-style),
# with a QCSchema AtomicResult next to Tessera's own JSON. Run from the repository root:
#   sh examples/04-mpi_run.sh
# Expected: E total -76.1202446911 Eh (water, 6-31G, all electrons); 1 thread per rank.
BIN=${BIN:-.venv/bin}
"$BIN/mpiexec" -n 2 "$BIN/tessera" run examples/water.xyz --basis 6-31g --method "ccsd(t)" \
    --backend mpi-onesided --threads 1 --json water-mpi.json --qcschema water-mpi.qcschema.json
