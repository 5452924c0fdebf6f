"""Run records, the Chrome trace, the end-of-run table, `tessera report`, --progress/--ghosts.

- A scripted exchange under mpiexec (tests/mpi/profile_records.py) with known gets,
  puts, accumulates, counter operations and collective sizes: the recorded events equal
  what each rank asked for, per operation and peer; the rank x rank matrix adds up to
  the per-operation totals; the trace is valid Chrome Trace Event JSON with every rank.
- Real profiled runs of water (1 rank threads, 2 ranks mpi-onesided): the files, the
  report's text and every figure, a scaling report of both, and the bad inputs.
- Distributed CCSD(T) with ghost progress from the command line against PySCF.
"""

import json
import shutil
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from mpirun import run_mpi, run_mpi_raw

from tessera.cli.main import main
from tessera.profile.commlog import is_collective
from tessera.profile.run import rows

MPI_DIR = Path(__file__).parent / "mpi"
TESSERA = Path(sys.executable).parent / "tessera"
WATER = "examples/water.xyz"
RUN = ["run", WATER, "--basis", "sto-3g", "--no-symmetry"]
TIMEOUT = 300
_cache: dict = {}


def scripted(nprocs, tmp_factory):
    if nprocs not in _cache:
        d = tmp_factory.mktemp(f"scripted{nprocs}")
        _cache[nprocs] = (run_mpi(MPI_DIR / "profile_records.py", nprocs, args=[str(d)], timeout=TIMEOUT), d)
    return _cache[nprocs]


def rank_files(d, n):
    return [json.loads((Path(d) / f"records.{r}.json").read_text()) for r in range(n)]


