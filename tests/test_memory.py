"""The memory estimate printed before the SCF, and ``--max-memory``.

The estimate of the peak memory per rank must be within 30% of the peak resident
memory measured for the run's own process (ru_maxrss of a child process, read by an
intermediate process that runs nothing else), and under MPI of each rank's own peak
(ru_maxrss at each rank, which counts the pages of other ranks' shared windows it
touched); a run estimated above the memory budget (--max-memory, else
TESSERA_MEMORY_PER_RANK_MB) is refused with one line, naming what would fit, before the
SCF starts; ``tessera plan`` prints the whole estimate.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import build_env, mpiexec_path, run_mpi

import tessera.chem.job as job_module
import tessera.chem.memory as memory_module
from tessera.cli.main import main

REPO = Path(__file__).resolve().parents[1]
WATER = str(REPO / "examples" / "water.xyz")

# the child's peak resident memory, measured by a process that starts only that child
_MEASURE = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:])\n"
            "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


@pytest.mark.parametrize("molecule, args", [
    ("water.xyz", ["--basis", "cc-pvdz", "--method", "ccsd(t)"]),
    ("glycine.xyz", ["--basis", "6-31g", "--method", "ccsd", "--conv", "1e-6"]),   # CCSD dominates
])
def test_estimate_within_30_percent_of_measured_peak(tmp_path, molecule, args):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "tessera.cli.main", "run", str(REPO / "examples" / molecule), *args,
           "--backend", "serial", "--json", str(out)]
    proc = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], capture_output=True, text=True,
                          env=build_env(), cwd=tmp_path, timeout=600)
    code, maxrss_kib = proc.stdout.split()[-2:]
    assert code == "0", proc.stderr[-2000:]
    measured = int(maxrss_kib) * 1024
    data = json.loads(out.read_text())
    estimate = data["memory"]["estimate"]
    assert estimate["phases"]["ccsd"] > 0 and estimate["baseline"] > 0
    assert 0.7 <= estimate["peak"] / measured <= 1.3, (estimate, measured)
    # the run's own report of its peak is the same measurement
    assert abs(data["memory"]["measured_peak"][0] - measured) <= 0.05 * measured


@pytest.mark.parametrize("molecule, args", [
    ("glycine.xyz", ["--basis", "6-31g", "--method", "ccsd", "--backend", "mpi-onesided"]),
    ("water_trimer.xyz", ["--basis", "6-31g", "--method", "ccsd(t)", "--backend", "mpi-collective"]),
])
def test_estimate_within_30_percent_at_two_ranks(tmp_path, molecule, args):
    out = tmp_path / "r.json"
    cmd = [str(mpiexec_path()), "-n", "2", sys.executable, "-m", "tessera.cli.main", "run",
           str(REPO / "examples" / molecule), *args, "--conv", "1e-6", "--json", str(out), "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=build_env(), cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    estimate, measured = data["memory"]["estimate"], data["memory"]["measured_peak"]
    assert len(measured) == 2 and estimate["ranks_per_node"] == 2
    for peak in measured:                 # each rank's ru_maxrss
        assert 0.7 <= estimate["peak"] / peak <= 1.3, (estimate, measured)
    # one-sided ranks read each other's shared windows: pages counted in both ranks'
    # resident sizes, once in the node's memory
    shared = estimate["parts"]["ccsd"].get("other ranks' windows", 0)
    assert (shared > 0) == ("mpi-onesided" in args)
    assert estimate["own"] <= estimate["peak"] - shared + 1


def test_refused_before_the_scf(monkeypatch, capsys):
    def no_scf(*_):
        raise AssertionError("the SCF started")
    monkeypatch.setattr(job_module.Job, "_scf", no_scf)
    # the baseline is this process's peak so far, which earlier tests in the same pytest
    # process raise; a fresh CLI process starts near 150 MiB, as here
    monkeypatch.setattr(memory_module, "resident_peak", lambda: 150 << 20)
    code = main(["run", str(REPO / "examples" / "water_trimer.xyz"), "--basis", "cc-pvdz", "--method", "ccsd",
                 "--max-memory", "300M"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "more than --max-memory 300 MiB" in err and "would fit: mpiexec -n" in err
    # more ranks on one node share its memory: the hint says how many fit per node
    assert "per rank" in err and ("on this node" in err or "per node" in err)
    assert "Memory per rank (estimate" in out and "RHF" not in out


def test_more_ranks_hint_counts_a_node(monkeypatch, capsys):
    """More ranks on one node share its memory: with room for one rank per node, the hint
    asks for as many nodes as ranks."""
    import tessera.chem.memory as memory
    monkeypatch.setattr(memory, "available_memory", lambda: 400 * 2**20)
    monkeypatch.setattr(memory, "resident_peak", lambda: 100 * 2**20)      # a fixed baseline
    code = main(["run", str(REPO / "examples" / "water_trimer.xyz"), "--basis", "cc-pvdz", "--method", "ccsd",
                 "--max-memory", "300M", "-q"])
    err = capsys.readouterr().err
    import re                  # how many ranks depends on the measured baseline of this process
    assert code == 2 and re.search(r"would fit: mpiexec -n (\d+) on \1 nodes, at most 1 per node", err), err


def test_nothing_fits(capsys):
    code = main(["run", WATER, "--basis", "sto-3g", "--max-memory", "1M"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "neither more ranks" in err


def test_one_memory_budget(monkeypatch, capsys):
    """TESSERA_MEMORY_PER_RANK_MB is the default of --max-memory (same sizes, same
    check); --max-memory wins; the cost model gets the same budget."""
    from tessera.backends.budget import ENV_MEMORY, memory_budget
    monkeypatch.setenv(ENV_MEMORY, "1M")
    assert memory_budget(4) == (2**20, ENV_MEMORY)
    assert memory_budget(4, 300) == (300 * 2**20, "--max-memory")
    code = main(["run", WATER, "--basis", "sto-3g"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and f"more than {ENV_MEMORY} 1 MiB" in err
    monkeypatch.setenv(ENV_MEMORY, "2G")
    assert memory_budget(1) == (2 * 2**30, ENV_MEMORY)
    for bad in ("nan", "-5", "1e999", "2X"):
        monkeypatch.setenv(ENV_MEMORY, bad)
        code = main(["run", WATER, "--basis", "sto-3g"])
        _, err = capsys.readouterr()
        assert code == 2 and err.count("\n") == 1 and ENV_MEMORY in err and "Traceback" not in err
    monkeypatch.delenv(ENV_MEMORY)
    from tessera.backends.budget import available_memory
    allowed, source = memory_budget(2)
    assert source.startswith("available memory") and 0 < allowed <= available_memory() / 2 * 1.1


def test_cost_model_takes_the_budget():
    """decide() judges its candidates against the budget it is given."""
    import numpy as np
    from tessera.backends.auto import decide
    from tessera.chem.ccsd import CCSDStructure
    orbsym = np.zeros(24, dtype=int)
    roomy = decide(CCSDStructure(orbsym, 8, 0), 2, backend="mpi-onesided", tile=6, rate=5e9, budget=2**40)
    tight = decide(CCSDStructure(orbsym, 8, 0), 2, backend="mpi-onesided", tile=6, rate=5e9, budget=1)
    assert roomy["memory_budget_per_rank"] == 2**40 and tight["memory_budget_per_rank"] == 1
    assert all(c["fits_memory"] for c in roomy["candidates"])
    assert not any(c["fits_memory"] for c in tight["candidates"])


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", "5X", "", "1e999"])
def test_bad_max_memory(capsys, value):
    code = main(["run", WATER, "--basis", "sto-3g", "--max-memory", value])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "--max-memory" in err and "Traceback" not in err


def test_max_memory_units():
    from tessera.backends.budget import parse_size
    assert parse_size("4000") == 4000 and parse_size("500M") == 500 and parse_size("2GiB") == 2048
    assert parse_size("8GB") == 8192 and parse_size("1t") == 2**20 and parse_size(" 512 KB ") == 0.5


def test_plan_prints_the_whole_estimate(capsys):
    assert main(["plan", WATER, "--basis", "6-31g", "--method", "ccsd(t)"]) == 0
    out = capsys.readouterr().out
    assert "Memory per rank (estimate" in out
    for phase in ("scf", "transform", "ccsd", "(t)"):
        assert f"\n  {phase} " in out
    assert "held" in out and "half-transformed" in out and "baseline" in out


def test_plan_decides_the_transform_by_max_memory(capsys):
    """A local run's transform keeps the AO integrals in memory when they fit its budget
    (--max-memory), else goes by AO units: ``tessera plan`` estimates by the same budget."""
    transform = {}
    for mib in (None, "0.2"):
        assert main(["plan", "examples/water.xyz", "--basis", "cc-pvdz"] + (["--max-memory", mib] if mib else [])) == 0
        transform[mib] = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  transform "))
    assert "AO integrals, or MO integrals" in transform[None] and "slabs" in transform["0.2"]


def test_scf_phase_counts_the_integrals_the_scf_keeps():
    """The estimate's scf phase holds the AO integrals the SCF will keep: on one rank the
    8-fold array (its size as PySCF computes it), on several (C1: the identity's) the
    fullest rank's share of the representative quartets; not when the budget leaves no
    room for them (auto goes direct), always in mode incore (so a run that cannot fit is
    refused before the SCF)."""
    from pyscf import gto
    from tessera.chem.memory import RunShape, estimate
    from tessera.chem.scf.integrals import s8_shares
    from tessera.errors import InputError
    atoms = "".join(Path(WATER).read_text().splitlines(True)[2:])
    mol = gto.M(atom=atoms, basis="6-31g", verbose=0)
    one = RunShape(mol, "hf", "serial", None, 1, 32, None, 0, False, scf_mode="auto")
    assert estimate(one).parts["scf"]["AO integrals"] == mol.intor("int2e", aosym="s8").nbytes
    two = one.but(nranks=2, distributed=True)
    shares = s8_shares(mol, 2)
    assert estimate(two).parts["scf"]["AO integrals"] == shares.max() < shares.sum()
    for shape in (one.but(budget=1.0), one.but(scf_mode="direct"), one.but(scf_mode=None)):
        assert "AO integrals" not in estimate(shape).parts["scf"]
    incore = one.but(budget=1.0, scf_mode="incore")
    est = estimate(incore)
    assert est.parts["scf"]["AO integrals"] > 0
    with pytest.raises(InputError, match="scf"):
        memory_module.check(est, (est.own - 1, "--max-memory"), incore)


def test_small_budget_gives_a_direct_scf_and_says_so(monkeypatch, capsys):
    """A --max-memory that holds the run but not the 8-fold integrals beside it: auto is
    direct (one log line says why), the energy unchanged; mode incore is refused."""
    monkeypatch.setattr(memory_module, "resident_peak", lambda: 150 << 20)   # a fixed baseline
    # water cc-pVDZ: 24 functions, 300 pairs, 300 * 301 / 2 doubles = 0.3445 MiB of 8-fold integrals
    args = ["run", WATER, "--basis", "cc-pvdz", "--method", "hf", "--max-memory", "150.25M", "-v"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    line = [s for s in (out + err).splitlines() if "direct Fock builds" in s]
    assert line and "would need 0.3445 MiB per rank, budget 150.2 MiB (--max-memory) of which 0.25 MiB are free" in line[0]
    assert main(args + ["--scf-mode", "direct"]) == 0
    e_direct = [s for s in capsys.readouterr()[0].splitlines() if s.startswith("E(RHF)")]
    assert e_direct and e_direct[0] in out
    assert main(args + ["--scf-mode", "incore"]) == 2
    err = capsys.readouterr()[1]
    assert err.count("\n") == 1 and "more than --max-memory 150 MiB" in err


def test_ccsd_estimate_holds_the_ladder_plus_minus(tmp_path):
    """A local run makes the ladder's V+- (``tensor.pairs.plus_minus``) and frees vvvv
    (JSON ``storage``: vvvv stored 0, freed): the estimate's structure holds V+- instead
    of vvvv, every allowed block (the run skips those whose vvvv blocks are absent: 11%
    fewer here), so at least and near the bytes the run reports; a distributed run (the
    ladder in its pair form) keeps vvvv and no V+-."""
    from pyscf import gto
    from tessera.backends.iteration_counts import structure_stats
    from tessera.chem.ccsd import CCSDStructure
    from tessera.chem.scf.driver import guess_orbitals
    out = tmp_path / "r.json"
    assert main(["run", WATER, "--basis", "cc-pvdz", "--method", "ccsd", "--backend", "serial",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    atoms = "".join(Path(WATER).read_text().splitlines(True)[2:])
    orbsym, nocc, *_ = guess_orbitals(gto.M(atom=atoms, basis="cc-pvdz", symmetry=True, verbose=0))
    local = structure_stats(CCSDStructure(orbsym, nocc, 0, False), data["tile"], data["occ_tile"], 1,
                            block_tasks=False)
    classes = data["storage"]["classes"]
    assert classes["vvvv"]["stored"] == 0 and classes["vvvv"]["freed"]
    kept = 8 * classes["vvvv_plus_minus"]["stored"]
    assert 0 < kept <= local["held"]["ladder V+-"] <= 1.2 * kept
    spread = structure_stats(CCSDStructure(orbsym, nocc, 0, True), data["tile"], data["occ_tile"], 2,
                             block_tasks=False)
    assert "ladder V+-" not in spread["held"]
    # the phases that hold vvvv (the transform, the ladder's set-up) or V+- count them; the
    # job frees V+- when CCSD ends, so (T) holds neither
    phases = data["memory"]["estimate"]["parts"]
    assert phases["ladder"]["ladder V+-"] == local["held"]["ladder V+-"]
    # the dressing's M+- are held as their gathered matrices from the first residual on
    # (the working set counts those), so the iteration's held bytes do not count them again
    assert phases["ladder"]["ladder dressing M+-"] == local["dressing_bytes"] > 0
    assert sum(local["held"].values()) == local["held_bytes"] and "ladder dressing M+-" not in local["held"]
    # vvvv's canonical blocks: at least 1/8 of the C2v-allowed elements (>= 1/4 of dense),
    # at most 1/4 of dense (8-fold canonical blocks of the allowed ones)
    vvvv = (phases["ladder"]["integrals with vvvv"] - phases["ccsd"]["stored"]) / 8
    assert classes["vvvv"]["dense"] / 32 <= vvvv <= classes["vvvv"]["dense"] / 4


def test_executor_caches_within_the_budget():
    """Each cache of an MPI executor holds at most 512 MiB and at most an eighth of the
    budget per rank, in whole MiB (``budget.executor_cache_bytes``); the estimate counts
    cached's block cache at a rank's share of a step's product reads, at most the step's
    distinct blocks (``max_step_rank_bytes``, falling with the ranks; measured against the
    executor's caches by bench/onesided_cache_peak.py), and neither cache above its bound."""
    import numpy as np
    from tessera.backends.budget import executor_cache_bytes
    from tessera.backends.cost_model import memory_parts
    from tessera.backends.iteration_counts import structure_stats
    from tessera.chem.ccsd import CCSDStructure
    assert executor_cache_bytes(None) == executor_cache_bytes(8 * 2**30) == 512 * 2**20
    assert executor_cache_bytes(300 * 2**20) == 37 * 2**20 and executor_cache_bytes(2**20) == 2**20
    structure = CCSDStructure(np.zeros(58, dtype=int), 10, distributed=True)     # (H2O)2-sized, C1
    share = {}
    for P in (2, 8):
        s = structure_stats(structure, 12, 12, P)
        share[P] = s["max_step_rank_bytes"]
        distinct = max(a + b for a, b, _ in (c["bytes"] for c in s["collective_steps"]))
        assert share[P] <= distinct
        assert memory_parts(s, P, "mpi-onesided", "cached", 2**20)["working"] <= 2 * 2**20
        assert memory_parts(s, P, "mpi-onesided", "cached", 512 * 2**20)["working"] >= share[P]
    assert 0 < share[8] < share[2]


@pytest.mark.parametrize("nranks", [None, 2])
def test_ccsd_estimate_counts_each_live_array_once(nranks):
    """The estimate's CCSD arrays against those a distributed CCSD really holds at its peak
    (tests/mpi/ccsd_memory.py: water cc-pVDZ, mpi-onesided, at a DIIS update after the
    first): each rank's global arrays (integrals, T2 and every intermediate's pooled array,
    the constants D1, D2, L, VO) against ``stored`` plus the plans' intermediates and the
    constants spread over the ranks, and the packed amplitude vectors the driver and its
    DIIS update hold against ``PACKED_VECTORS``. Before, the tensors among the amplitude
    copies (tau, R2, Z, W2, Y) were counted again among the intermediates, those stored
    canonical (tau, R2, ...) at their full size, and the update's vectors not at all."""
    from tessera.chem.ccsd import PACKED_VECTORS
    out = run_mpi(REPO / "tests" / "mpi" / "ccsd_memory.py", nranks, args=("--basis", "cc-pvdz", "--tile", "4"),
                  timeout=300)
    P = out["ranks"]
    held = out["held_parts"]
    assert set(held) == {"constants", "packed vectors"}
    assert out["held"] == pytest.approx((held["constants"] + held["packed vectors"] + out["pooled_bytes"]) / P)
    arrays = out["stored"] + (held["constants"] + out["pooled_bytes"]) / P
    fullest = max(peak["arrays"] for peak in out["peaks"])
    assert 0.95 <= arrays / fullest <= 1.05, (arrays, out["peaks"])
    for peak in out["peaks"]:
        # the last vector, the new one and the error are passed in; what tracemalloc saw the
        # update allocate is the others and a few KiB of Python objects (about 4 KiB here)
        others = peak["inside"] - (PACKED_VECTORS - 3) * peak["vector"]
        assert 0 <= others < 8192, out["peaks"]
    # the whole CCSD part but the executor's working set, at 1 rank every byte on that rank
    if P == 1:
        (peak,) = out["peaks"]
        alive = peak["arrays"] + 3 * peak["vector"] + peak["inside"] + peak["weight"]
        assert 0.95 <= (out["stored"] + out["held"]) / alive <= 1.0, (out, alive)


def test_cached_frozen_share_follows_the_schedule():
    """mpi-onesided cached's frozen cache under ``nxtval`` (a new deal every iteration)
    meets every frozen block held elsewhere, (P - 1) / P of them; under ``steal`` (the same
    deal every iteration) its share of one iteration's reads, at most the distinct ones
    (``cost_model.frozen_share``; measured by bench/onesided_cache_peak.py, water tetramer,
    4 ranks: 483 MB after 4 iterations under nxtval, 254 MB under steal)."""
    import numpy as np
    from tessera.backends.cost_model import estimate, frozen_share, memory_parts
    from tessera.backends.iteration_counts import structure_stats
    from tessera.chem.ccsd import CCSDStructure
    s = structure_stats(CCSDStructure(np.zeros(58, dtype=int), 10, distributed=True), 12, 12, 8)
    met = s["frozen_distinct_bytes"]
    assert frozen_share(s, 8) == met * 7 / 8
    assert frozen_share(s, 8, "steal") == min(met, s["frozen_ab_bytes"] / 8) < met * 7 / 8
    nxtval, steal = (memory_parts(s, 8, "mpi-onesided", "cached", schedule=k)["working"] for k in ("nxtval", "steal"))
    assert steal < nxtval
    small = 2**20      # a cache far below what either deal meets: hits in proportion to it
    moved = [estimate(s, 8, "mpi-onesided", "cached", 1e10, cache=small, schedule=k)["bytes_per_rank"]
             for k in ("nxtval", "steal")]
    assert moved[1] < moved[0]
