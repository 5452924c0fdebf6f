"""`tessera run`: clear one-line errors for bad input, JSON for good input."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.cli.main import main

WATER = "examples/water.xyz"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("text, needle", [
    ("3\nwater\nO 0 0 0\nXx 0 0 1\nH 0 1 0\n", "Xx"),             # bad atom symbol
    ("4\nwater\nO 0 0 0\nH 0 0 1\nH 0 1 0\n", "4"),                # wrong count
    ("3\nwater\nO 0 0 0\nH 0 zero 1\nH 0 1 0\n", "zero"),          # non-numeric coordinate
    ("", "empty"),                                                 # empty file
])
def test_malformed_xyz(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.xyz"
    path.write_text(text)
    code, _, err = run(capsys, "run", str(path), "--method", "hf")
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err


@pytest.mark.parametrize("args, needle", [
    (["/nonexistent/mol.xyz"], "mol.xyz"),
    ([WATER, "--basis", "cc-pvqz-nonsense"], "cc-pvqz-nonsense"),
    ([WATER, "--method", "mp7"], "mp7"),
    ([WATER, "--backend", "quantum"], "quantum"),
    ([WATER, "--tile", "0"], "tile"),
    ([WATER, "--tile", "-4"], "tile"),
    ([WATER, "--charge", "1"], "electrons"),
    ([WATER, "--variant", "cached"], "several ranks"),                 # auto in one process
    ([WATER, "--backend", "threads", "--schedule", "steal"], "threads"),
    ([WATER, "--backend", "mpi-onesided", "--variant", "summa"], "summa"),
    ([WATER, "--backend", "mpi-collective", "--schedule", "nxtval"], "schedule"),
])
def test_bad_options(capsys, args, needle):
    code, _, err = run(capsys, "run", *args)
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err


def test_no_traceback_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "run", WATER, "--method", "bogus"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "bogus" in proc.stderr


def test_not_converged_still_writes_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, err = run(capsys, "run", WATER, "--method", "ccsd", "--max-iter", "2", "--json", str(out))
    assert code == 1
    assert "did not converge in 2 iterations" in err and "residual" in err
    data = json.loads(out.read_text())
    assert data["converged"] is False and len(data["iterations"]) == 2


def test_a_program_ends_with_its_exit_code_output_and_files(tmp_path):
    """As a program ``tessera run`` ends itself once the run has returned (cli.main's
    _end_program): the exit code, stdout written to a file (fully buffered), the JSON and
    the log records on stderr are all there, as after the interpreter's own teardown."""
    out, log = tmp_path / "r.json", tmp_path / "stdout.txt"
    with open(log, "w") as stdout:
        proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "run", WATER, "--basis", "sto-3g",
                               "--method", "ccsd", "--max-iter", "2", "--json", str(out)],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "did not converge in 2 iterations" in proc.stderr
    text = log.read_text()
    assert text.startswith("Tessera ") and "E(RHF)" in text
    data = json.loads(out.read_text())
    assert data["converged"] is False and len(data["iterations"]) == 2


@pytest.mark.parametrize("which", ["one", "all"])
def test_error_on_some_ranks_ends_the_whole_mpi_run(which):
    """An error raised on one rank after MPI started aborts every rank (MPI_Abort with 2,
    one message) instead of leaving the others waiting in a collective. mpiexec's own
    status is then 2 or the signal it ended the other ranks with: only non-zero is sure."""
    from mpirun import run_mpi_raw
    script = Path(__file__).parent / "mpi" / "cli_rank_error.py"
    run = run_mpi_raw(script, 3, args=[which], timeout=90)
    assert not run.timed_out, run.describe()
    assert run.returncode != 0, run.describe()
    assert "MPI_Abort" in run.stderr, run.describe()
    assert "passed_barrier" not in run.stdout
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("error: deliberate failure")]
    expected = "error: deliberate failure on rank 1 (on rank 1)" if which == "one" else \
        "error: deliberate failure on rank 0"
    assert lines == [expected], run.describe()


def test_one_process_backend_under_mpiexec_is_an_error(monkeypatch, capsys):
    """serial/threads started by mpiexec on several ranks would run independent copies
    that all write the same JSON: refused before anything runs."""
    monkeypatch.setenv("PMI_SIZE", "2")
    code, _, err = run(capsys, "run", WATER, "--backend", "threads")
    assert code == 2 and "mpiexec started 2" in err


def test_auto_context_routes_by_variant():
    """Context("auto") picks the executor the variant belongs to, and passes options on."""
    from tessera.backends.registry import resolve_auto as resolve
    from tessera.errors import InputError
    assert resolve(4, variant="summa") == ("mpi-collective", {"variant": "summa"})
    assert resolve(4, variant="2.5d", layers=2) == ("mpi-collective", {"variant": "2.5d", "layers": 2})
    assert resolve(4) == ("mpi-onesided", {"variant": "cached", "schedule": "nxtval"})
    assert resolve(1) == ("threads", {})
    with pytest.raises(InputError, match="variant"):
        resolve(1, variant="cached")


def test_json_phases_time_iterations_flops(tmp_path, capsys):
    """Each phase's seconds, iterations and flops (where defined) in the JSON; the SCF's
    mode is the one asked for (auto: in memory for a molecule this small)."""
    for mode, expect in (("auto", "incore"), ("direct", "direct")):
        out = tmp_path / f"{mode}.json"
        code, _, _ = run(capsys, "run", WATER, "--basis", "sto-3g", "--method", "ccsd",
                         "--scf-mode", mode, "--json", str(out))
        assert code == 0
        data = json.loads(out.read_text())
        ph = data["phases"]
        assert ph["scf"]["mode"] == expect and ph["scf"]["iterations"] >= 2
        assert ph["scf"]["seconds"] == data["timings"]["scf"] >= ph["scf"]["fock_s"] > 0
        assert ph["transform"]["seconds"] == data["timings"]["transform"] > 0
        assert ph["ccsd"]["iterations"] == len(data["iterations"]) >= 2
        assert ph["ccsd"]["flops"] == ph["ccsd"]["flops_per_iteration"] * ph["ccsd"]["iterations"] > 0
    code, _, err = run(capsys, "run", WATER, "--scf-mode", "disk")
    assert code == 2 and "unknown mode 'disk'" in err


def test_deferred_imports_run_on_first_use():
    """A program defers numpy.f2py and scipy.optimize (cli.deferred): importing the run's
    modules leaves their code unrun, and the first attribute read (``from ... import``,
    PySCF's own reference to scipy.optimize) gets the real module, with working functions."""
    code = """if True:
        import math, sys
        from tessera.cli.deferred import DEFERRED, defer
        defer()
        import tessera.chem.job, pyscf.scf.diis
        assert all("__all__" not in vars(sys.modules[n]) for n in DEFERRED), "loaded at import"
        from scipy.optimize import brentq
        assert abs(brentq(lambda x: x * x - 2.0, 0.0, 2.0) - math.sqrt(2.0)) < 1e-12
        res = pyscf.scf.diis.scipy.optimize.minimize(lambda x: (x[0] - 3.0) ** 2, [0.0], method="BFGS")
        assert abs(res.x[0] - 3.0) < 1e-6, res.x
        import numpy
        assert numpy.f2py.__name__ == "numpy.f2py" and callable(numpy.f2py.get_include)
        print("ok")
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
