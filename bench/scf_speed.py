"""Benchmark: time to solution of our RHF and of the transform, against PySCF and Psi4.

    .venv/bin/python bench/scf_speed.py                  # benzene + naphthalene / cc-pVDZ
    .venv/bin/python bench/scf_speed.py --molecules benzene --basis sto-3g   # smoke run
    .venv/bin/python bench/scf_speed.py --mode direct --transform '' --whole '' --skip psi4  # direct SCF

Measured in one run, on the same machine (never a timed assertion):
1. RHF wall time in one process: ours (``tessera.chem.scf.rhf``, default mode, threads
   context) and PySCF's default ``scf.RHF`` (incore ERIs when they fit), same basis and
   conv_tol, alternating A B A B; the best of the two of each, and the iterations.
2. Ours under ``mpiexec`` at 1 and 2 ranks (``bench/hf.py``'s worker, schedule steal).
3. The AO->MO transform against CCSD (the phases of ``tessera.chem``) for each of
   ``--transform`` (default benzene; e.g. benzene,glycine), with the transform's flops
   and GFLOP/s against a DGEMM peak on all cores measured in the same run.
4. CCSD(T) as a whole process: benzene, ``tessera run`` against ``psi4 -n <cores>`` (when
   ``psi4`` is on PATH; same basis, all electrons, SCF_TYPE PK, convergence 1e-8), and
   each of ``--whole`` (default benzene, glycine) against one PySCF script (RHF, CCSD,
   (T); same basis, all electrons, SCF 1e-10, CCSD 1e-8), alternating, best of two.

    .venv/bin/python bench/scf_speed.py --skip ranks --molecules benzene   # transform/CCSD + whole processes

Whole processes also report user and system CPU seconds and minor page faults (a machine
whose first touch of memory is slow shows it in the last two, not in user seconds).
Every process runs with the BLAS kernels its CPU supports (``common.blas_coretype``).
Writes bench/results/scf_speed-<time>.json and prints a table with the load average.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from common import blas_kernels  # noqa: E402  (first: it sets the BLAS kernels of every process)
import hf  # noqa: E402  (the molecules, the MPI worker and its launcher)

from tessera.backends.local import available_cores  # noqa: E402

CONV_TOL = 1e-10
BENZENE = ROOT / "examples" / "benzene.xyz"


def ours(mol, mode: str = "auto") -> dict:
    from tessera.backends.context import Context
    from tessera.chem.scf import rhf
    with Context("threads") as ctx:
        t0, c0 = time.perf_counter(), time.process_time()
        ref = rhf(mol, conv_tol=CONV_TOL, mode=mode, context=ctx)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ctx.close()
    info = ref.info
    return {"wall_s": wall, "cpu_s": cpu, "e_hf": ref.e_hf, "iterations": ref.iterations, "mode": info["mode"],
            "threads": info["threads"], "integrals_s": info["setup_s"],
            "fock_s": sum(info["fock_wall_s"]), "solve_s": sum(info["solve_wall_s"])}


def pyscf_default(mol) -> dict:
    from pyscf import scf
    mf = scf.RHF(mol)
    mf.conv_tol = CONV_TOL
    t0, c0 = time.perf_counter(), time.process_time()
    e = mf.kernel()
    # PySCF builds the guess's Fock matrix before its first cycle: cycles + 1 builds
    return {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "e_hf": float(e),
            "iterations": mf.cycles + 1}


def alternate(pairs: int, a, b) -> tuple:
    runs_a, runs_b = [], []
    for _ in range(pairs):
        runs_a.append(a())
        runs_b.append(b())
    best = lambda runs: min(runs, key=lambda r: r["wall_s"])   # noqa: E731
    return best(runs_a), best(runs_b), runs_a, runs_b


def transform_vs_ccsd(name: str, basis: str) -> dict:
    from pyscf import gto

    from tessera.backends.context import Context
    from tessera.chem.ccsd import CCSD
    from tessera.chem.integrals import transform
    from tessera.chem.scf import rhf
    if name in hf.MOLECULES:
        mol = hf.build(name, basis)
    else:
        xyz = (ROOT / "examples" / f"{name}.xyz").read_text().splitlines(True)[2:]
        mol = gto.M(atom="".join(xyz), basis=basis, symmetry=True, verbose=0)
    with Context("threads") as ctx:
        ref = rhf(mol, conv_tol=CONV_TOL, context=ctx)
        t0, c0 = time.perf_counter(), time.process_time()
        ints = transform(ref, 0, 32)
        t_tr, c_tr = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        cc = CCSD(conv=1e-8).kernel(ints, ctx)
        t_cc, c_cc = time.perf_counter() - t0, time.process_time() - c0
    ctx.close()
    # CPU seconds (all threads) besides wall: their ratio is less sensitive to a loaded machine
    return {"nao": mol.nao, "group": mol.groupname, "transform_s": t_tr, "ccsd_s": t_cc,
            "ccsd_iterations": len(cc.iterations), "transform_gflops_per_s": ints.transform_stats["flops"] / t_tr / 1e9,
            "ratio": t_tr / t_cc, "transform_cpu_s": c_tr, "ccsd_cpu_s": c_cc,
            "cpu_ratio": c_tr / c_cc, **ints.transform_stats}


PSI4_INPUT = """memory 4 gb
molecule {{
0 1
{atoms}
symmetry d2h
}}
set basis {basis}
set scf_type pk
set freeze_core false
set e_convergence 1e-8
set d_convergence 1e-8
set r_convergence 1e-8
energy('ccsd(t)')
"""


def _timed(cmd: list, cwd: Path) -> dict:
    """Wall seconds of one subprocess run of ``cmd`` (this checkout's sources first on the path),
    with the user and system CPU seconds and minor page faults of it and its children: a
    machine whose first touch of memory is slow shows it in system seconds and faults."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, "user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
            "minor_faults": r1.ru_minflt - r0.ru_minflt}


