"""Checkpoint and restart (``--checkpoint``, ``--restart``).

A ``tessera run`` writing every CCSD iteration, killed by SIGKILL while it iterates CCSD
(once its checkpoint holds iteration 2 or later), resumes with ``--restart`` to the energy of an uninterrupted run
within 1e-9 Eh: on one rank, on two ranks, and from a two-rank checkpoint onto one
rank; a checkpoint of T2 in pieces resumes with other pieces and on one rank. A checkpoint of another run is refused, and bad option values are one-line
errors. Water/6-31G with tile 2 (many blocks per tensor), converged to 1e-10.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from mpirun import build_env, mpiexec_path

from tessera.cli.main import main

REPO = Path(__file__).resolve().parents[1]
WATER = str(REPO / "examples" / "water.xyz")
ARGS = ["run", WATER, "--basis", "6-31g", "--method", "ccsd", "--tile", "2", "--conv", "1e-10"]
TOL = 1e-9
TIMEOUT = 240


def _cmd(nranks: int, *args) -> list:
    """The run, writing every CCSD iteration (``--checkpoint-interval 0``) so that a kill
    lands between two written iterations."""
    tessera = [sys.executable, "-m", "tessera.cli.main", *ARGS, "--checkpoint-interval", "0", *args]
    if nranks == 1:
        return tessera + ["--backend", "serial"]
    return [str(mpiexec_path()), "-n", str(nranks), *tessera, "--backend", "mpi-onesided"]


def _run(cmd, env=None, status: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=build_env(env), cwd=REPO, timeout=TIMEOUT)
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def _iteration(chk: Path) -> int:
    """The CCSD iteration the checkpoint's manifest holds (-1 while there is none)."""
    try:
        with h5py.File(chk, "r") as f:
            return int(f.attrs["iteration"])
    except (OSError, KeyError):
        return -1


def _kill_at(cmd, chk: Path, at: int = 2) -> int:
    """Start ``cmd``; SIGKILL its whole process group once the checkpoint holds
    iteration ``at`` or later; returns the iteration the checkpoint then holds."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=build_env(), cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + TIMEOUT
    try:
        while _iteration(chk) < at:
            assert proc.poll() is None, f"the run ended before it was killed: {proc.stderr.read()[-2000:]}"
            assert time.monotonic() < deadline, "no checkpoint iteration in time"
            time.sleep(0.002)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return _iteration(chk)


def _energy(path: Path) -> tuple:
    data = json.loads(path.read_text())
    return data["energies"]["ccsd_correlation"], len(data["iterations"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(energy, iterations) of uninterrupted runs on 1 and 2 ranks."""
    d = tmp_path_factory.mktemp("whole")
    out = {}
    for n in (1, 2):
        _run(_cmd(n, "--json", str(d / f"r{n}.json")))
        out[n] = _energy(d / f"r{n}.json")
    assert abs(out[1][0] - out[2][0]) < TOL
    return out


def test_restart_after_kill_one_rank(tmp_path, uninterrupted):
    js, chk = tmp_path / "r.json", tmp_path / "r.chk.h5"          # the default checkpoint name
    killed_at = _kill_at(_cmd(1, "--json", str(js)), chk)
    e_full, iters = uninterrupted[1]
    assert 2 <= killed_at < iters
    assert "ccsd" not in json.loads(js.read_text())["completed"]     # the JSON after each phase: scf, transform
    proc = _run(_cmd(1, "--json", str(js), "--restart"))
    assert "from checkpoint" in proc.stdout                        # no SCF: the stored orbitals
    e, n = _energy(js)
    assert abs(e - e_full) < TOL and n == iters


