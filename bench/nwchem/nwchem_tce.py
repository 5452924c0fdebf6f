"""Run NWChem's TCE CCSD(T) on an XYZ molecule and read its energies and times.

Used by bench/scaling.py as the peer for distributed CCSD(T). NWChem comes from the
Debian package ``nwchem`` (Open MPI flavour; ``apt-get install nwchem``) and runs as
``mpirun -np N nwchem input.nw``. Without it, ``missing()`` says what to install and
the benchmark measures Tessera and PySCF only.

The input mirrors Tessera's run: spherical cc-pVDZ (any basis name NWChem's library
knows), RHF converged to 1e-8, TCE CCSD(T) with residual threshold 1e-7, all electrons
correlated, and optionally the Abelian subgroup Tessera uses (``symmetry``, e.g. ``c2``;
default: none, as C1). Every other TCE setting is NWChem's default, which matters for a
fair comparison: ``tilesize`` not given (the TCE picks its tiles; the ``tile_dim`` it
printed is parsed and recorded), no ``2eorb`` (spin-orbital two-electron integrals, the
default ``2emet``), ``io ga`` (I/O in Global Arrays), 5th-order DIIS. ``2eorb`` with a
larger ``tilesize`` is usually faster for closed shells; it is left out so that the
peer is NWChem as a user gets it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def missing() -> str | None:
    """None when nwchem and mpirun are installed, else what to do."""
    if shutil.which("nwchem") is None:
        return "NWChem is not installed: apt-get install nwchem (Debian package, Open MPI flavour)"
    if shutil.which("mpirun") is None:
        return "mpirun is not installed: apt-get install openmpi-bin"
    return None


def write_input(xyz: str, basis: str, workdir: Path, symmetry: str | None = None,
                memory_mb: int = 2000) -> Path:
    """An NWChem input for TCE CCSD(T) of the molecule in ``xyz`` (Angstrom)."""
    lines = Path(xyz).read_text().splitlines()
    natoms = int(lines[0].split()[0])
    atoms = "\n".join(lines[2:2 + natoms])
    sym = f"\n symmetry {symmetry}" if symmetry else ""
    geom_opts = "units angstrom" + ("" if symmetry else " noautosym") + " nocenter noautoz"
    text = f"""start tessera_peer
scratch_dir {workdir}
permanent_dir {workdir}
memory total {memory_mb} mb
geometry {geom_opts}{sym}
{atoms}
end
basis spherical
 * library {basis}
end
scf
 thresh 1e-8
 singlet
 rhf
end
tce
 ccsd(t)
 thresh 1e-7
 maxiter 60
end
task tce energy
"""
    path = workdir / "input.nw"
    path.write_text(text)
    return path


def parse(output: str) -> dict:
    """Energies and times from an NWChem output."""
    def grab(pattern):
        m = re.findall(pattern, output)
        return float(m[-1].replace("D", "E")) if m else None
    out = {
        "e_hf": grab(r"Total SCF energy\s*=\s*(-?\d+\.\d+)"),
        "e_ccsd_total": grab(r"CCSD total energy / hartree\s*=\s*(-?\d+\.\d+)"),
        "e_t_correction": grab(r"CCSD\(T\)\s+correction energy / hartree\s*=\s*(-?\d+\.\d+)"),
        "e_ccsd_t_total": grab(r"CCSD\(T\) total energy / hartree\s*=\s*(-?\d+\.\d+)"),
    }
    m = re.findall(r"Total times\s+cpu:\s*([\d.]+)s\s+wall:\s*([\d.]+)s", output)
    if m:
        out["cpu_seconds"], out["wall_seconds_reported"] = float(m[-1][0]), float(m[-1][1])
    out.update(phases(output))
    return out


def phases(output: str) -> dict:
    """Wall seconds per phase as NWChem prints them (0.1 s resolution): ``scf`` (the SCF's
    "Time for solution"), ``transform`` (the TCE's "Cpu & wall time" lines before the CCSD
    iterations: 1-e and 2-e integral transformations), ``ccsd`` (the iterations' wall
    column, summed), ``triples`` (the "Cpu & wall time" after the (T) energy); also the
    CCSD ``iterations`` and the ``tile_dim`` the TCE chose."""
    out: dict = {}
    m = re.findall(r"Time for solution\s*=\s*([\d.]+)s", output)
    if m:
        out["scf"] = float(m[-1])
    head, sep, tail = output.partition("CCSD iterations")
    if not sep:
        return out
    tce = head.rsplit("Correlation Information", 1)[-1]        # the TCE's part of the output
    walls = re.findall(r"Cpu & wall time / sec\s+([\d.]+)\s+([\d.]+)", tce)
    out["transform"] = sum(float(w) for _, w in walls)
    body, _, after = tail.partition("Iterations converged")
    iters = re.findall(r"^\s*\d+\s+\d+\.\d+\s+-?\d+\.\d+\s+([\d.]+)\s+([\d.]+)\s*$", body, re.M)
    out["iterations"] = len(iters)
    out["ccsd"] = sum(float(w) for _, w in iters)
    m = re.search(r"CCSD\(T\) total energy / hartree.*?\n.*?Cpu & wall time / sec\s+([\d.]+)\s+([\d.]+)",
                  after, re.S)
    if m:
        out["triples"] = float(m.group(2))
    m = re.search(r"tile_dim\s*=\s*(\d+)", output)
    if m:
        out["tile_dim"] = int(m.group(1))
    return out


def run(xyz: str, basis: str = "cc-pvdz", nprocs: int = 2, symmetry: str | None = None,
        timeout: float = 4 * 3600, keep: str | None = None, memory_mb: int = 2000) -> dict:
    """Run NWChem TCE CCSD(T) with ``mpirun -np nprocs``; returns energies and wall time."""
    why = missing()
    if why:
        return {"missing": why}
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="nwchem_"))
    workdir.mkdir(parents=True, exist_ok=True)
    inp = write_input(xyz, basis, workdir, symmetry, memory_mb)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--oversubscribe", "-np", str(nprocs), "nwchem", str(inp)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=workdir, timeout=timeout)
    wall = time.perf_counter() - t0
    (workdir / "output.txt").write_text(proc.stdout + "\n" + proc.stderr)
    out = parse(proc.stdout)
    out.update({"wall_seconds": wall, "returncode": proc.returncode, "nprocs": nprocs,
                "command": " ".join(cmd), "workdir": str(workdir)})
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return out


if __name__ == "__main__":
    import argparse
    import json
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("xyz")
    p.add_argument("--basis", default="cc-pvdz")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--symmetry", default=None, help="e.g. c2 (default: none, C1)")
    p.add_argument("--keep", default=None, help="work directory to keep")
    p.add_argument("--memory", type=int, default=2000, help="NWChem's memory total per process, MB")
    a = p.parse_args()
    print(json.dumps(run(a.xyz, a.basis, a.np, a.symmetry, keep=a.keep, memory_mb=a.memory), indent=1))
