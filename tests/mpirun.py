"""Launch a Python script under `mpiexec -n K` from a test and read its JSON result.

Shared by every MPI test of the project:

    from mpirun import run_mpi
    result = run_mpi(Path(__file__).parent / "mpi" / "my_script.py", 4, args=("--n", "10"))

Contract for the script: it runs on every rank; rank 0 prints its result as ONE line
of JSON (a JSON object) on stdout, e.g. `print(json.dumps(result), flush=True)`. Other
output is allowed; the last stdout line that parses as a JSON object is the result.
Do checks in the test (assert on the returned values), not in the script, unless the
script reports them as data.

What the launcher does:
- runs `<venv>/bin/mpiexec -n K <python> script args...` (the mpiexec next to the
  running interpreter: the `mpich` wheel's hydra), or, with nprocs=None, plain
  `<python> script args...` (MPI starts as a singleton, one rank, no mpiexec);
- in its own process group, killed as a whole when `timeout` (seconds) passes;
- with an environment tuned for many ranks on few cores (FAST_ENV below), the
  repository's src/ on PYTHONPATH, and `env` (a dict) applied last; a value of None
  removes a variable;
- raises MPIRunError (an AssertionError, so pytest shows it as a failure) with the
  command, exit status and the tails of stdout/stderr on a timeout, a non-zero exit
  status, or when no JSON line is found.

Speed settings (FAST_ENV): MPICH busy-polls while it waits, so with more ranks than
cores (4 ranks on a 2-core machine) a waiting rank steals the core from the rank it
waits for. MPIR_CVAR_ENABLE_HEAVY_YIELD=1 makes MPICH's wait loops yield the core
(sched_yield) and MPIR_CVAR_POLLS_BEFORE_YIELD=100 makes them yield sooner; BLAS and
OpenMP run one thread per rank. Override any of them through `env`.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FAST_ENV = {
    "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
    "MPIR_CVAR_POLLS_BEFORE_YIELD": "100",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
}


class MPIRunError(AssertionError):
    """An MPI launch that timed out, failed, or printed no JSON result."""


@dataclass
class MPIRun:
    """Raw outcome of one launch."""

    cmd: list
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool

    def describe(self, tail: int = 4000) -> str:
        return (f"command: {' '.join(self.cmd)}\nexit status: {self.returncode}"
                f"{' (timed out)' if self.timed_out else ''} after {self.seconds:.1f} s\n"
                f"--- stdout (tail) ---\n{self.stdout[-tail:]}\n"
                f"--- stderr (tail) ---\n{self.stderr[-tail:]}")


def mpiexec_path() -> Path:
    """The mpiexec that belongs to the running interpreter's environment."""
    return Path(sys.executable).parent / "mpiexec"


def build_env(env: dict | None = None) -> dict:
    out = dict(os.environ)
    out.update(FAST_ENV)
    src = str(REPO / "src")
    out["PYTHONPATH"] = src + (os.pathsep + out["PYTHONPATH"] if out.get("PYTHONPATH") else "")
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = str(v)
    return out


def run_mpi_raw(script_path, nprocs: int | None, args=(), timeout: float = 120.0,
                env: dict | None = None) -> MPIRun:
    """Launch and return the raw outcome (never raises for a failing script)."""
    script = str(Path(script_path).resolve())
    if nprocs is None:
        cmd = [sys.executable, script, *map(str, args)]
    else:
        mpiexec = mpiexec_path()
        if not mpiexec.exists():
            raise MPIRunError(
                f"no mpiexec next to {sys.executable}; install the MPI wheel into this "
                "environment (`pip install mpich mpi4py`)."
            )
        cmd = [str(mpiexec), "-n", str(int(nprocs)), sys.executable, script, *map(str, args)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=build_env(env), cwd=str(REPO), start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
    return MPIRun(cmd, proc.returncode, out or "", err or "", time.monotonic() - t0, timed_out)


def parse_result(stdout: str) -> dict | None:
    """The last stdout line that is a JSON object, or None."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def run_mpi(script_path, nprocs: int | None, args=(), timeout: float = 120.0,
            env: dict | None = None) -> dict:
    """Launch `mpiexec -n nprocs python script args...` and return rank 0's JSON dict.

    nprocs=None runs the script without mpiexec (singleton MPI). The returned dict
    gets one extra key, "_stderr", holding the launch's stderr (to check for warnings).
    """
    run = run_mpi_raw(script_path, nprocs, args, timeout, env)
    if run.timed_out:
        raise MPIRunError(f"MPI run timed out after {timeout} s\n{run.describe()}")
    if run.returncode != 0:
        raise MPIRunError(f"MPI run failed\n{run.describe()}")
    result = parse_result(run.stdout)
    if result is None:
        raise MPIRunError(f"MPI run printed no JSON object on stdout\n{run.describe()}")
    result["_stderr"] = run.stderr
    return result


def cached_launcher(script_path, timeout: float = 120.0, args=()):
    """``launch(nprocs)``: one run of the script per rank count, shared by the tests of a
    module (the result is reused, the script runs once; a run that failed or timed out is
    not run again: every later test of that rank count fails with its error at once)."""
    @functools.cache
    def outcome(nprocs):
        try:
            return run_mpi(script_path, nprocs, args=args, timeout=timeout), None
        except Exception as err:      # noqa: BLE001  (kept, raised again by every caller)
            return None, err

    def launch(nprocs):
        result, err = outcome(nprocs)
        if err is not None:
            raise err.with_traceback(None)      # this call's frames, not every earlier raise's
        return result
    return launch