def _cpu_line(a: dict, b: dict, peer: str) -> str:
    """User/system CPU seconds and minor faults of the best runs of two whole processes."""
    return (f"    CPU user/sys Tessera {a['user_s']:.2f}/{a['sys_s']:.2f} s, {peer} {b['user_s']:.2f}/"
            f"{b['sys_s']:.2f} s (user ratio {a['user_s'] / b['user_s']:.2f}); minor faults "
            f"{a['minor_faults']:.3g} vs {b['minor_faults']:.3g}")


def _tessera_run(xyz: Path, basis: str) -> dict:
    return _timed([str(Path(sys.executable).parent / "tessera"), "run", str(xyz), "--basis", basis,
                   "--conv", "1e-8"], ROOT)


def whole_process(basis: str, cores: int) -> dict:
    """benzene CCSD(T): ``tessera run`` vs ``psi4 -n cores``, alternating, best of two."""
    psi4 = shutil.which("psi4")
    atoms = "".join(BENZENE.read_text().splitlines(True)[2:]).strip()
    tmp = Path(tempfile.mkdtemp(prefix="tessera-psi4-"))
    (tmp / "benzene.in").write_text(PSI4_INPUT.format(atoms=atoms, basis=basis))
    ours_run = lambda: _tessera_run(BENZENE, basis)                              # noqa: E731
    if psi4 is None:
        best, _, runs, _ = alternate(2, ours_run, lambda: {"wall_s": float("nan")})
        return {"tessera_s": best["wall_s"], "psi4_s": None, "psi4": "not on PATH", "tessera_runs": runs,
                "tessera_best": best}
    psi = lambda: _timed([psi4, "-n", str(cores), "benzene.in", "benzene.out"], tmp)  # noqa: E731
    a, b, ra, rb = alternate(2, ours_run, psi)
    return {"tessera_s": a["wall_s"], "psi4_s": b["wall_s"], "ratio": a["wall_s"] / b["wall_s"],
            "psi4": psi4, "tessera_runs": ra, "psi4_runs": rb, "tessera_best": a, "psi4_best": b}


PYSCF_SCRIPT = """
import sys
from pyscf import gto, scf, cc
atoms = "".join(open(sys.argv[1]).read().splitlines(True)[2:])
mol = gto.M(atom=atoms, basis=sys.argv[2], symmetry=True, verbose=0)
mf = scf.RHF(mol)
mf.conv_tol = 1e-10
mf.kernel()
mycc = cc.CCSD(mf)
mycc.conv_tol = 1e-8
mycc.kernel()
print(mf.e_tot + mycc.e_corr + mycc.ccsd_t())
"""