def test_restart_after_kill_two_ranks_and_onto_one(tmp_path, uninterrupted):
    js, chk = tmp_path / "r.json", tmp_path / "run.chk.h5"
    killed_at = _kill_at(_cmd(2, "--json", str(js), "--checkpoint", str(chk)), chk)
    e_full, iters = uninterrupted[2]
    assert 2 <= killed_at < iters
    parts = json.loads(h5py.File(chk, "r").attrs["parts"])
    assert sorted(parts) == [f"run.chk.h5.it{killed_at}.rank0", f"run.chk.h5.it{killed_at}.rank1"]
    other = tmp_path / "copy"
    other.mkdir()
    for p in [chk.name, *parts]:
        shutil.copy(tmp_path / p, other / p)
    _run(_cmd(2, "--json", str(js), "--checkpoint", str(chk), "--restart"))
    e, n = _energy(js)
    assert abs(e - e_full) < TOL and n == iters
    _run(_cmd(1, "--json", str(other / "r.json"), "--checkpoint", str(other / chk.name), "--restart"))
    e, n = _energy(other / "r.json")
    assert abs(e - e_full) < TOL and n == iters
    assert json.loads(h5py.File(other / chk.name, "r").attrs["parts"]) == [f"run.chk.h5.it{iters}.rank0"]
    assert sorted(p.name for p in other.glob("run.chk.h5.it*")) == [f"run.chk.h5.it{iters}.rank0"]


def test_restart_from_pieces_onto_other_pieces_and_one_rank(tmp_path, uninterrupted):
    """T2 stored in pieces (mpi-onesided, TESSERA_PIECES=3 on two ranks: every block of T2
    cut in 3): a run stopped after 3 CCSD iterations (``--max-iter 3``: not converged,
    saved) resumes with other pieces (TESSERA_PIECES=2) and, from a copy, on one rank in
    whole blocks, each to the energy of an uninterrupted run."""
    js, chk = tmp_path / "r.json", tmp_path / "p.chk.h5"
    _run(_cmd(2, "--json", str(js), "--checkpoint", str(chk), "--max-iter", "3"), {"TESSERA_PIECES": 3}, status=1)
    assert _iteration(chk) == 3
    other = tmp_path / "copy"
    other.mkdir()
    for p in [chk.name, *json.loads(h5py.File(chk, "r").attrs["parts"])]:
        shutil.copy(tmp_path / p, other / p)
    e_full, iters = uninterrupted[2]
    _run(_cmd(2, "--json", str(js), "--checkpoint", str(chk), "--restart"), {"TESSERA_PIECES": 2})
    e, n = _energy(js)
    assert abs(e - e_full) < TOL and n == iters
    _run(_cmd(1, "--json", str(other / "r.json"), "--checkpoint", str(other / chk.name), "--restart"))
    e, n = _energy(other / "r.json")
    assert abs(e - e_full) < TOL and n == iters


def test_restart_sizes_the_estimate_from_the_checkpoint(tmp_path, monkeypatch, capsys):
    """On restart neither the SCF nor an initial guess runs: the memory estimate takes
    the checkpoint's orbitals and tiles (here not the default tile), and counts no AO
    integrals for an SCF that does not run."""
    import tessera.chem.scf.driver as driver
    chk = tmp_path / "c.chk.h5"
    args = [*ARGS[:3], "6-31g", "--method", "ccsd", "--checkpoint", str(chk)]
    assert main([*args, "--tile", "2", "--max-iter", "3", "--json", str(tmp_path / "a.json")]) == 1
    capsys.readouterr()

    def no_guess(*_):
        raise AssertionError("guess orbitals computed on restart")
    monkeypatch.setattr(driver, "guess_orbitals", no_guess)
    assert main([*args, "--restart", "--json", str(tmp_path / "b.json")]) == 0
    assert "from checkpoint" in capsys.readouterr().out

    def phases(name):          # bytes per phase (the baseline is measured)
        return json.loads((tmp_path / name).read_text())["memory"]["estimate"]["phases"]
    first, restart = phases("a.json"), phases("b.json")
    assert restart.pop("scf") < first.pop("scf")     # a restart runs no SCF: keeps no AO integrals
    assert restart == first


def _one_line_error(capsys, *argv) -> str:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_mismatched_checkpoint_is_refused(tmp_path, capsys):
    chk = tmp_path / "c.chk.h5"
    assert main([*ARGS, "--max-iter", "2", "--checkpoint", str(chk)]) == 1     # not converged, saved
    capsys.readouterr()
    assert _iteration(chk) == 2
    for extra, what in ((["--basis", "sto-3g"], "basis"), (["--frozen-core"], "frozen core"),
                        (["--tile", "3"], "tiles"), (["--charge", "2"], "charge"),
                        (["--no-symmetry"], "symmetry")):
        err = _one_line_error(capsys, *ARGS, *extra, "--checkpoint", str(chk), "--restart")
        assert "another run" in err and what in err
    moved = tmp_path / "moved.xyz"
    moved.write_text(Path(WATER).read_text().replace("0.117790", "0.127790"))
    err = _one_line_error(capsys, "run", str(moved), *ARGS[2:], "--checkpoint", str(chk), "--restart")
    assert "molecule" in err


