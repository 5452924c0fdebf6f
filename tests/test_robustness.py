"""`tessera run` never loses a result and refuses hostile input early.

Small molecules through (T) equal PySCF; an internal error exits 3 and keeps the finished
phases; a failing write leaves the previous JSON intact; SIGINT to one of two MPI ranks
ends both; every hostile case of the list is one line, before the SCF, or a correct
result; a one-process run never starts MPI; -q / -v / progress lines / the header.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tessera.chem.job as job_module
import tessera.chem.outcome as outcome
from tessera.cli.main import main

REPO = Path(__file__).resolve().parents[1]
WATER = "examples/water.xyz"
N2 = "2\nN2\nN 0 0 0\nN 0 0 1.1\n"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def pyscf_ccsd_t(xyz_text: str) -> float:
    from pyscf import cc, gto, scf
    atoms = "\n".join(xyz_text.strip().splitlines()[2:])
    mf = scf.RHF(gto.M(atom=atoms, basis="sto-3g", symmetry=True, verbose=0))
    mf.conv_tol = 1e-12
    mf.kernel()
    mycc = cc.CCSD(mf)
    mycc.conv_tol, mycc.conv_tol_normt = 1e-11, 1e-8
    mycc.kernel()
    return float(mf.e_tot + mycc.e_corr + mycc.ccsd_t())


# ---------------------------------------------------------------- never lose a result
@pytest.mark.parametrize("name, backend", [("water", "serial"), ("n2", "threads")])
def test_small_molecules_through_triples_equal_pyscf(tmp_path, capsys, name, backend):
    """Water and N2 in STO-3G have irreps without virtual orbitals; (T) once failed there."""
    text = (REPO / WATER).read_text() if name == "water" else N2
    xyz = tmp_path / f"{name}.xyz"
    xyz.write_text(text)
    out = tmp_path / "r.json"
    code, _, err = run(capsys, "run", str(xyz), "--basis", "sto-3g", "--backend", backend,
                       "--conv", "1e-10", "--json", str(out))
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["completed"] == ["scf", "transform", "ccsd", "triples"]
    assert 0 in data["virtual_per_irrep"].values() or len(data["virtual_per_irrep"]) < 4
    assert abs(data["energies"]["total"] - pyscf_ccsd_t(text)) < 1e-7


def test_internal_error_exits_3_and_keeps_the_finished_phases(tmp_path):
    """A bug (here an injected ValueError in (T)) in a real process: one line naming the
    phase, exit 3, the JSON of SCF, transform and CCSD on disk, the traceback beside it."""
    out = tmp_path / "r.json"
    code = ("import sys, tessera.chem.job as job, tessera.cli.main as cli\n"
            "def broken(*a, **k): raise ValueError('injected failure')\n"
            "job.triples_correction = broken\n"
            f"sys.exit(cli.main(['run', {WATER!r}, '--basis', 'sto-3g', '--json', {str(out)!r}], "
            "handle_signals=True))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert lines[0].startswith("error: internal error during triples, please report: ValueError: injected")
    data = json.loads(out.read_text())
    assert data["completed"] == ["scf", "transform", "ccsd"]
    assert data["error"]["kind"] == "internal error" and data["error"]["phase"] == "triples"
    assert abs(data["energies"]["ccsd_correlation"] - (-0.04951347)) < 1e-6
    tb = tmp_path / "r.traceback.txt"
    assert str(tb) in lines[0] and "ValueError: injected failure" in tb.read_text()


@pytest.mark.parametrize("where", ["write", "fsync", "rename"])
def test_a_failing_write_never_corrupts_the_previous_json(tmp_path, capsys, monkeypatch, where):
    """A full disk (the write, the flush or the rename fails): one line, exit 2, the old
    file byte for byte, no temporary file left."""
    out = tmp_path / "r.json"
    old = json.dumps({"energies": {"total": -75.0}, "completed": ["scf"]})
    out.write_text(old)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")
    if where == "write":
        real_open = open

        class Full:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, text):
                self.f.write(text[:10])
                full()
        monkeypatch.setattr(outcome, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    elif where == "fsync":
        monkeypatch.setattr(outcome.os, "fsync", full)
    else:
        monkeypatch.setattr(outcome.os, "replace", full)
    code, _, err = run(capsys, "run", WATER, "--basis", "sto-3g", "--method", "hf", "--json", str(out))
    assert code == 2 and err.count("\n") == 1
    assert "No space left on device" in err and "unchanged" in err
    assert out.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


@pytest.mark.parametrize("flag", ["--json", "--checkpoint", "--qcschema"])
def test_an_unwritable_output_folder_is_refused_at_start(tmp_path, capsys, monkeypatch, flag):
    """A folder where no file can be created (emulated: root may write anywhere) is one
    line before the SCF, not an error after the whole run."""
    import tempfile
    locked = tmp_path / "locked"
    locked.mkdir()
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == locked:
            raise PermissionError(13, "Permission denied")
        return real(*args, dir=dir, **kwargs)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(job_module.Job, "_scf", lambda *_: pytest.fail("the SCF started"))
    others = [] if flag == "--checkpoint" else ["--checkpoint", str(tmp_path / "c.chk.h5")]
    code, _, err = run(capsys, "run", WATER, "--basis", "sto-3g", *others, flag, str(locked / "out.file"))
    assert code == 2 and err.count("\n") == 1 and flag in err and "cannot create files" in err


def test_atomic_write_replaces_the_whole_file(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("x" * 10000)
    outcome.write_json(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}


def _launch_interrupt(tmp_path, nprocs, backend):
    from mpirun import build_env, mpiexec_path
    script = [sys.executable, str(REPO / "tests" / "mpi" / "cli_interrupt.py"), str(tmp_path), backend]
    cmd = script if nprocs is None else [str(mpiexec_path()), "-n", str(nprocs), *script]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env=build_env(), start_new_session=True)
    ranks = 1 if nprocs is None else nprocs
    deadline = time.monotonic() + 240
    while not all((tmp_path / f"rank{r}.waiting").exists() for r in range(ranks)):
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"the run never reached (T): exit {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}")
        time.sleep(0.2)
    return proc


@pytest.mark.parametrize("nprocs, backend, sig, target", [
    (2, "mpi-onesided", signal.SIGINT, 1),     # rank 1 is blocked inside MPI, rank 0 in Python
    (2, "mpi-onesided", signal.SIGTERM, 0),
    (None, "serial", signal.SIGINT, 0),
])
def test_a_signal_to_one_rank_ends_every_rank_and_keeps_the_phases(tmp_path, nprocs, backend, sig, target):
    proc = _launch_interrupt(tmp_path, nprocs, backend)
    os.kill(int((tmp_path / f"rank{target}.pid").read_text()), sig)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still running 10 s after {sig.name} to rank {target}\n{err[-3000:]}")
    assert time.monotonic() - t0 < 10
    assert proc.returncode == 128 + sig if nprocs is None else proc.returncode != 0
    said = [ln for ln in err.splitlines() if ln.startswith("error: interrupted")]
    assert len(said) == 1 and f"by {sig.name} during triples" in said[0], err
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["completed"] == ["scf", "transform", "ccsd"]
    if target == 0:             # the rank that writes the JSON saw the signal
        assert data["error"] == {"phase": "triples", "kind": "interrupted", "signal": sig.name}
    import h5py                 # and the checkpoint (default: next to the JSON) holds the CCSD
    with h5py.File(tmp_path / "out.chk.h5", "r") as f:
        assert int(f.attrs["iteration"]) == len(data["iterations"]) >= 1
    # stdout is line-buffered: the iteration table made it out before the abrupt end
    assert "E(corr)" in out and "Tessera" in out.splitlines()[0]


def test_a_one_process_run_never_starts_mpi():
    """serial, threads and auto without mpiexec must work where MPI cannot even be imported."""
    code = ("import sys\n"
            "sys.modules['mpi4py'] = None          # any import of mpi4py now fails\n"
            "from tessera.cli.main import main\n"
            "for backend in ('serial', 'threads', 'auto'):\n"
            f"    assert main(['run', {WATER!r}, '--basis', 'sto-3g', '--backend', backend, '-q']) == 0\n"
            "assert main(['plan', 'examples/water.xyz', '--basis', 'sto-3g']) == 0\n"
            "print('mpi-free', not any(m.startswith('mpi4py.') for m in sys.modules))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "HYDRA"))}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**env, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("mpi-free True")


# ---------------------------------------------------------------- hostile input
HOSTILE = [
    ([WATER, "--charge", "-10"], {}, "20 electrons"),             # more electrons than orbitals hold
    ([WATER, "--charge", "10"], {}, "0 electrons"),
    ([WATER, "--conv", "inf"], {}, "--conv"),
    ([WATER, "--conv", "nan"], {}, "--conv"),
    ([WATER, "--conv=-1e-8"], {}, "--conv"),
    ([WATER, "--scf-max-iter", "0"], {}, "--scf-max-iter"),
    ([WATER, "--json", ""], {}, "--json needs a file name"),
    ([WATER, "--json", "{tmp}/missing/r.json"], {}, "does not exist"),
    ([WATER, "--json", "{tmp}"], {}, "is a directory"),
    ([WATER, "--json", WATER], {}, "is the input file"),
    ([WATER, "--json", f"{WATER}/r.json"], {}, "does not exist"),
    ([WATER], {"TESSERA_MEMORY_PER_RANK_MB": "nan"}, "TESSERA_MEMORY_PER_RANK_MB"),
    ([WATER], {"TESSERA_MEMORY_PER_RANK_MB": "-100"}, "TESSERA_MEMORY_PER_RANK_MB"),
    ([WATER], {"TESSERA_BLAS_THREADS": "0"}, "TESSERA_BLAS_THREADS"),
    ([WATER], {"TESSERA_BLAS_THREADS": "two"}, "TESSERA_BLAS_THREADS"),
    ([WATER], {"TESSERA_PROGRESS": "fast"}, "TESSERA_PROGRESS"),
    ([WATER, "--method", "mp7"], {"PMI_RANK": "1"}, "mp7"),        # a stray PMI_RANK must not silence it
    ([WATER], {"TESSERA_EMULATE_NODES": "0"}, "TESSERA_EMULATE_NODES"),
    ([WATER], {"PMIX_RANK": "0"}, "cannot tell one process from several"),     # auto refuses
    ([WATER], {"PMI_SIZE": "two", "PMI_RANK": "0"}, "PMI_SIZE='two'"),
]


@pytest.mark.parametrize("args, env, needle", HOSTILE)
def test_hostile_input_is_one_line_before_the_scf(tmp_path, capsys, monkeypatch, args, env, needle):
    import tessera.chem.scf as scf

    def no_scf(*a, **k):
        raise AssertionError("the SCF started")
    monkeypatch.setattr(scf, "rhf", no_scf)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code, _, err = run(capsys, "run", *[a.format(tmp=tmp_path) for a in args], "--basis", "sto-3g")
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err
    assert "Traceback" not in err
    assert (REPO / WATER).read_text().startswith("3\n")        # the input is untouched


def test_xyz_with_a_byte_order_mark_gives_the_right_energy(tmp_path, capsys):
    from pyscf import gto, scf
    text = (REPO / WATER).read_text()
    xyz = tmp_path / "bom.xyz"
    xyz.write_bytes(b"\xef\xbb\xbf" + text.encode())
    out = tmp_path / "r.json"
    code, _, err = run(capsys, "run", str(xyz), "--basis", "sto-3g", "--method", "hf", "--json", str(out))
    assert code == 0, err
    mf = scf.RHF(gto.M(atom="\n".join(text.splitlines()[2:]), basis="sto-3g", verbose=0))
    mf.conv_tol = 1e-12
    assert abs(json.loads(out.read_text())["energies"]["hf"] - mf.kernel()) < 1e-9


def test_scf_not_converged_exits_1_and_writes_what_it_reached(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, err = run(capsys, "run", WATER, "--basis", "sto-3g", "--scf-max-iter", "2",
                            "--json", str(out))
    assert code == 1
    assert "RHF did not converge in 2 iterations" in err and "--scf-max-iter" in err
    assert "max_iter" not in err.replace("--scf-max-iter", "")
    assert "NOT CONVERGED" in stdout
    data = json.loads(out.read_text())
    assert data["converged"] is False and data["completed"] == [] and data["error"]["phase"] == "scf"


def test_ccsd_not_converged_is_marked(tmp_path, capsys):
    out = tmp_path / "r.json"
    code, stdout, _ = run(capsys, "run", WATER, "--basis", "sto-3g", "--max-iter", "2", "--json", str(out))
    assert code == 1
    total = [ln for ln in stdout.splitlines() if ln.startswith("E total")]
    assert total and all(ln.endswith("NOT CONVERGED") for ln in total)
    assert "*** NOT CONVERGED" in stdout
    data = json.loads(out.read_text())
    assert data["completed"] == ["scf", "transform"] and data["converged"] is False


def test_hints_name_command_line_flags(tmp_path, capsys):
    xyz = tmp_path / "close.xyz"
    xyz.write_text("2\nclose\nH 0 0 0\nH 0 0 0.05\n")
    code, _, err = run(capsys, "run", str(xyz), "--method", "hf")
    assert code == 2 and "units=" not in err and "Ångström" in err


# ---------------------------------------------------------------- logs for batch jobs
def test_quiet_prints_only_the_final_energies(capsys):
    code, out, _ = run(capsys, "run", WATER, "--basis", "sto-3g", "-q")
    assert code == 0
    labels = [ln.split("  ")[0].strip() for ln in out.strip().splitlines()]
    assert labels == ["E(RHF)", "E(CCSD) correlation", "E(T) correction", "E total"]


def test_verbose_shows_scf_iterations_and_throttled_progress(capsys, monkeypatch):
    import tessera.backends.tasklog as tasklog
    monkeypatch.setattr(tasklog, "MIN_INTERVAL", 0.0)     # small runs end within the usual interval
    code, out, _ = run(capsys, "run", WATER, "--basis", "sto-3g", "--backend", "serial", "-v")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("Tessera ") and " UTC" in lines[0]
    assert "Ranks 1, threads per rank 1, BLAS " in lines[1]
    import numpy
    from threadpoolctl import threadpool_info          # NumPy's OpenBLAS's kernels, as it reports them
    libs = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    lib = next((i for i in libs if i["filepath"].startswith(os.path.dirname(numpy.__file__))), libs[0])
    assert (f"({lib['architecture']} kernels)" in lines[1]) == bool(lib.get("architecture"))
    assert (lib.get("version") or "") in lines[1]
    assert any(ln.startswith("RHF iter   1") for ln in lines)
    # one process with the AO integrals in memory: the transform's one task set is its finish
    for name in ("(T) triples", "transform: finish"):
        mine = [ln for ln in lines if ln.startswith(name + ": done ")]
        assert 1 <= len(mine) <= 10, (name, mine)
        percents = [int(ln.split("(")[-1].split("%")[0]) for ln in mine]
        assert percents == sorted(percents) and percents[-1] == 100 and mine[-1].endswith(" s")


def test_progress_lines_under_mpi_are_estimates_from_rank_0(caplog, monkeypatch):
    import logging

    import tessera.backends.tasklog as tasklog
    monkeypatch.setattr(tasklog, "MIN_INTERVAL", 0.0)
    with caplog.at_level(logging.INFO, logger="tessera.progress"):
        for rank in (1, 0):                       # rank 1 stays silent
            progress = tasklog.TaskProgress("(T) triples", 40, rank=rank, nranks=2)
            work = progress.wrap(lambda i, blocks: float(i))
            assert [work(i, {}) for i in range(20)] == [float(i) for i in range(20)]
            progress.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10
    assert all("(rank 0 ran " in ln for ln in lines[:-1]) and all(ln.endswith(" s") for ln in lines)
    assert [ln.split("about ")[1].split("%")[0] for ln in lines[:-1]] == [str(10 * k) for k in range(1, 10)]
    assert lines[-1].startswith("(T) triples: rank 0 done (ran 20 of 40 tasks on 2 ranks)")


def test_forkable_task_sets_run_in_worker_processes(caplog, monkeypatch):
    """threads runs a forkable task set in forked workers: results in task order, the
    workers' flops handed to add_flops, progress counted by the parent; one worker (or
    a task set not marked forkable) runs here."""
    import logging

    import tessera.backends.tasklog as tasklog
    from tessera.backends.context import Context
    from tessera.backends.tasks import TaskSet
    monkeypatch.setattr(tasklog, "MIN_INTERVAL", 0.0)
    data, here = np.arange(12.0), os.getpid()        # the workers read data from the fork
    count = {"flops": 0}

    def work(i, blocks):
        count["flops"] += 3 * i
        return data[i] ** 2 + (1000.0 if os.getpid() != here else 0.0)

    def merged(n):
        count["flops"] += n
    for workers, forkable, away in ((2, True, 1000.0), (1, True, 0.0), (2, False, 0.0)):
        count["flops"] = 0
        tasks = TaskSet("squares", list(data), work, flops=lambda: count["flops"], progress=True,
                        forkable=forkable, add_flops=merged)
        with caplog.at_level(logging.INFO, logger="tessera.progress"):
            caplog.clear()
            with Context("threads", workers=workers) as ctx:
                results = ctx.run_tasks(tasks)
        assert results.tolist() == (data ** 2 + away).tolist()
        assert count["flops"] == 3 * 66 and ctx.flops == 3 * 66
        lines = [r.getMessage() for r in caplog.records]
        assert lines[-1].startswith("squares: done 12 of 12 tasks (100%)"), lines


def test_forked_triples_under_the_command_line(tmp_path):
    """The CLI's signal watcher (a wakeup descriptor the workers inherit) is not woken when
    the (T) workers end: the run completes, with PySCF's energy."""
    out = tmp_path / "w.json"
    proc = subprocess.run([sys.executable, "-m", "tessera.cli.main", "run", str(REPO / WATER), "--basis",
                           "sto-3g", "--backend", "threads", "--threads", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["completed"] and data["flops"]["triples"] > 0
    assert abs(data["energies"]["total"] - pyscf_ccsd_t((REPO / WATER).read_text())) < 1e-7


def test_closed_stdout_is_not_an_internal_error(tmp_path):
    """`tessera run ... | head -1`: the pipe closes; a one-line note, exit 141, no traceback file."""
    proc = subprocess.Popen([sys.executable, "-m", "tessera.cli.main", "run", str(REPO / WATER),
                             "--basis", "sto-3g"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert proc.stdout.readline().startswith("Tessera ")
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141
    assert err.startswith("error: standard output closed during ") and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())
