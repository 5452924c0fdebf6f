"""Distributed CCSD(T) under `mpiexec -n K`, K = 1..4, against the serial backend.

One launch of tests/mpi/ccsd_checks.py per rank count runs, for water (C2v) and H2O2
(C1) in 6-31G, every executor x loop order x schedule for a fixed number of CCSD
iterations plus (T), and (at 2 and 4 ranks) two combinations to convergence. The serial
backend runs the same iterations here, in the test process. Checked: energies (HF,
CCSD, (T)) to 1e-8 Eh; T2 + integrals per rank within 1.5x of the mean at 4 ranks, no
rank holding a whole four-index tensor at 2+ ranks; the get/accumulate counts the loop
orders imply (cached < inverted < original gets; inverted more accumulates); no
one-sided operation in mpi-collective (summa and 2.5d); 2.5d's layers and its broadcast
bytes per rank against SUMMA's (both on the grid: ``stationary=never``); with operands
kept stationary where that costs less (the default), fewer bytes moved than on the grid
and the same energies; and the CLI's JSON and rank-0-only output.
"""

import json
import sys
from pathlib import Path

import pytest

from mpirun import run_mpi, run_mpi_raw

sys.path.insert(0, str(Path(__file__).parent / "mpi"))
import ccsd_checks  # noqa: E402  (molecules, tiles and combinations shared with the script)

from tessera.backends.context import Context  # noqa: E402
from tessera.chem.ccsd import CCSD  # noqa: E402
from tessera.chem.integrals import transform  # noqa: E402
from tessera.chem.molecule import Molecule  # noqa: E402
from tessera.chem.pyscf_reference import rhf_reference  # noqa: E402
from tessera.chem.triples import triples_correction  # noqa: E402
from tessera.errors import ConvergenceError  # noqa: E402

SCRIPT = Path(__file__).parent / "mpi" / "ccsd_checks.py"
REPO = Path(__file__).resolve().parents[1]
TESSERA = Path(sys.executable).parent / "tessera"
RANKS = (1, 2, 3, 4)
CONVERGED_AT = (2, 4)
ITERS = 3
E_TOL = 1e-8
TIMEOUT = 420

_runs: dict = {}
_serial: dict = {}


def launch(nranks):
    if nranks not in _runs:
        args = ["--iters", str(ITERS)]
        if nranks not in CONVERGED_AT:
            args.append("--no-converged")
        _runs[nranks] = run_mpi(SCRIPT, nranks, args=args, timeout=TIMEOUT)
    return _runs[nranks]


def serial(name):
    """HF, then CCSD after ITERS iterations and converged, each with (T): serial backend."""
    if name not in _serial:
        xyz, basis, tile = ccsd_checks.MOLECULES[name]
        ref = rhf_reference(Molecule.from_xyz(str(ccsd_checks.EXAMPLES / xyz), basis=basis).to_pyscf())
        out = {"e_hf": ref.e_hf}
        with Context("serial") as ctx:
            ints = transform(ref, 0, tile)
            for label, conv, iters in (("fixed", 1e-14, ITERS), ("converged", 1e-9, 60)):
                try:
                    cc = CCSD(conv=conv, max_iter=iters).kernel(ints, ctx)
                except ConvergenceError as err:
                    cc = err.result
                tr = triples_correction(ints, cc.t1, cc.t2, context=ctx)
                out[label] = (cc.e_corr, tr.energy, len(cc.iterations))
        _serial[name] = out
    return _serial[name]


