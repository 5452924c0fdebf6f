"""Benchmark: Tessera's (T) correction against PySCF's C (T) on the same amplitudes.

    .venv/bin/python bench/triples.py                       # water, benzene (fc), glycine (C1)
    .venv/bin/python bench/triples.py examples/water.xyz --repeat 3 --cache /tmp/tcache
    .venv/bin/python bench/triples.py examples/glycine.xyz --no-symmetry --vblock 38   # blocked kernel

Per molecule: PySCF RHF (conv_tol 1e-11) and CCSD (conv_tol 1e-9) give the amplitudes
(cached with the orbitals under --cache, so reruns skip the CCSD). Then, on the same
orbitals and amplitudes, PySCF's ``mycc.ccsd_t(eris=...)`` (its AO->MO integrals built
before the clock starts) with 1 and with all OpenMP threads, and Tessera's
``triples_correction`` (``transform`` done before the clock starts) with the serial and
the threads executor, alternating: each repetition runs PySCF 1 thread, Tessera serial,
PySCF all threads, Tessera threads. Best of --repeat wall times; ratios Tessera/PySCF at
equal cores. Tessera's GFLOP/s (GEMM flops / wall time) is set against a DGEMM peak taken
right before and after each of its runs in the same process: a square dgemm (n = --peak-n)
with as many BLAS threads as the executor has cores (the better of the two), per wall
second and per CPU second (the latter ratio is the one that holds on a shared machine,
where a long run and a short peak see different loads). Its flops
against the minimal count of (T) on the molecule's block structure too. Writes
bench/results/triples.json (load average included: the machine may be shared). No
assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from pyscf import cc, gto, lib, scf
from pyscf.data import elements
from pyscf.scf import hf_symm

from tessera.backends.context import Context
from tessera.backends.local import available_cores
from tessera.chem.integrals import transform
from tessera.chem.reference import Reference
from tessera.chem.triples import triples_correction
from tessera.tensor.block_tensor import BlockTensor

from common import dgemm_peak, timed

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = [("examples/water.xyz", True, False), ("examples/benzene.xyz", True, True),
           ("examples/glycine.xyz", False, False)]      # (file, symmetry, frozen core)


def amplitudes(path: Path, basis: str, symmetry: bool, frozen: bool, cache: Path | None):
    """(mol, mf, nfrozen, orbsym, t1, t2) from PySCF RHF + CCSD, or from the cache."""
    atoms = "\n".join(path.read_text().splitlines()[2:])
    mol = gto.M(atom=atoms, basis=basis, symmetry=symmetry, verbose=0)
    nfz = int(elements.chemcore(mol)) if frozen else 0
    key = cache / f"{path.stem}-{basis}-sym{int(symmetry)}-fc{nfz}.npz" if cache else None
    mf = scf.RHF(mol)
    if key is not None and key.exists():
        d = np.load(key)
        mf.mo_coeff, mf.mo_energy, mf.e_tot = d["mo_coeff"], d["mo_energy"], float(d["e_hf"])
        mf.mo_occ = np.zeros(mol.nao)
        mf.mo_occ[:mol.nelectron // 2] = 2.0
        mf.converged = True
        return mol, mf, nfz, d["orbsym"], d["t1"], d["t2"]
    mf.conv_tol = 1e-11
    mf.kernel()
    mycc = cc.CCSD(mf, frozen=nfz or None)
    mycc.conv_tol = 1e-9
    mycc.kernel()
    orbsym = (np.asarray(hf_symm.get_orbsym(mol, mf.mo_coeff)) if mol.symmetry
              else np.zeros(mol.nao, dtype=int))
    if key is not None:
        key.parent.mkdir(parents=True, exist_ok=True)
        np.savez(key, mo_coeff=mf.mo_coeff, mo_energy=mf.mo_energy, e_hf=mf.e_tot,
                 orbsym=orbsym, t1=mycc.t1, t2=mycc.t2)
    return mol, mf, nfz, orbsym, mycc.t1, mycc.t2


def bench_one(path: Path, basis, symmetry, frozen, args) -> dict:
    mol, mf, nfz, orbsym, t1, t2 = amplitudes(path, basis, symmetry, frozen, args.cache)
    cores = available_cores()
    mycc = cc.CCSD(mf, frozen=nfz or None)
    mycc.verbose = 0
    eris = mycc.ao2mo()
    row = {"molecule": path.stem, "basis": basis, "group": mol.groupname, "nao": mol.nao,
           "nocc": t1.shape[0], "nvir": t1.shape[1], "frozen": nfz, "cores": cores}
    ref = Reference(mol, float(mf.e_tot), mol.energy_nuc(), np.asarray(mf.mo_coeff),
                    np.asarray(mf.mo_energy), np.asarray(orbsym), mol.nelectron // 2, mol.groupname)
    ints = transform(ref, nfz, args.tile)
    bt1 = BlockTensor.from_dense(t1, (ints.o, ints.v))
    bt2 = BlockTensor.from_dense(t2, (ints.o, ints.o, ints.v, ints.v))
    contexts = {"serial": Context("serial"), "threads": Context("threads")}
    runs = {}                                   # name -> [(wall, cpu, extra)]
    for _ in range(args.repeat):
        for backend, threads in (("serial", 1), ("threads", cores)):
            with lib.with_omp_threads(threads):
                e, t, cpu = timed(lambda: mycc.ccsd_t(t1, t2, eris))
            runs.setdefault(f"pyscf_{threads}", []).append((t, cpu, float(e)))
            before = dgemm_peak(args.peak_n, threads)
            res, t, cpu = timed(lambda: triples_correction(ints, bt1, bt2, context=contexts[backend],
                                                           occ_tile=args.occ_tile, vblock=args.vblock,
                                                           kernel_mb=args.kernel_mb))
            peak = tuple(map(max, before, dgemm_peak(args.peak_n, threads)))
            runs.setdefault(f"tessera_{backend}", []).append((t, cpu, (res, peak)))
    for ctx in contexts.values():
        ctx.close()
    for name, rs in runs.items():
        t, cpu, extra = min(rs, key=lambda r: r[0])
        row[name], row[f"{name}_cpu"] = t, cpu
        if name.startswith("pyscf"):
            row["e_pyscf"] = extra
            continue
        res, peak = extra
        backend = name.split("_")[1]
        gflops, gflops_cpu = res.flops / t / 1e9, res.flops / cpu / 1e9
        row.update({f"ratio_{backend}": t / row[f"pyscf_{1 if backend == 'serial' else cores}"],
                    f"gflops_{backend}": gflops, f"dgemm_peak_{backend}": peak[0],
                    f"peak_fraction_{backend}": gflops / peak[0],
                    f"gflops_cpu_{backend}": gflops_cpu, f"dgemm_peak_cpu_{backend}": peak[1],
                    f"peak_fraction_cpu_{backend}": gflops_cpu / peak[1]})
        row.update(e_tessera=res.energy, gflop=res.flops / 1e9, minimal_gflop=res.minimal_flops / 1e9,
                   flops_ratio=res.flops / res.minimal_flops, tasks=res.tasks, task_tile=res.task_tile,
                   virtual_block=res.virtual_block, kernel_buffer_bytes=res.kernel_buffer_bytes)
    row["e_diff"] = row["e_tessera"] - row["e_pyscf"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("xyz", nargs="*", help="molecules (default: water, benzene fc, glycine C1)")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--no-symmetry", action="store_true", help="run the given molecules in C1")
    ap.add_argument("--frozen-core", action="store_true", help="freeze cores of the given molecules")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--tile", type=int, default=32, help="MO tile size of the transformation")
    ap.add_argument("--occ-tile", type=int, default=None)
    ap.add_argument("--vblock", type=int, default=None,
                    help="block the kernel in the virtual index, this many orbitals per block")
    ap.add_argument("--kernel-mb", type=float, default=None, help="kernel buffers per thread (MiB)")
    ap.add_argument("--peak-n", type=int, default=2000, help="size of the square dgemm of the peak")
    ap.add_argument("--cache", type=Path, default=None, help="folder for cached amplitudes")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "triples.json")
    args = ap.parse_args(argv)
    jobs = ([(Path(p), not args.no_symmetry, args.frozen_core) for p in args.xyz] if args.xyz
            else [(ROOT / p, s, f) for p, s, f in DEFAULT])
    rows = []
    print("wall seconds, best of --repeat (1t: CPU seconds of the same run in brackets); GF/s: "
          "Tessera's GFLOP/s / the DGEMM peak of the same moment (per CPU second in brackets: "
          "the fraction that holds on a loaded machine)")
    print(f"{'molecule':10s} {'group':5s} {'o':>3s} {'v':>4s} {'GFLOP':>7s} {'xmin':>5s} {'PySCF 1t':>16s} "
          f"{'Tess serial':>16s} {'ratio':>6s} {'GF/s 1t':>19s} {'PySCF nt':>9s} {'Tess thr':>9s} "
          f"{'ratio':>6s} {'GF/s nt':>19s} {'dE':>9s} {'load':>5s} {'vblk':>4s} {'MiB/thr':>7s}")
    for path, symmetry, frozen in jobs:
        load = os.getloadavg()[0]
        r = bench_one(path, args.basis, symmetry, frozen, args)
        r["loadavg_before"], r["loadavg_after"] = load, os.getloadavg()[0]
        rows.append(r)
        nt = r["cores"]
        gf = (lambda b: f"{r[f'gflops_{b}']:4.1f}/{r[f'dgemm_peak_{b}']:4.1f}={r[f'peak_fraction_{b}']:3.0%}"
              f" ({r[f'peak_fraction_cpu_{b}']:3.0%})")
        print(f"{r['molecule']:10s} {r['group']:5s} {r['nocc']:3d} {r['nvir']:4d} {r['gflop']:7.1f} "
              f"{r['flops_ratio']:5.2f} {r['pyscf_1']:7.2f} ({r['pyscf_1_cpu']:6.2f}) {r['tessera_serial']:7.2f} "
              f"({r['tessera_serial_cpu']:6.2f}) {r['ratio_serial']:6.2f} {gf('serial'):>19s} "
              f"{r[f'pyscf_{nt}']:9.2f} {r['tessera_threads']:9.2f} {r['ratio_threads']:6.2f} "
              f"{gf('threads'):>19s} {r['e_diff']:9.1e} {r['loadavg_after']:5.1f} {r['virtual_block']:4d} "
              f"{r['kernel_buffer_bytes'] / 2**20:7.1f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(sys.argv), "repeat": args.repeat,
                                    "rows": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
