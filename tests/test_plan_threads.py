"""``tessera plan --threads-per-rank T`` and the network options: every part of the plan,
the CCSD estimate and the (T) planner, prices a rank at T threads' DGEMM rate and the
network given (structure only, water clusters of ``test_plan_ranks``)."""

import json

import numpy as np
import pytest

from tessera.backends.machine import CALIBRATION, Machine, planning
from tessera.cli.main import main
from test_plan_ranks import water_cluster


def _plan(tmp_path, n: int, *options: str) -> dict:
    xyz = tmp_path / f"w{n}.xyz"
    xyz.write_text(water_cluster(n))
    path = tmp_path / ("plan" + "_".join(o.strip("-") for o in options) + ".json")
    assert main(["plan", str(xyz), "--basis", "cc-pvdz", "--method", "ccsd(t)", "--memory-per-node", "512GB",
                 *options, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_threads_per_rank_multiply_the_rank_rate_and_cut_the_compute(tmp_path, capsys):
    """8 threads a rank, 8 ranks a node: the rank's rate is 8 x the calibrated single-thread
    rate x the measured 2-thread efficiency (machine.json, read here by hand); the CCSD
    estimate's compute (flops of the busiest rank over the rate) falls by that factor and
    its other terms (Python work, one-sided operations, bytes) stay: each executor's
    seconds fall by exactly what its compute does."""
    calibration = json.loads(CALIBRATION.read_text())
    single, efficiency = calibration["gemm_flops_per_second"], calibration["gemm_thread_efficiency"]
    assert 0 < efficiency <= 1.5
    one = _plan(tmp_path, 4, "--ranks", "128", "--ranks-per-node", "8")
    eight = _plan(tmp_path, 4, "--ranks", "128", "--ranks-per-node", "8", "--threads-per-rank", "8")
    assert f"(8 threads x {single / 1e9:.1f} x efficiency {efficiency:.2f})" in capsys.readouterr().out
    factor = 8 * efficiency
    assert one["machine"]["threads_per_rank"] == 1 and eight["machine"]["threads_per_rank"] == 8
    assert one["machine"]["rank_flops_per_second"] == single
    assert eight["machine"]["rank_flops_per_second"] == pytest.approx(8 * single * efficiency, rel=1e-12)
    assert one["machine"]["per_operation"] == eight["machine"]["per_operation"]     # threads move no bytes
    for a, b in zip(one["executors"], eight["executors"]):
        assert (a["backend"], a["variant"], a["tile"]) == (b["backend"], b["variant"], b["tile"])
        assert b["compute_seconds"] == pytest.approx(a["compute_seconds"] / factor, rel=1e-9)
        assert a["seconds_per_iteration"] - b["seconds_per_iteration"] == \
            pytest.approx(a["compute_seconds"] - b["compute_seconds"], rel=1e-9)


def test_threads_and_network_reach_the_triples_plan(tmp_path):
    """The (T) plan is made for the machine given: between nodes (256 ranks, 64 a node) a
    slower network (1 GB/s a node, 20 us) makes its modelled seconds more, and 4 threads a
    rank (the same ranks) fewer; on one node's ranks the network is not used. The planner's
    caches keep results per machine: the default machine's plan, asked again, is as before."""
    from tessera.chem.ccsd import CCSDStructure
    from tessera.chem.triples_plan import plan_counts
    base = ("--ranks", "256", "--ranks-per-node", "64")
    default = _plan(tmp_path, 4, *base)["triples"]
    slow = _plan(tmp_path, 4, *base, "--network-bandwidth", "1", "--network-latency", "20")["triples"]
    threads = _plan(tmp_path, 4, *base, "--threads-per-rank", "4")["triples"]
    assert slow["seconds"] > default["seconds"] > threads["seconds"]
    one_node = _plan(tmp_path, 4, "--ranks", "64")["triples"]
    assert one_node == _plan(tmp_path, 4, "--ranks", "64", "--network-bandwidth", "1", "--network-latency", "20")["triples"]
    tensors = CCSDStructure(np.zeros(96, dtype=int), 20, distributed=True).stored(12, 12)
    slower = Machine.calibrated(network_bandwidth=1e9, network_latency=20e-6)
    with planning(slower):
        assert Machine.calibrated() is slower
        planned = plan_counts(tensors, 252, memory_bytes=8 * 2**30, ranks_per_node=63)
    again = plan_counts(tensors, 252, memory_bytes=8 * 2**30, ranks_per_node=63)
    assert Machine.calibrated() == Machine.calibrated(CALIBRATION)
    assert planned["seconds"] > again["seconds"]


def test_triples_reads_overlap_only_where_the_executor_reads_ahead():
    """Between nodes a streamed (T) task's off-node reads overlap its compute only on an
    executor that posts them ahead (mpi-onesided, ``reads_ahead``); a run plans its (T) for
    its own executor and threads (``Context.machine``). (H2O)16 cc-pVDZ, tile 32, 1024
    ranks of 64-rank nodes, 8 GiB each: reading ahead, streamed tasks (within 1% of the
    fastest, holding least); fetching first (mpi-collective), the unstreamed plan, which
    holds more."""
    from tessera.backends.context import Context
    from tessera.chem.ccsd import CCSDStructure
    from tessera.chem.triples_budget import overlapped
    from tessera.chem.triples_plan import plan_counts
    tensors = CCSDStructure(np.zeros(24 * 16, dtype=int), 80, distributed=True).stored(32, 32)
    ahead = plan_counts(tensors, 1024, memory_bytes=8 * 2**30, ranks_per_node=64)
    with planning(Machine.calibrated(reads_overlap=False)):
        assert not overlapped(1024, 64)
        fetched = plan_counts(tensors, 1024, memory_bytes=8 * 2**30, ranks_per_node=64)
    assert overlapped(1024, 64) and not overlapped(64, 64)
    assert ahead["chunks"] > 1 and fetched["chunks"] == 1 and ahead["task_bytes"] < fetched["task_bytes"]
    with Context("serial") as ctx:
        assert ctx.machine() == Machine.calibrated(threads_per_rank=1, reads_overlap=False)


def test_a_runs_blas_threads_set_its_decision_rate(monkeypatch):
    """A run's BLAS threads per rank (``local.mpi_blas_threads``: TESSERA_BLAS_THREADS, else
    --threads / OMP_NUM_THREADS, else 1) price ``auto``'s CCSD estimate: the single-thread
    rate measured times the threads at the calibrated efficiency (machine.json, read here
    by hand); every candidate's compute falls by that factor."""
    from tessera.backends import auto
    from tessera.backends.local import mpi_blas_threads
    from tessera.chem.ccsd import CCSDStructure
    monkeypatch.setattr(auto, "gemm_rate", lambda: 1e10)
    efficiency = json.loads(CALIBRATION.read_text())["gemm_thread_efficiency"]
    structure = CCSDStructure(np.zeros(24, dtype=int), 5, distributed=True)
    one, four = (auto.decide(structure, 2, tile=24, threads_per_rank=t) for t in (1, 4))
    assert one["gemm_rate"] == 1e10 and four["gemm_rate"] == pytest.approx(4e10 * efficiency)
    def key(c):
        return c["backend"], c["variant"], c["tile"], c["occ_tile"]
    faster = {key(c): c["compute"] for c in four["candidates"]}      # rounded to 1e-6 s
    assert set(faster) == {key(c) for c in one["candidates"]}
    for c in one["candidates"]:
        assert faster[key(c)] == pytest.approx(c["compute"] / (4 * efficiency), abs=1e-6)
    monkeypatch.delenv("TESSERA_BLAS_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert mpi_blas_threads() == 2
    monkeypatch.setenv("TESSERA_BLAS_THREADS", "3")
    assert mpi_blas_threads() == 3