def whole_vs_pyscf(xyz: Path, basis: str) -> dict:
    """CCSD(T) of ``xyz`` as a whole process: ``tessera run`` vs one PySCF script,
    alternating, best of two."""
    pyscf = [sys.executable, "-c", PYSCF_SCRIPT, str(xyz), basis]
    a, b, ra, rb = alternate(2, lambda: _tessera_run(xyz, basis), lambda: _timed(pyscf, ROOT))
    return {"tessera_s": a["wall_s"], "pyscf_s": b["wall_s"], "ratio": a["wall_s"] / b["wall_s"],
            "tessera_runs": ra, "pyscf_runs": rb, "tessera_best": a, "pyscf_best": b}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--molecules", default="benzene,naphthalene")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--mode", default="auto", choices=("auto", "direct", "incore"),
                    help="our SCF's Fock build, in one process and over ranks (PySCF: its default)")
    ap.add_argument("--skip", default="", help="comma list of: ranks, transform, psi4, pyscf")
    ap.add_argument("--transform", default="benzene",
                    help="molecules (bench/hf.py's or examples/<name>.xyz) of the transform/CCSD section")
    ap.add_argument("--whole", default="benzene,glycine",
                    help="examples/<name>.xyz whose CCSD(T) whole process is compared with PySCF's")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    cores = available_cores()
    res = {"basis": args.basis, "conv_tol": CONV_TOL, "cpus": os.cpu_count(),
           "loadavg_start": os.getloadavg(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "rhf": {}}
    lines = []
    for name in filter(None, args.molecules.split(",")):
        mol = hf.build(name, args.basis)
        a, b, ra, rb = alternate(2, lambda: ours(mol, args.mode), lambda: pyscf_default(mol))
        row = {"nao": mol.nao, "group": mol.groupname, "tessera": a, "pyscf": b,
               "ratio": a["wall_s"] / b["wall_s"], "tessera_runs": [r["wall_s"] for r in ra],
               "pyscf_runs": [r["wall_s"] for r in rb], "load": os.getloadavg()}
        lines.append(f"RHF {name}/{args.basis} ({mol.nao} AOs, {mol.groupname}): Tessera "
                     f"{a['wall_s']:.2f} s, CPU {a['cpu_s']:.2f} s ({a['iterations']} builds, {a['mode']}, "
                     f"{a['threads']} threads; integrals {a['integrals_s']:.2f} s, Fock "
                     f"{a['fock_s']:.2f} s, solve {a['solve_s']:.2f} s)  PySCF "
                     f"{b['wall_s']:.2f} s, CPU {b['cpu_s']:.2f} s ({b['iterations']} builds)  ratio {row['ratio']:.2f}"
                     f"  dE {a['e_hf'] - b['e_hf']:.1e}  load {row['load'][0]:.1f}")
        if "ranks" not in skip:
            ns = SimpleNamespace(molecule=name, basis=args.basis, mode=args.mode)
            one = hf.launch(1, ns, "steal")["runs"]["steal"]
            two = hf.launch(2, ns, "steal")["runs"]["steal"]
            row["mpi"] = {"1": one, "2": two, "ratio_2_over_1": two["wall_s"] / one["wall_s"]}
            lines.append(f"  mpi-onesided: 1 rank {one['wall_s']:.2f} s, CPU {one['cpu_s']:.2f} s ({one['mode']}), "
                         f"2 ranks {two['wall_s']:.2f} s, CPU {two['cpu_s']:.2f} s ({two['mode']}), 2/1 = "
                         f"{two['wall_s'] / one['wall_s']:.2f}  load {os.getloadavg()[0]:.1f}")
        res["rhf"][name] = row
    if "transform" not in skip:
        from common import dgemm_peak
        res["dgemm_peak_gflops"] = peak = dgemm_peak(threads=cores)[0]
        res["transform_vs_ccsd"] = {}
        for name in filter(None, args.transform.split(",")):
            t = res["transform_vs_ccsd"][name] = transform_vs_ccsd(name, args.basis)
            lines.append(f"{name}/{args.basis} ({t['nao']} AOs, {t['group']}): transform {t['transform_s']:.2f} s "
                         f"({t['flops'] / 1e9:.1f} GFLOP, {t['transform_gflops_per_s']:.1f} GFLOP/s = "
                         f"{t['transform_gflops_per_s'] / peak:.2f} of DGEMM's {peak:.1f} on {cores} cores), CCSD "
                         f"{t['ccsd_s']:.2f} s ({t['ccsd_iterations']} iterations), transform/CCSD "
                         f"{t['ratio']:.2f} (CPU seconds {t['transform_cpu_s']:.2f} / {t['ccsd_cpu_s']:.2f} = "
                         f"{t['cpu_ratio']:.2f}; AO integrals {t['ao_integrals']})  load {os.getloadavg()[0]:.1f}")
    if not {"psi4", "pyscf"} <= skip:
        # our modules byte-compiled once before the whole processes are timed, as pip
        # install compiles PySCF's: under PYTHONDONTWRITEBYTECODE an editable checkout
        # that never was would compile every module in every timed run (~0.1 s)
        compileall.compile_dir(ROOT / "src", quiet=1)
    if "psi4" not in skip:
        res["whole_process"] = w = whole_process(args.basis, cores)
        psi = f"Psi4 {w['psi4_s']:.2f} s, ratio {w['ratio']:.2f}" if w["psi4_s"] else w["psi4"]
        lines.append(f"benzene/{args.basis} CCSD(T) whole process: Tessera {w['tessera_s']:.2f} s, "
                     f"{psi}  load {os.getloadavg()[0]:.1f}")
        if w["psi4_s"]:
            lines.append(_cpu_line(w["tessera_best"], w["psi4_best"], "Psi4"))
    if "pyscf" not in skip:
        res["whole_vs_pyscf"] = {}
        for name in filter(None, args.whole.split(",")):
            w = res["whole_vs_pyscf"][name] = whole_vs_pyscf(ROOT / "examples" / f"{name}.xyz", args.basis)
            lines.append(f"{name}/{args.basis} CCSD(T) whole process: Tessera {w['tessera_s']:.2f} s, "
                         f"PySCF {w['pyscf_s']:.2f} s, ratio {w['ratio']:.2f}  load {os.getloadavg()[0]:.1f}")
            lines.append(_cpu_line(w["tessera_best"], w["pyscf_best"], "PySCF"))
    res["loadavg_end"] = os.getloadavg()
    res["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"scf_speed-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(res, indent=1, default=float))
    print("\n".join(lines))
    print(blas_kernels())
    print(f"load average start {res['loadavg_start'][0]:.1f}, end {res['loadavg_end'][0]:.1f} "
          f"on {res['cpus']} CPUs (wall times: best of two alternating runs)")
    print(f"written: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
