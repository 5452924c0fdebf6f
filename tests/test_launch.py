"""How a process was launched (runtime/launch.py): read from PMI, Open MPI, Slurm, PALS and
PMIx variables without starting MPI; `auto` refused where the rank count is unreadable;
an MPI whose rank count differs from the launcher's is an error, never N serial copies;
a site MPI on LD_LIBRARY_PATH is preferred to the mpich wheel under a launcher."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.errors import InputError, RuntimeLayerError
from tessera.runtime import launch
from tessera.runtime.launch import Launch, check_world_size, detect, launched_size, site_libmpi

REPO = Path(__file__).resolve().parents[1]
TESSERA = Path(sys.executable).parent / "tessera"


@pytest.mark.parametrize("env, expected", [
    ({}, Launch()),
    ({"PMI_SIZE": "4", "PMI_RANK": "2"}, Launch("pmi", 4, 2, "PMI_RANK, PMI_SIZE=4")),
    ({"OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_RANK": "0", "PMI_SIZE": "9", "PMI_RANK": "0"},
     Launch("openmpi", 3, 0, "OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE=3")),
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "5", "PMIX_RANK": "5"},         # srun --mpi=pmix
     Launch("slurm", 8, 5, "SLURM_PROCID, SLURM_STEP_NUM_TASKS=8")),
    ({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, Launch()),                      # a batch script
    ({"PALS_RANKID": "1", "PMI_SIZE": "2", "PMI_RANK": "1"}, Launch("pals", 2, 1, "PALS_RANKID, PMI_SIZE=2")),
    ({"PALS_RANKID": "1"}, Launch("pals", None, 1, "PALS_RANKID")),
    ({"PMIX_RANK": "3"}, Launch("pmix", None, 3, "PMIX_RANK")),
    ({"PMI_RANK": "1"}, Launch()),                                               # a stray rank
    ({"PMI_SIZE": "2"}, Launch("pmi", 2, 0, "PMI_RANK, PMI_SIZE=2")),
])
def test_detect(env, expected):
    assert detect(env) == expected


def test_unreadable_and_malformed_launches():
    with pytest.raises(InputError, match="launched by pmix .* --backend auto cannot tell"):
        launched_size({"PMIX_RANK": "0"})
    assert launched_size({"PMI_SIZE": "4", "PMI_RANK": "0"}) == 4
    with pytest.raises(InputError, match="PMI_SIZE='four'.*not a rank count"):
        detect({"PMI_SIZE": "four", "PMI_RANK": "0"})
    with pytest.raises(InputError, match="SLURM_PROCID=4 but SLURM_STEP_NUM_TASKS=4"):
        detect({"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "4"})


def test_world_size_must_be_the_launchers():
    check_world_size(4, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0"})
    check_world_size(1, {})
    check_world_size(1, {"PMIX_RANK": "0"})          # one PMIx rank: nothing says otherwise
    with pytest.raises(RuntimeLayerError, match="launched by slurm as 4 rank.*MPI started 1"):
        check_world_size(1, {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "2"})
    with pytest.raises(RuntimeLayerError, match="launched by pmix as several"):
        check_world_size(1, {"PMIX_RANK": "3"})


def test_site_mpi_on_the_library_path(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    assert site_libmpi({"LD_LIBRARY_PATH": f"{tmp_path}:{site}"}) is None
    (site / "libmpi.so.40").write_bytes(b"")
    assert site_libmpi({"LD_LIBRARY_PATH": f"{tmp_path}::{site}"}) == str(site / "libmpi.so.40")
    env_lib = Path(sys.prefix) / "lib"              # this environment's own (the mpich wheel's)
    assert site_libmpi({"LD_LIBRARY_PATH": str(env_lib)}) is None
    # under a launcher, with the multi-ABI mpi4py wheel: MPI4PY_LIBMPI points at the site MPI
    monkeypatch.setattr(launch, "_multi_abi_mpi4py", lambda: True)
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()      # restored after
                                        if k not in ("MPI4PY_LIBMPI", "MPI4PY_MPIABI", "PMI_RANK", "PMI_SIZE")})
    monkeypatch.setenv("LD_LIBRARY_PATH", str(site))
    assert launch.prefer_site_mpi() is None                   # no launcher: mpi4py's default
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setenv("PMI_RANK", "0")
    assert launch.prefer_site_mpi() == str(site / "libmpi.so.40")
    assert os.environ["MPI4PY_LIBMPI"] == str(site / "libmpi.so.40")
    monkeypatch.setenv("MPI4PY_LIBMPI", "/opt/mine/libmpi.so")  # the user's choice stands
    assert launch.prefer_site_mpi() is None and os.environ["MPI4PY_LIBMPI"] == "/opt/mine/libmpi.so"


def test_launcher_mpi_cannot_read_is_one_line_not_serial_copies(tmp_path):
    """srun started 2 tasks but this MPI starts as a singleton: refused before any work."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_", "PALS_"))}
    env.update(SLURM_STEP_NUM_TASKS="2", SLURM_PROCID="0", PYTHONPATH=str(REPO / "src"))
    run = subprocess.run([str(TESSERA), "run", "examples/water.xyz", "--basis", "sto-3g"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("error: ") and run.stderr.count("\n") == 1
    assert "launched by slurm as 2 rank(s)" in run.stderr and "MPI started 1" in run.stderr
    assert "E(HF)" not in run.stdout and "Traceback" not in run.stderr


def test_an_mpi_library_that_does_not_load_is_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI", "OMPI_", "SLURM_", "PALS_"))}
    env.update(MPI4PY_LIBMPI="/nonexistent/libmpi.so", PYTHONPATH=str(REPO / "src"))
    run = subprocess.run([str(TESSERA), "run", "examples/water.xyz", "--basis", "sto-3g", "--backend",
                          "mpi-onesided"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.startswith("error: mpi4py could not load an MPI library") and run.stderr.count("\n") == 1
