"""Blocks stored in pieces over several ranks (placement ``pieces``: the integral classes
and the T2-sized CCSD tensors) at 2 ranks, TESSERA_PIECES=3 forcing every block of such a
tensor into 3 pieces: on one node (pieces read and written in shared memory) and as 2
emulated nodes with MPICH's MPIR_CVAR_NOLOCAL=1 (every piece through MPI one-sided
operations).

Checks (tests/mpi/pieces_checks.py): every access path of a pieced tensor against numpy;
a partial put; the one-line refusal of a local view; the operations CCSD performs on
amplitudes stored in pieces (copy, zero_, norm, max_abs, vdot, dot, and steps writing a
pieced output: sums, the denominator division, hadamard products, contractions) against
numpy on the one-sided variants original, cached and owner and on mpi-collective summa
and 2.5d; CCSD(T) of water STO-3G (mpi-onesided cached and original, mpi-collective summa
and 2.5d) and 6-31G (the one-sided ones) with every integral class and T2 in pieces
equal to PySCF's to 1e-7 Eh; parts of pieced blocks cut on other axes than the first
moved by mpi-collective's all-to-all: exactly the part's elements that the receiver does
not hold (from the pieces each rank holds); the same parts fetched by mpi-onesided's gets:
exactly the part's elements, per target; the bytes of mpi-collective's steps on pieces
(stationary and on the grid), of mpi-onesided's sums and owner contractions, and of a
frozen operand's later runs on mpi-collective (kept, or past the frozen cache) equal to
the cost model's, and each rank's bytes of the stored classes under TESSERA_PIECES equal
to the model's.
"""

from pathlib import Path

import pytest

from mpirun import run_mpi
from pyscf_energies import ccsd_t_energies, rhf
from tessera.chem.molecule import Molecule

SCRIPT = Path(__file__).parent / "mpi" / "pieces_checks.py"
TIMEOUT = 300
CLASSES = ["oooo", "oovv", "ovoo", "ovov", "ovvv", "vvvv"]


@pytest.fixture(scope="module")
def pyscf_water():
    return {basis: ccsd_t_energies(rhf(Molecule.from_xyz("examples/water.xyz", basis=basis).to_pyscf()))
            for basis in ("sto-3g", "6-31g")}


def check_part_bytes(p):
    """Parts moved by mpi-collective's all-to-all: the values, and exactly the bytes of the
    parts' elements outside the receivers' own pieces (not the runs from a part's first to
    its last element: 7272 bytes instead of 3840 at 2 ranks before)."""
    assert p["pieced"] and p["aliases"] > 0 and p["err"] == 0.0, p
    assert p["moved"] == p["expected"] > 0, p
    assert p["moved"] < p["whole_blocks"] / 2, p


def check_onesided_part_bytes(p):
    """Parts fetched by mpi-onesided: the values, and the get counter's bytes per target
    exactly the part's elements that target holds (not every piece of the block: 2 ranks
    fetched every piece of the blocks, 18432 bytes, for parts of 7776 bytes before)."""
    assert p["pieced"] and p["aliases"] > 0 and p["err"] == 0.0, p
    assert p["per_target_equal"] and p["moved"] == p["expected"] > 0, p
    assert p["moved"] < p["whole_blocks"] / 2, p