def test_bad_checkpoint_options(tmp_path, capsys):
    js = tmp_path / "r.json"
    js.write_text("{}")
    cases = [
        (["--checkpoint", ""], "empty"),
        (["--checkpoint", str(tmp_path)], "is a directory"),
        (["--checkpoint", str(tmp_path / "missing" / "c.h5")], "does not exist"),
        (["--checkpoint", WATER], "is the input file"),
        (["--checkpoint", str(tmp_path / "none.h5"), "--restart"], "no checkpoint"),
        (["--checkpoint", str(js), "--restart"], "cannot read checkpoint"),
        (["--json", str(js), "--checkpoint", str(js)], "--json"),
        (["--checkpoint-interval", "-1"], "--checkpoint-interval"),
        (["--checkpoint-interval", "nan"], "--checkpoint-interval"),
    ]
    for extra, needle in cases:
        assert needle in _one_line_error(capsys, *ARGS, *extra)


def test_a_checkpoint_of_one_dataset_per_block_resumes(tmp_path, capsys, uninterrupted):
    """Block files as written before one dataset per tensor (``group/name/<key>`` per
    block, no index) still resume to the uninterrupted energy."""
    chk, js = tmp_path / "c.chk.h5", tmp_path / "r.json"
    assert main([*ARGS, "--max-iter", "3", "--checkpoint", str(chk), "--backend", "serial"]) == 1
    parts = json.loads(h5py.File(chk, "r").attrs["parts"])
    for part in parts:                       # rewrite each block file in the old layout
        with h5py.File(tmp_path / part, "r+") as f:
            for name in list(f["index"]):
                index = f["index"][name][()]
                for group in ("amplitudes", "diis_vectors", "diis_errors"):
                    data = f[group][name][()]
                    del f[group][name]
                    for *key, start, size in index.tolist():
                        f.create_dataset(f"{group}/{name}/{'_'.join(map(str, key))}",
                                         data=data[:, start:start + size])
            del f["index"]
    capsys.readouterr()
    assert main([*ARGS, "--checkpoint", str(chk), "--restart", "--backend", "serial", "--json", str(js)]) == 0
    e, n = _energy(js)
    assert abs(e - uninterrupted[1][0]) < TOL and n == uninterrupted[1][1]


def test_only_phase_ends_are_flushed_to_disk(tmp_path, monkeypatch, capsys):
    """fsync at the ends of phases only: the manifest with the SCF's orbitals and the last
    CCSD iteration (block file and manifest), and the JSON after each phase; the
    iterations in between are renamed into place unflushed, yet complete (the kill tests
    above resume from them)."""
    chk, js = tmp_path / "c.chk.h5", tmp_path / "r.json"
    flushed = []
    real_fsync = os.fsync

    def fsync(fd):
        flushed.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    assert main([*ARGS, "--max-iter", "3", "--checkpoint-interval", "0", "--checkpoint", str(chk),
                 "--backend", "serial", "--json", str(js)]) == 1            # 3 iterations, each written
    capsys.readouterr()
    files = [f for f in flushed if f != tmp_path.name]                    # (the folder, after a rename)
    # the orbitals; the JSON after the SCF and the transform; CCSD's last iteration; the JSON at the end
    assert [f.split(".tmp")[0].rsplit(".", 1)[0] for f in files] == [
        ".c.chk.h5", ".r.json", ".r.json", ".c.chk.h5.it3.rank0", ".c.chk.h5", ".r.json"]
    assert flushed.count(tmp_path.name) == len(files)
    assert json.loads(h5py.File(chk, "r").attrs["parts"]) == ["c.chk.h5.it3.rank0"]
    assert sorted(p.name for p in tmp_path.glob("c.chk.h5.it*")) == ["c.chk.h5.it3.rank0"]