def check_trace(trace: dict, nranks: int) -> None:
    """Valid Chrome Trace Event JSON: fields, durations, nesting per thread, every rank."""
    events = trace["traceEvents"]
    assert events
    for e in events:
        assert {"name", "ph", "ts", "pid"} <= set(e) or e["ph"] == "M", e
        assert {"name", "ph", "pid"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
    assert {e["pid"] for e in events if e["ph"] == "X"} == set(range(nranks))
    threads = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            threads[(e["pid"], e["tid"])].append((e["ts"], -e["dur"], e))
    tol = 1e-3           # microseconds: float rounding of start + duration
    for evs in threads.values():
        stack = []
        for ts, _, e in sorted(evs, key=lambda x: (x[0], x[1])):
            end = ts + e["dur"]
            while stack and stack[-1] <= ts + tol:
                stack.pop()
            assert not stack or end <= stack[-1] + tol, f"{e['name']} overlaps its enclosing event"
            stack.append(end)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_scripted_records_equal_requests(nprocs, tmp_path_factory):
    out, d = scripted(nprocs, tmp_path_factory)
    recs = rank_files(d, nprocs)
    for rank, (rec, asked) in enumerate(zip(recs, out["per_rank"])):
        window = next(g for g in rows(rec, "regions") if g["name"] == "scripted exchange")
        lo, hi = window["start"], window["start"] + window["seconds"]
        inside = [o for o in rows(rec, "ops") if lo <= o["start"] and o["start"] + o["seconds"] <= hi + 1e-9]
        got, received = {}, defaultdict(int)
        for o in inside:
            if not is_collective(o["op"]) and o["bytes"]:
                c, b = got.get(f"{o['op']}:{o['peer']}", (0, 0))
                got[f"{o['op']}:{o['peer']}"] = (c + 1, b + o["bytes"])
            for peer, n in o["peers"]:
                received[f"{o['op']}:{peer}"] += n
        assert got == {k: tuple(v) for k, v in asked["expected"].items()}, rank
        assert dict(received) == asked["received"], rank
        # every event together gives the per-operation totals
        for op, t in rec["totals"].items():
            evs = [o for o in rows(rec, "ops") if o["op"] == op]
            assert sum(o["bytes"] for o in evs) == t["bytes"]
            assert sum(o["seconds"] for o in evs) == pytest.approx(t["seconds"], rel=1e-9, abs=1e-12)
    tasks = sorted(t["index"] for rec in recs for t in rows(rec, "tasks") if t["name"] == "sleepy tasks")
    assert tasks == list(range(3 * nprocs))            # each task recorded once, on the rank that ran it


@pytest.mark.parametrize("nprocs", [2, 3])
def test_matrix_adds_up_to_totals(nprocs, tmp_path_factory):
    out, d = scripted(nprocs, tmp_path_factory)
    s = out["summary"]
    index = json.loads((Path(d) / "records.json").read_text())
    assert index["summary"] == json.loads(json.dumps(s))
    one = [[int(v) for v in row] for row in s["matrix"]["one_sided"]]
    coll = s["matrix"]["collective"]
    ops = s["ops"]
    assert sum(map(sum, one)) == sum(t["bytes"] for op, t in ops.items() if not is_collective(op))
    off_diag = sum(v for i, row in enumerate(one) for j, v in enumerate(row) if i != j)
    assert off_diag == sum(t["moved_bytes"] for op, t in ops.items() if not is_collective(op))
    assert sum(map(sum, coll)) == sum(t["moved_bytes"] for op, t in ops.items() if is_collective(op))
    assert all(coll[i][i] == 0 for i in range(nprocs))
    # bcast of 8000 bytes from rank 0 reached every other rank
    assert all(coll[i][0] >= 8000 for i in range(1, nprocs))
    assert s["compute_seconds"] >= 3 * nprocs * 0.002          # the sleepy tasks' work is compute
    assert s["efficiency"] == pytest.approx(s["compute_seconds"] / (s["wall_seconds"] * nprocs))


@pytest.mark.parametrize("nprocs", [2, 3])
def test_trace_is_valid_chrome_trace(nprocs, tmp_path_factory):
    _, d = scripted(nprocs, tmp_path_factory)
    check_trace(json.loads((Path(d) / "trace.json").read_text()), nprocs)


# ------------------------------------------------------------------ real profiled runs
@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    base = tmp_path_factory.mktemp("profiles")
    one, two = base / "one", base / "two"
    assert main(RUN + ["--method", "ccsd", "--profile", str(one)]) == 0
    run = run_mpi_raw(TESSERA, 2, args=RUN + ["--method", "ccsd", "--backend", "mpi-onesided",
                                              "--profile", str(two)], timeout=TIMEOUT)
    assert run.returncode == 0, run.describe()
    assert run.stdout.count("Run statistics (2 rank(s)") == 1 and "E(2) =" in run.stdout
    return one, two


def test_profiled_run_files(profiles):
    for d, n in zip(profiles, (1, 2)):
        result = json.loads((d / "result.json").read_text())
        index = json.loads((d / "records.json").read_text())
        assert result["ranks"] == n and index["summary"]["ranks"] == n
        assert result["statistics"] == index["summary"]
        recs = rank_files(d, n)
        kinds = {g["kind"] for g in rows(recs[0], "regions")}
        assert {"phase", "iteration", "contract", "tasks"} <= kinds
        names = {g["name"] for g in rows(recs[0], "regions")}
        assert {"scf", "transform", "ccsd", "SCF iteration", "CCSD iteration", "scf.fock"} <= names
        iterations = [g for g in rows(recs[0], "regions") if g["name"] == "CCSD iteration"]
        assert len(iterations) == len(result["iterations"])
        assert rows(recs[0], "tasks")
        check_trace(json.loads((d / "trace.json").read_text()), n)
        assert not list(d.glob("*.part"))                  # the ranks' trace parts were joined
        s = index["summary"]
        assert 0 < s["efficiency"] <= 1
        for r in s["per_rank"]:
            assert sum(r[k] for k in ("compute", "one_sided", "collective", "counter", "idle")) \
                == pytest.approx(r["wall"], rel=1e-6) or r["idle"] == 0
    two = json.loads((profiles[1] / "records.json").read_text())["summary"]
    assert two["ops"]["get"]["calls"] > 0 and two["ops"]["acc"]["calls"] > 0
    m = two["matrix"]
    assert sum(map(sum, m["one_sided"])) == sum(two["ops"][op]["bytes"] for op in ("get", "put", "acc", "fetch_add")
                                                 if op in two["ops"])


def test_end_of_run_table_without_profile(capsys):
    assert main(RUN + ["--method", "hf"]) == 0
    out = capsys.readouterr().out
    assert "Run statistics (1 rank(s), 1 node(s)" in out and "Computational efficiency E(1)" in out


FIGURES_ONE = ("terms", "breakdown", "matrix")


@pytest.mark.parametrize("which", [0, 1])
def test_report_text_and_figures(profiles, tmp_path, capsys, which):
    d = profiles[which]
    out = tmp_path / "rep"
    assert main(["report", str(d), "--out", str(out)]) == 0
    text = (out / "report.txt").read_text()
    assert text == capsys.readouterr().out.split("Report written")[0]
    assert "Phases" in text and "Equation terms" in text and "E(" in text
    assert "R2[ijab] +=" in text and "scf.fock" in text
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 3 and all(any(p.startswith(f) for p in pngs) for f in FIGURES_ONE)
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    for p in out.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scaling_report(profiles, tmp_path, capsys):
    out = tmp_path / "scaling"
    assert main(["report", str(profiles[0]), str(profiles[1]), "--out", str(out)]) == 0
    text = (out / "report.txt").read_text()
    assert "Scaling" in text
    names = {p.name for p in out.glob("*.png")}
    assert {"scaling.png", "bytes.png"} <= names and len(names) == 8


def one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_report_bad_input(profiles, tmp_path, capsys):
    assert "does not exist" in one_line_error(capsys, ["report", str(tmp_path / "missing")])
    old = tmp_path / "old"
    shutil.copytree(profiles[0], old)
    index = json.loads((old / "records.json").read_text())
    index["format"] = "tessera-profile-0"
    (old / "records.json").write_text(json.dumps(index))
    assert "profile format" in one_line_error(capsys, ["report", str(old)])
    other = tmp_path / "other"
    assert main(["run", WATER, "--basis", "6-31g", "--method", "hf", "--profile", str(other)]) == 0
    capsys.readouterr()
    assert "different calculations" in one_line_error(capsys, ["report", str(profiles[0]), str(other)])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "records.json does not exist" in one_line_error(capsys, ["report", str(empty)])


# ------------------------------------------------------------------ --progress / --ghosts
@pytest.fixture(scope="module")
def pyscf_water_c1():
    from pyscf import gto
    from pyscf_energies import ccsd_t_energies, rhf
    from tessera.chem.molecule import Molecule
    mol = Molecule.from_xyz(WATER, basis="sto-3g").to_pyscf(symmetry=False)
    assert isinstance(mol, gto.Mole)
    return ccsd_t_energies(rhf(mol))


def test_ghost_progress_ccsd_t(pyscf_water_c1, tmp_path):
    out = tmp_path / "ghost.json"
    run = run_mpi_raw(TESSERA, 3, args=RUN + ["--backend", "mpi-onesided", "--progress", "ghost", "--ghosts", "1",
                                              "--conv", "1e-10", "--json", str(out)], timeout=TIMEOUT)
    assert run.returncode == 0, run.describe()
    data = json.loads(out.read_text())
    e_hf, e_cc, e_t = pyscf_water_c1
    assert data["ranks"] == 2 and data["statistics"]["ranks_total"] == 3
    assert "(2 rank(s) + 1 ghost(s)" in run.stdout
    assert abs(data["energies"]["hf"] - e_hf) < 1e-9
    assert abs(data["energies"]["ccsd_correlation"] - e_cc) < 1e-7
    assert abs(data["energies"]["t_correction"] - e_t) < 1e-7


def test_progress_options_are_checked(capsys):
    assert "apply to MPI runs" in one_line_error(capsys, RUN + ["--progress", "thread"])
    run = run_mpi_raw(TESSERA, 2, args=RUN + ["--backend", "mpi-onesided", "--progress", "sideways"],
                      timeout=TIMEOUT)
    assert run.returncode == 2 and "unknown progress mode 'sideways'" in run.stderr
    run = run_mpi_raw(TESSERA, 2, args=RUN + ["--backend", "mpi-onesided", "--progress", "none", "--ghosts", "1"],
                      timeout=TIMEOUT)
    assert run.returncode == 2 and "ghost ranks exist only with progress 'ghost'" in run.stderr


# ------------------------------------------------------------------ energy counters
def test_energy_meter_reads_and_unwraps_rapl(tmp_path):
    from tessera.profile.energy import EnergyMeter
    pkg, sub = tmp_path / "intel-rapl:0", tmp_path / "intel-rapl:0:0"
    for d in (pkg, sub):
        d.mkdir()
        (d / "max_energy_range_uj").write_text("1000000\n")
    (pkg / "energy_uj").write_text("900000\n")
    (sub / "energy_uj").write_text("5\n")
    meter = EnergyMeter(str(tmp_path))
    assert meter.available and meter.reason == ""
    j0 = meter.read()
    (pkg / "energy_uj").write_text("950000\n")
    assert meter.read() - j0 == pytest.approx(0.05)          # 50 000 µJ
    (pkg / "energy_uj").write_text("100000\n")                # wrapped at 1 J
    assert meter.read() - j0 == pytest.approx(0.05 + 0.15)   # + (1e6 - 950000 + 100000) µJ


def test_energy_unavailable_says_why(tmp_path, profiles):
    from tessera.profile.energy import EnergyMeter, gpu_reason
    meter = EnergyMeter(str(tmp_path / "no-powercap"))
    assert not meter.available and meter.read() is None and "no intel-rapl" in meter.reason
    from tessera.profile.report import Profile, run_text
    energy = json.loads((profiles[0] / "records.json").read_text())["summary"]["energy"]
    text = run_text(Profile(str(profiles[0])))
    assert f"Energy to solution (GPU, NVML): unavailable: {energy['gpu_reason']}" in text
    assert energy["gpu_reason"] == gpu_reason() and not energy["gpu_available"]
    assert "no NVIDIA GPU" in gpu_reason(str(tmp_path / "nvidia[0-9]*"))
    (tmp_path / "nvidia0").write_text("")
    assert "ran nothing of the run" in gpu_reason(str(tmp_path / "nvidia[0-9]*"))
    if not energy["available"]:                  # this machine: the report gives the reason
        assert f"Energy to solution: unavailable: {energy['reason']}" in text and energy["reason"]
    else:
        assert "Energy to solution (CPU packages" in text
        assert set(energy["joules"]) >= {"scf", "transform", "ccsd"} and energy["total"] > 0