@pytest.mark.parametrize("nodes", [1, 2])
def test_pieces_at_two_ranks(pyscf_water, nodes):
    env = {"TESSERA_PIECES": "3"}
    if nodes == 2:
        env.update({"TESSERA_EMULATE_NODES": "2", "MPIR_CVAR_NOLOCAL": "1", "TESSERA_PROGRESS": "none"})
    out = run_mpi(SCRIPT, 2, env=env, timeout=TIMEOUT)
    check_part_bytes(out["part_bytes"])
    check_onesided_part_bytes(out["onesided_part_bytes"])
    a = out["access"]
    assert a["pieced"] and a["pieces_per_block"] == 3 and a["blocks_here"] == 0
    assert a["held"] == pytest.approx(1.0)              # every element stored once, over the ranks
    assert a["access_error"] < 1e-12 and a["einsum_error"] < 1e-12 and a["dot_error"] < 1e-10, a
    assert a["partial_put_error"] < 1e-12, a
    assert "stored in pieces on several ranks" in a["local_view"]
    assert a["like"]                    # a tensor made like it is stored in the same pieces
    for variant, ops in out["operations"].items():
        assert ops.pop("pieced") == 1.0, variant
        assert set(ops) == {"copy", "like", "norm", "max_abs", "vdot", "dot", "zero", "add", "divide",
                            "hadamard", "contract", "held"}, variant
        assert all(e < 1e-10 for e in ops.values()), (variant, ops)
    for basis, key in (("sto-3g", "energies"), ("6-31g", "energies_631g")):
        e_hf, e_ccsd, e_t = pyscf_water[basis]
        e = out[key]
        assert e["e_hf"] == pytest.approx(e_hf, abs=1e-9)
        for run in [r for r in e if r != "e_hf"]:
            assert e[run]["e_ccsd"] == pytest.approx(e_ccsd, abs=1e-7), (basis, run)
            assert e[run]["e_t"] == pytest.approx(e_t, abs=1e-7), (basis, run)
        for run in [r for r in e if r != "e_hf"]:
            assert e[run]["pieced"] == CLASSES + ["t2"], (basis, run)


def test_collective_pieces_at_four_ranks_on_two_nodes():
    """mpi-collective with every block of the integral classes and T2 in 2 pieces
    (TESSERA_PIECES=2), at 4 ranks as 2 emulated nodes with nothing shared (a 3-rank
    one-node case took another two minutes of the suite; 3 ranks run every collective
    variant in test_distributed_mpi): the pieced operations against numpy with each operand stationary
    (a, b, c) and on the grid (never); CCSD(T) of water (C2v) and H2O2 (C1), STO-3G, on
    summa and 2.5d equal to serial (run in the same job) to 1e-10 Eh and to PySCF to 1e-7 Eh."""
    env = {"TESSERA_PIECES": "2", "TESSERA_EMULATE_NODES": "2", "MPIR_CVAR_NOLOCAL": "1",
           "TESSERA_PROGRESS": "none"}
    out = run_mpi(SCRIPT, 4, args=["--collective"], env=env, timeout=TIMEOUT)
    check_part_bytes(out["part_bytes"])
    for mode, ops in out["operations"].items():
        assert ops.pop("pieced") == 1.0, mode
        assert all(e < 1e-10 for e in ops.values()), (mode, ops)
    for xyz, e in out["energies"].items():
        e_hf, e_ccsd, e_t = ccsd_t_energies(rhf(Molecule.from_xyz(f"examples/{xyz}", basis="sto-3g").to_pyscf()))
        assert e["e_hf"] == pytest.approx(e_hf, abs=1e-9), xyz
        serial = e.pop("serial/None")
        for run in [r for r in e if r != "e_hf"]:
            assert e[run]["pieced"] == CLASSES + ["t2"], (xyz, run)
            assert abs(e[run]["e_ccsd"] - serial["e_ccsd"]) < 1e-10 and abs(e[run]["e_t"] - serial["e_t"]) < 1e-10, (xyz, run)
            assert e[run]["e_ccsd"] == pytest.approx(e_ccsd, abs=1e-7) and e[run]["e_t"] == pytest.approx(e_t, abs=1e-7), (xyz, run)


@pytest.fixture(scope="module")
def model_run():
    """``--model`` at 2 ranks as 2 emulated nodes with nothing shared, every block of a
    pieces tensor in 2 pieces (one run for the tests below)."""
    env = {"TESSERA_PIECES": "2", "TESSERA_EMULATE_NODES": "2", "MPIR_CVAR_NOLOCAL": "1",
           "TESSERA_PROGRESS": "none"}
    return run_mpi(SCRIPT, 2, args=["--model"], env=env, timeout=TIMEOUT)["model_bytes"]


