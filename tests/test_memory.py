"""The memory estimate printed before the SCF, and ``--max-memory``.

The estimate of the peak memory per rank must be within 30% of the peak resident
memory measured for the run's own process (ru_maxrss of a child process, read by an
intermediate process that runs nothing else); a run estimated above --max-memory is
refused with one line, naming what would fit, before the SCF starts; ``tessera plan``
prints the whole estimate.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mpirun import build_env

import tessera.chem.job as job_module
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


def test_refused_before_the_scf(monkeypatch, capsys):
    def no_scf(*_):
        raise AssertionError("the SCF started")
    monkeypatch.setattr(job_module.Job, "_scf", no_scf)
    code = main(["run", str(REPO / "examples" / "water_trimer.xyz"), "--basis", "cc-pvdz", "--method", "ccsd",
                 "--max-memory", "400M"])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "more than --max-memory 400 MiB" in err and "would fit: mpiexec -n" in err
    assert "Memory per rank (estimate" in out and "RHF" not in out


def test_nothing_fits(capsys):
    code = main(["run", WATER, "--basis", "sto-3g", "--max-memory", "1M"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "neither more ranks" in err


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf", "5X", "", "1e999"])
def test_bad_max_memory(capsys, value):
    code = main(["run", WATER, "--basis", "sto-3g", "--max-memory", value])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and "--max-memory" in err and "Traceback" not in err


def test_max_memory_units():
    from tessera.chem.memory import parse_size
    assert parse_size("4000") == 4000 and parse_size("500M") == 500 and parse_size("2GiB") == 2048
    assert parse_size("8GB") == 8192 and parse_size("1t") == 2**20 and parse_size(" 512 KB ") == 0.5


def test_plan_prints_the_whole_estimate(capsys):
    assert main(["plan", WATER, "--basis", "6-31g", "--method", "ccsd(t)"]) == 0
    out = capsys.readouterr().out
    assert "Memory per rank (estimate" in out
    for phase in ("scf", "transform", "ccsd", "(t)"):
        assert f"\n  {phase} " in out
    assert "held" in out and "half-transformed" in out and "baseline" in out