@pytest.mark.parametrize("nranks", RANKS)
def test_energies_equal_serial(nranks):
    out = launch(nranks)
    assert out["nranks"] == nranks
    for name in ccsd_checks.MOLECULES:
        ref = serial(name)
        assert abs(out["runs"][f"{name}/hf"]["e_hf"] - ref["e_hf"]) < E_TOL
        for backend, variant, schedule in ccsd_checks.COMBOS:
            run = out["runs"][f"{name}/{backend}/{variant}/{schedule}"]
            e_cc, e_t, iters = ref["fixed"]
            assert run["iterations"] == iters
            assert abs(run["e_ccsd"] - e_cc) < E_TOL, (name, backend, variant, schedule, run["e_ccsd"], e_cc)
            assert abs(run["e_t"] - e_t) < E_TOL, (name, backend, variant, schedule, run["e_t"], e_t)
        if nranks in CONVERGED_AT:
            for backend, variant, schedule in ccsd_checks.CONVERGED:
                run = out["runs"][f"{name}/{backend}/{variant}/{schedule}/converged"]
                e_cc, e_t, iters = ref["converged"]
                assert run["converged"] and run["iterations"] == iters
                assert abs(run["e_ccsd"] - e_cc) < E_TOL and abs(run["e_t"] - e_t) < E_TOL


@pytest.mark.parametrize("nranks", RANKS)
def test_tensor_operations_equal_einsum(nranks):
    """CCSD contraction patterns, a batch with permutations, a denominator and aliasing,
    dot and norm on random block-sparse tensors: every executor agrees with numpy."""
    ops = launch(nranks)["tensor_ops"]
    assert len(ops) == len(ccsd_checks.COMBOS) + 4 and f"mpi-collective/2.5d/layers={nranks}" in ops
    assert {f"mpi-collective/summa/stationary={m}" for m in "abc"} <= set(ops)
    for combo, err in ops.items():
        assert err < 1e-12, (combo, err)


@pytest.mark.parametrize("nranks", RANKS)
def test_memory_spread_over_ranks(nranks):
    out = launch(nranks)
    for key, run in out["runs"].items():
        if "memory_total" not in run:
            continue
        assert len(run["memory_total"]) == nranks
        if nranks == 4:
            assert run["memory_max_over_mean"] <= 1.5, (key, run["memory_total"])
        if nranks >= 2:
            assert run["largest_share"] < 1.0, key     # no rank holds a whole 4-index tensor


@pytest.mark.parametrize("nranks", (2, 3, 4))
def test_loop_orders_move_what_they_should(nranks):
    out = launch(nranks)
    for name in ccsd_checks.MOLECULES:
        for schedule in ("nxtval", "steal"):
            r = {v: out["runs"][f"{name}/mpi-onesided/{v}/{schedule}"] for v in ("original", "inverted", "cached")}
            assert r["cached"]["gets"] < r["inverted"]["gets"] < r["original"]["gets"], (name, schedule, r)
            assert r["inverted"]["accs"] > r["original"]["accs"] == r["cached"]["accs"], (name, schedule)
            assert all(x["collective_bytes"] == 0 for x in r.values())
        owner = out["runs"][f"{name}/mpi-onesided/owner/nxtval"]     # owner computes: gets only
        assert owner["accs"] == 0 and owner["gets"] > 0 and owner["collective_bytes"] == 0
        for variant in ("summa", "2.5d", "summa/stationary=never", "2.5d/stationary=never"):
            coll = out["runs"][f"{name}/mpi-collective/{variant}" + ("" if "/" in variant else "/None")]
            assert coll["gets"] == 0 and coll["accs"] == 0 and coll["triples_onesided_ops"] == 0
            assert coll["collective_bytes"] > 0
            fields = set(coll["per_term_fields"])
            assert {"update", "gets", "accs", "get_bytes", "acc_bytes", "bytes_moved", "collectives"} <= fields