def test_collective_bytes_on_pieces_are_the_models(model_run):
    """For steps of mpi-collective that read or write tensors in pieces (a contraction with
    each operand stationary and on the grid, summa and 2.5d; an outer product of one tensor
    with itself, stationary and on the grid; a sum with a transposed input; a Hadamard
    product), the bytes each rank's all-to-all and broadcast counters record received equal
    the cost model's (``step_bytes.step_recv``: the pieces a rank lacks, partial outputs cut
    at pieces; on the grid ``stationary.summa_recv``: parts to their homes, panels, output
    pieces). Before, the model counted a stationary pieced operand as moving nothing and the
    pieces of an output as not sent (the contraction with A or C stationary: 0 / 104 bytes
    on ranks 0 / 1 against 2464 / 2568 moved; with B: 2816 / 2816 against 3512 / 2800), and
    SUMMA's redistribution as an even share of every input and output, its panels as the
    average member's (its busiest rank: 2602 bytes on summa's 2 x 1 grid against 2624
    received, 3728 against 3888 on 2.5d's 1 x 1 x 2, 510 against 640 for the outer product)."""
    out = model_run["collective"]
    assert {k for run in out.values() for k in run["kinds"]} == {"contract", "add", "hadamard"}
    for name, run in out.items():
        assert run["pieced"] and sum(run["counted"]) > 0, (name, run)
        assert run["counted"] == run["model"], (name, run)


def test_onesided_sum_bytes_on_pieces_are_the_models(model_run):
    """mpi-onesided's sums, division and Hadamard product into a pieced output, variants
    original (accumulates) and owner (a get and a put per piece): the bytes each rank's
    get, accumulate and put counters record with other ranks equal the cost model's
    (``step_bytes.onesided_step_bytes``), where the model counted one dense output per
    step, zero steps included, as an even share over the ranks (here 2450 bytes per rank
    per step: the sum's three steps 7350 on each rank against 0 / 3152 moved); under owner
    so do each rank's gets and puts (``step_bytes.owner_other_ops``, not counted before)."""
    for name, run in model_run["onesided"].items():
        assert run["pieced"] and sum(run["counted"]) > 0, (name, run)
        assert run["counted"] == run["model"], (name, run)
        if name.endswith("/owner"):     # and each rank's gets and puts (``step_bytes.owner_other_ops``)
            assert run["ops_counted"] == run["ops_model"] and sum(map(sum, run["ops_counted"])) > 0, (name, run)


def test_held_bytes_under_forced_pieces_are_the_models(model_run):
    """The classes a CCSD run stores, each block cut in 2 pieces by TESSERA_PIECES: each
    rank's bytes of every class equal ``balance.loads`` and the fullest rank's T2 and
    integrals the memory estimate's stored bytes (``iteration_counts.structure_stats``); with the
    placement's own cut (whole blocks at 2 ranks here), as both ignored TESSERA_PIECES
    before, neither does."""
    held = model_run["held"]
    assert held["names"] == ["oooo", "oovv", "ovoo", "ovov", "ovvv", "t2", "vvvv"]
    for name, c in held["classes"].items():
        assert c["counted"] == c["model"], (name, c)
    assert any(c["counted"] != c["whole_cut"] for c in held["classes"].values())
    assert held["stored_max"]["counted"] == held["stored_max"]["model"] != held["stored_max"]["whole_cut"], held


def test_onesided_owner_contraction_bytes_are_the_models(model_run):
    """mpi-onesided's contractions on variant owner (owner computes: every output block's
    tasks on its home, a static deal by ownership; a contraction with a pieced A and
    output, an outer product into a pieced output): the bytes each rank's get and put
    counters record with other ranks equal the cost model's per rank
    (``step_bytes.onesided_owner_counts``: the distinct blocks and pieces a rank's tasks
    read that others hold, and the pieces of its outputs held elsewhere, got and put back),
    and so do its gets and puts. (The model counted the mean rank before: 2552 and 136
    bytes where the ranks move 0 / 7496 and 0 / 1632.)"""
    assert set(model_run["onesided_owner"]) == {"contract", "outer"}
    for name, run in model_run["onesided_owner"].items():
        assert run["pieced"] and sum(run["counted"]) > 0, (name, run)
        assert run["counted"] == run["model"], (name, run)
        assert run["ops_counted"] == run["ops_model"] and sum(map(sum, run["ops_counted"])) > 0, (name, run)


