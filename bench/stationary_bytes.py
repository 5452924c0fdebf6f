"""What keeping an operand stationary saves on mpi-collective (docs/distributed.md,
"Stationary operands"): the bytes of CCSD iteration 2 (6-31G, tile 8), summed over the
ranks (each rank's all-to-all and broadcast bytes with other ranks, the runtime's comm
log), for summa and 2.5d with ``stationary`` never (always the grid) and auto, with the
contraction modes and the energies (equal across runs). Prints one JSON line and writes it to
bench/results/stationary_bytes-P.json. A measurement of our own executor's modes: no peer.

    mpiexec -n P .venv/bin/python bench/stationary_bytes.py examples/water_trimer.xyz
"""
import json
import sys
from pathlib import Path
from dataclasses import replace

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.errors import ConvergenceError
from tessera.runtime import World

OPS = ("alltoallv", "bcast_row", "bcast_col")


def main(path: str) -> None:
    world = World.get()
    mol = Molecule.from_xyz(path, basis="6-31g").to_pyscf()
    ref = rhf_reference(mol) if world.rank == 0 else None
    ref = replace(world.bcast(None if ref is None else replace(ref, mol=None), root=0), mol=mol)
    out = {}
    for variant in ("summa", "2.5d"):
        for mode in ("never", "auto"):
            with Context("mpi-collective", variant=variant, stationary=mode) as ctx:
                ints = transform(ref, 0, 8)
                snaps = []

                def progress(row):           # the end of each iteration
                    snaps.append(world.comm_log.snapshot())
                try:
                    e = CCSD(conv=1e-12, max_iter=2, progress=progress).kernel(ints, ctx).e_corr
                except ConvergenceError as err:         # two iterations only: the result it carries
                    e = err.result.e_corr
                row = world.comm_log.row(world.size, OPS, since=snaps[0])
                mine = float(row.sum() - row[world.rank])
                modes = ctx.executor.describe()["contraction_modes"]
            total = world.allreduce(mine, "sum")
            out[f"{variant}/{mode}"] = {"bytes": total, "e": e, "modes": modes}
    if world.rank == 0:
        print(json.dumps(out))
        results = Path(__file__).resolve().parent / "results"
        results.mkdir(exist_ok=True)
        (results / f"stationary_bytes-{world.size}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