@pytest.mark.parametrize("nranks", RANKS)
def test_25d_layers_and_broadcast_bytes(nranks):
    """mpi-collective 2.5d: c = default_layers(P) layers (1, 2, 3, 2 at 1..4 ranks; the
    energies are checked with every combination above). The broadcast bytes per rank come
    from the step accounting; at 4 ranks (2 layers of a 1 x 2 grid) every rank broadcasts
    less than with SUMMA on 2 x 2; with one rank per layer (2 and 3 ranks) nothing is
    broadcast, the inputs move only by the all-to-alls."""
    out = launch(nranks)
    for name in ccsd_checks.MOLECULES:
        summa = out["runs"][f"{name}/mpi-collective/summa/stationary=never"]
        d25 = out["runs"][f"{name}/mpi-collective/2.5d/stationary=never"]
        layers = {1: 1, 2: 2, 3: 3, 4: 2}[nranks]
        assert d25["executor"]["layers"] == layers and summa["executor"]["layers"] == 1
        pr, pc = d25["executor"]["grid"]
        assert pr * pc * layers == nranks
        for run in (summa, d25):
            assert len(run["bcast_bytes_per_rank"]) == nranks
            assert sum(run["bcast_bytes_per_rank"]) == run["bcast_bytes_per_term"]
        if nranks == 4:
            assert summa["executor"]["grid"] == [2, 2] and [pr, pc] == [1, 2]
            assert min(summa["bcast_bytes_per_rank"]) > 0
            assert max(d25["bcast_bytes_per_rank"]) < min(summa["bcast_bytes_per_rank"]), (name, d25, summa)
        elif nranks in (2, 3):
            assert d25["bcast_bytes_per_rank"] == [0] * nranks
        if nranks == 1:
            assert summa["bcast_bytes_per_rank"] == d25["bcast_bytes_per_rank"] == [0]
        if nranks >= 2:
            # operands kept where they live when that costs less: fewer bytes than the grid
            auto = out["runs"][f"{name}/mpi-collective/summa/None"]
            assert set(auto["executor"]["contraction_modes"]) - {"summa"}, auto["executor"]
            assert auto["bytes_moved"] < summa["bytes_moved"], (name, auto["bytes_moved"], summa["bytes_moved"])
            assert set(summa["executor"]["contraction_modes"]) == {"summa"}
    errors = out["layer_options"]["errors"]      # explicit layers=P ran in the tensor operations
    assert "do not divide" in errors["not_divisor"] and f"{nranks + 1} layer(s)" in errors["not_divisor"]
    assert "variant 2.5d" in errors["summa_layers"]


def test_cli_json_and_rank0_output(tmp_path):
    """Also: the executor's caches are bounded by --max-memory (each at most an eighth of
    it, ``budget.executor_cache_bytes``: 250 MiB of 2000), as the memory estimate took them."""
    out = tmp_path / "r.json"
    run = run_mpi_raw(TESSERA, 2, args=["run", "examples/water.xyz", "--basis", "6-31g", "--method", "ccsd(t)",
                                        "--backend", "mpi-onesided", "--variant", "cached", "--schedule", "steal",
                                        "--tile", "3", "--max-memory", "2000M", "--json", str(out)], timeout=TIMEOUT)
    assert run.returncode == 0, run.describe()
    assert run.stdout.count("E(CCSD) correlation") == 1          # rank 0 prints, once
    data = json.loads(out.read_text())
    assert data["backend"] == "mpi-onesided" and data["variant"] == "cached" and data["schedule"] == "steal"
    assert data["ranks"] == 2 and data["tile"] == 3
    assert data["cache_mb"] == 250 and data["executor"]["cache_bytes"] == 250 << 20
    assert data["executor"]["frozen_cache_bytes"] == 250 << 20
    ref = serial("water")
    assert abs(data["energies"]["ccsd_correlation"] - ref["converged"][0]) < E_TOL
    assert abs(data["energies"]["t_correction"] - ref["converged"][1]) < E_TOL
    comm = data["communication"]
    assert comm["per_term"] and comm["total"]["gets"] > 0 and comm["total"]["accs"] > 0
    assert sum(r["gets"] for r in comm["per_term"]) == comm["total"]["gets"]
    assert any(r["update"].startswith("R2[ijab] +=") for r in comm["per_term"])
    mem = data["memory_per_rank"]
    assert len(mem["t2"]) == 2 and len(mem["integrals"]) == 2 and mem["max_over_mean"] < 1.5
    assert "Traceback" not in run.stderr