def test_collective_frozen_operand_past_the_cache_is_the_models(model_run):
    """mpi-collective's contraction with a frozen operand (M), run a second time (what every
    later iteration moves): the most bytes a rank's all-to-all and broadcast counters record
    equal the model's busiest rank (``collective_model.collective_traffic``) with the executor's frozen
    cache at its default bound (M kept: moved once) and at 0 MiB (nothing kept: M sent
    again, ``collective_model.frozen_resent``); so do the all-to-alls and broadcasts
    (``contraction_exchanges``: 2 and 4 here, the model charged 6 at either bound before). The model counted a frozen operand as moved once
    whatever the bound before: the 0 MiB run's bytes were above it."""
    kept, bound0 = model_run["frozen"]["512"], model_run["frozen"]["0"]
    for run in (kept, bound0):
        assert max(run["counted"]) == run["model"] > 0, model_run["frozen"]
        assert max(run["ops"]) == run["model_ops"], model_run["frozen"]
    assert bound0["model"] > kept["model"], model_run["frozen"]


def test_collective_frozen_input_of_a_sum_is_the_models(model_run):
    """mpi-collective's sums that read a frozen tensor (D; a division T / D into a pieced
    output, and a transposed copy of D into whole blocks), run a second time (what every later iteration
    moves): the most bytes a rank's all-to-all counters record equal the model's
    (``collective_model.collective_traffic``'s ``other_bytes``) with the frozen cache at its default
    bound (D kept: its blocks not sent again, ``CollectiveExecutor._exchange``) and at
    0 MiB (D sent again). The model counted a frozen input of a sum every iteration
    before, the 0 MiB figure at any bound. The all-to-alls each rank's counters record
    equal the model's (``other_exchanges``: one of the inputs unless every input is kept,
    one of partial outputs to a pieced output): the division 2 at either bound, the copy
    none while D is kept and 1 at 0 MiB (the model charged one per step before)."""
    for name, run in model_run["frozen_sums"].items():
        kept, bound0 = run["512"], run["0"]
        for got in (kept, bound0):
            assert max(got["counted"]) == got["model"], (name, run)
            assert got["ops"] == [got["model_ops"]] * 2, (name, run)
        assert bound0["model"] > kept["model"], (name, run)
    assert model_run["frozen_sums"]["copy"]["512"]["model_ops"] == 0 < model_run["frozen_sums"]["copy"]["0"]["model_ops"]


def test_collective_frozen_cache_keeps_part_of_a_cyclic_scan(model_run):
    """Three contractions, each with its own frozen operand, run in the same order three
    times (as CCSD's iterations) with the frozen cache bounded below what the three keep:
    the cache keeps what it holds when full, so the third run moves the operand that did
    not fit and no other: per contraction the busiest rank's bytes, summed, equal the
    model's (``collective_model.frozen_resent`` plays the same cache), less than least recently used
    out moves (it evicted each entry before its next read: nothing kept, as the model at a
    0-byte bound) and more than with every operand kept."""
    c = model_run["cyclic"]
    assert 0 < c["limit"] < c["frozen_total"], c
    assert c["counted"] == c["model"], c
    assert c["model_unbounded"] < c["counted"] < c["lru"] == c["model_nothing_kept"], c


def test_collective_grid_is_the_one_whose_counted_bytes_are_least(model_run):
    """W[ijkl] = T[ijcd] T[klcd] (T pieced, A and B one tensor) on the grid at 2 ranks: the
    executor runs it on the grid shape the model chooses (``stationary.summa_grid``: the
    least cost of the busiest rank as ``summa_recv`` counts it, the count that weighs the
    stationary modes too), and each rank's counted bytes are the model's there; the older
    even count (``summa_layout.grid_score``, which the executor's grid followed) took the
    other shape, where the busiest rank receives more (5536 bytes against 4992 here)."""
    g = model_run["grid"]
    assert g["executor_grids"] == [g["model_grid"]] and g["model_grid"] != g["old_grid"], g
    assert g["counted"] == g["model"], g
    assert max(g["model_old"]) > max(g["model"]), g
