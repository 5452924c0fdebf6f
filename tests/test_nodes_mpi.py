"""Multi-node paths on one machine: `TESSERA_EMULATE_NODES=2` with 2 x 2 ranks.

tests/mpi/nodes_checks.py runs water in STO-3G (one orbital per tile, so blocks travel
between the emulated nodes) for two CCSD iterations plus (T):
- with MPICH's MPIR_CVAR_NOLOCAL=1 and progress none (4 workers): every one-sided loop
  order (the owner-computes variant among them) and mpi-collective: energies to 1e-8 Eh
  of the serial backend, two nodes of two ranks, no block read by direct copy from
  another rank, bytes crossing the nodes, no accumulate under owner, NXTVAL with one
  counter per node (few counter operations cross the nodes);
- with the default progress (auto: ghost, one ghost per emulated node, 2 workers): the
  energies, and the NXTVAL counter held by a ghost.
(T) runs twice: as the run does, and with the kernel blocked in the virtual index
(vblock 1), whose tasks fetch their operands by virtual tile (chem.triples_window).
A 2-rank `tessera run` writes `nodes: 2` in its JSON; a ghost mode that MPI cannot give
shared memory to is a one-line error.
"""

import json
import sys
from pathlib import Path

import pytest

from mpirun import run_mpi, run_mpi_raw

from tessera.backends.context import Context
from tessera.chem.ccsd import CCSD
from tessera.chem.integrals import transform
from tessera.chem.molecule import Molecule
from tessera.chem.pyscf_reference import rhf_reference
from tessera.chem.triples import triples_correction
from tessera.errors import ConvergenceError

SCRIPT = Path(__file__).parent / "mpi" / "nodes_checks.py"
REPO = Path(__file__).resolve().parents[1]
TESSERA = Path(sys.executable).parent / "tessera"
ITERS = 2
E_TOL = 1e-8
TIMEOUT = 300
ONESIDED = ["mpi-onesided/original/nxtval", "mpi-onesided/inverted/steal", "mpi-onesided/cached/nxtval",
            "mpi-onesided/owner/nxtval"]
COMBOS = ONESIDED + ["mpi-collective/summa/None"]
NODES = {"TESSERA_EMULATE_NODES": "2"}

_runs: dict = {}


def launch(mode):
    if mode not in _runs:
        if mode == "nolocal":
            env = {**NODES, "MPIR_CVAR_NOLOCAL": "1", "TESSERA_PROGRESS": "none"}
            combos = COMBOS
        else:
            env = {**NODES, "TESSERA_PROGRESS": None}
            combos = ["mpi-onesided/cached/nxtval"]
        _runs[mode] = run_mpi(SCRIPT, 4, args=["--iters", str(ITERS), "--combos", ",".join(combos)],
                              env=env, timeout=TIMEOUT)
    return _runs[mode]


@pytest.fixture(scope="module")
def serial():
    ref = rhf_reference(Molecule.from_xyz(str(REPO / "examples" / "water.xyz"), basis="sto-3g").to_pyscf())
    with Context("serial") as ctx:
        ints = transform(ref, 0, 1)
        try:
            cc = CCSD(conv=1e-14, max_iter=ITERS).kernel(ints, ctx)
        except ConvergenceError as err:
            cc = err.result
        tr = triples_correction(ints, cc.t1, cc.t2, context=ctx)
    return ref.e_hf, cc.e_corr, tr.energy


def check_energies(out, combos, serial):
    e_hf, e_cc, e_t = serial
    assert abs(out["runs"]["hf"] - e_hf) < E_TOL
    for combo in combos:
        run = out["runs"][combo]
        assert run["iterations"] == ITERS
        assert abs(run["e_ccsd"] - e_cc) < E_TOL, (combo, run["e_ccsd"], e_cc)
        assert abs(run["e_t"] - e_t) < E_TOL, (combo, run["e_t"], e_t)
        assert abs(run["e_t_windowed"] - e_t) < E_TOL, (combo, run["e_t_windowed"], e_t)
        assert len(run["read_bytes"]) == len(out["node_of"]) and sum(run["read_bytes"]) > 0


def test_two_emulated_nodes_nothing_shared(serial):
    out = launch("nolocal")
    check_energies(out, COMBOS, serial)
    assert out["workers"] == 4 and out["node_of"] == [0, 0, 1, 1]
    d = out["describe"]
    assert (d["nodes"], d["ghosts"], d["progress"], d["emulate_nodes"]) == (2, 0, "none", 2)
    assert [v["direct_ranks"] for v in out["views"]] == [[0], [1], [2], [3]]
    for combo in ONESIDED:
        run = out["runs"][combo]
        assert run["gets"] > 0 and run["offnode_bytes"] > 0, combo
    assert out["runs"]["mpi-onesided/owner/nxtval"]["accs"] == 0
    assert out["runs"]["mpi-onesided/cached/nxtval"]["accs"] > 0
    for combo in ("mpi-onesided/original/nxtval", "mpi-onesided/cached/nxtval"):
        # no ghost to serve one NXTVAL counter: one per node, other nodes' only to steal
        # (one counter on worker 0: about 40% of the operations came from node 1)
        run = out["runs"][combo]
        assert 0 < run["offnode_counter_ops"] < 0.3 * run["counter_ops"], (combo, run)


def test_ghost_progress_is_the_default_across_nodes(serial):
    out = launch("ghost")
    check_energies(out, ["mpi-onesided/cached/nxtval"], serial)
    d = out["describe"]
    assert out["workers"] == 2 and out["node_of"] == [0, 1]
    assert (d["nodes"], d["ghosts"], d["ghosts_per_node"], d["progress"]) == (2, 2, 1, "ghost")
    assert all(v["counter_on_ghost"] for v in out["views"])        # NXTVAL served by a ghost
    assert out["runs"]["mpi-onesided/cached/nxtval"]["offnode_bytes"] > 0


def test_run_json_reports_nodes_and_ghost_needs_shared_memory(tmp_path):
    path = tmp_path / "r.json"
    args = ["run", "examples/water.xyz", "--basis", "sto-3g", "--method", "hf", "--backend", "mpi-onesided",
            "-q", "--json", str(path)]
    run = run_mpi_raw(TESSERA, 2, args=args, env={**NODES, "TESSERA_PROGRESS": "none"}, timeout=TIMEOUT)
    assert run.returncode == 0, run.describe()
    data = json.loads(path.read_text())
    assert (data["ranks"], data["nodes"]) == (2, 2)
    bad = run_mpi_raw(TESSERA, 4, args=args, env={**NODES, "MPIR_CVAR_NOLOCAL": "1", "TESSERA_PROGRESS": "ghost"},
                      timeout=TIMEOUT)
    assert bad.returncode == 2, bad.describe()
    assert bad.stderr.count("error: ") == 1 and "ghost progress needs MPI shared memory" in bad.stderr
    assert "Traceback" not in bad.stderr