def test_cli_auto_plan_only_and_bad_options():
    run = run_mpi_raw(TESSERA, 2, args=["run", "examples/water.xyz", "--basis", "6-31g", "--plan-only"],
                      timeout=TIMEOUT, env=None)
    assert run.returncode == 0, run.describe()
    assert run.stdout.count("auto decision on 2 rank(s)") == 1
    assert "est. s/iter" in run.stdout and "MiB allowed" in run.stdout
    coll = run_mpi_raw(TESSERA, 2, args=["run", "examples/water.xyz", "--basis", "6-31g", "--plan-only",
                                         "--backend", "mpi-collective"], timeout=TIMEOUT)
    assert coll.returncode == 0, coll.describe()
    assert "backend mpi-collective" in coll.stdout and "2.5d c=2" in coll.stdout   # 2 layers of 1 x 1
    bad = run_mpi_raw(TESSERA, 2, args=["run", "examples/water.xyz", "--basis", "6-31g", "--backend",
                                        "mpi-onesided", "--variant", "sideways"], timeout=TIMEOUT)
    assert bad.returncode == 2
    assert bad.stderr.count("error: ") == 1 and "sideways" in bad.stderr and "Traceback" not in bad.stderr


def test_auto_weighs_collective_at_the_tiles_plan_shows(tmp_path):
    """A 2-rank ``tessera run --backend auto`` (H2O2 6-31G, C1: the task rule gives 48/48,
    summa's grid rule 12/12, 2.5d's its own on 2 layers): the run's JSON tiles are its decision's, its
    mpi-collective candidates are exactly those ``--backend mpi-collective`` weighs
    (``auto.decide`` here with the run's rate and budget), among them each mpi-collective
    row of ``tessera plan --ranks 2``, and the plan's one-sided rows are at the task rule's tiles."""
    from tessera.backends.auto import decide
    from tessera.backends.balance import run_tiles
    from tessera.chem.ccsd import CCSDStructure
    from tessera.cli.main import main
    out, plan = tmp_path / "r.json", tmp_path / "p.json"
    run = run_mpi_raw(TESSERA, 2, args=["run", "examples/h2o2_distorted.xyz", "--basis", "6-31g", "--method", "ccsd",
                                        "--json", str(out)], timeout=TIMEOUT)
    assert run.returncode == 0, run.describe()
    data = json.loads(out.read_text())
    d = data["auto"]
    assert (data["backend"], data["tile"], data["occ_tile"]) == (d["backend"], d["tile"], d["occ_tile"])
    structure = CCSDStructure([0] * data["nao"], data["nocc"], 0, distributed=True)
    assert (run_tiles(structure, 2, d["memory_budget_per_rank"])[:2],
            run_tiles(structure, 2, d["memory_budget_per_rank"], 1)[:2]) == ((48, 48), (12, 12))
    only = decide(structure, 2, backend="mpi-collective", rate=d["gemm_rate"], budget=d["memory_budget_per_rank"],
                  ranks_per_node=2)
    weighed = [c for c in d["candidates"] if c["backend"] == "mpi-collective"]
    assert weighed == only["candidates"]
    assert main(["plan", "examples/h2o2_distorted.xyz", "--basis", "6-31g", "--ranks", "2", "--json", str(plan)]) == 0
    rows = json.loads(plan.read_text())["executors"]
    for e in rows:
        if e["backend"] == "mpi-collective":
            assert any((c["variant"], c["tile"], c["occ_tile"]) == (e["variant"], e["tile"], e["occ_tile"])
                       for c in weighed), e
        else:
            assert (e["tile"], e["occ_tile"]) == (48, 48), e
    layered = run_tiles(structure, 2, d["memory_budget_per_rank"], 2)[:2]         # 2.5d: 2 layers of 1 x 1
    assert {(e["variant"], e["tile"], e["occ_tile"]) for e in rows if e["backend"] == "mpi-collective"} == {
        ("summa", 12, 12), ("2.5d", *layered)}
