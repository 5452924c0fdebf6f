"""``tessera plan --ranks P``: tensors spread over many simulated ranks (no SCF, no MPI).

Water clusters (H2O)n, cc-pVDZ, built here deterministically (a cubic lattice of
waters 3 A apart, each turned by its own angle: no symmetry, C1). Structure only:
the placement every rank of a run computes (``runtime.distribution``) is evaluated
for 64, 256 and 1024 ranks.
"""

import json
import math

import numpy as np
import pytest

from tessera.backends.budget import memory_budget
from tessera.backends.machine import Machine
from tessera.chem.inputs import load
from tessera.cli.main import main
from tessera.cli.plan_ranks import choose_tiles, class_balance, orbitals, stored_tensors

RANKS = (64, 256, 1024)


def water_cluster(n: int) -> str:
    side = math.ceil(n ** (1 / 3))
    lines = []
    for k in range(n):
        i, j, l = k // side**2, (k // side) % side, k % side
        x, y, z, a = 3.0 * i, 3.0 * j, 3.0 * l, 0.37 * k + 0.1
        lines += [f"O {x:.4f} {y:.4f} {z:.4f}",
                  f"H {x + 0.7572 * math.cos(a):.4f} {y + 0.7572 * math.sin(a):.4f} {z + 0.5865:.4f}",
                  f"H {x - 0.7572 * math.cos(a):.4f} {y - 0.7572 * math.sin(a):.4f} {z + 0.5865:.4f}"]
    return f"{3 * n}\n(H2O){n}\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("n", [4, 8, 12, 16])
def test_every_class_balanced_and_shrinking_with_ranks(n):
    source = load(water_cluster(n), basis="cc-pvdz", charge=0)
    orbsym, nocc = orbitals(source, True)
    assert (len(orbsym), nocc) == (24 * n, 5 * n) and not orbsym.any()      # C1, no SCF
    previous = None
    for P in RANKS:
        tile, occ_tile = choose_tiles(orbsym, nocc, 0, P)
        tensors = stored_tensors(orbsym, nocc, 0, tile, occ_tile)
        mem = class_balance(tensors, P)
        for name, t in tensors.items():      # every stored block placed once
            stored = sum(int(np.prod(t.block_shape(k))) for k in t.stored_keys())
            assert mem[name]["mean_bytes"] * P == pytest.approx(8 * stored)
            assert mem[name]["max_over_mean"] <= 1.5, (n, P, name, mem[name])
        assert mem["total"]["max_over_mean"] <= 1.5
        if previous is not None:
            assert mem["total"]["max_bytes"] < previous["total"]["max_bytes"]
            for name in tensors:
                assert mem[name]["max_bytes"] < previous[name]["max_bytes"], (n, P, name)
        previous = mem


def test_plan_ranks_json(tmp_path, capsys):
    xyz = tmp_path / "w4.xyz"
    xyz.write_text(water_cluster(4))
    out = {}
    for P in (64, 256):
        path = tmp_path / f"plan{P}.json"
        assert main(["plan", str(xyz), "--ranks", str(P), "--ranks-per-node", "64", "--memory-per-node",
                     "512GB", "--json", str(path)]) == 0
        out[P] = json.loads(path.read_text())
    text = capsys.readouterr().out
    assert "Memory per rank by tensor class" in text and "mpi-collective" in text and "(t)" in text
    a, b = out[64], out[256]
    assert a["memory_budget_per_rank"] == 8 * 2**30 and a["nodes"] == 1 and b["nodes"] == 4
    # one ghost per node once the ranks span nodes (progress auto): the executors are the workers'
    assert (a["workers"], a["ghosts_per_node"], b["workers"], b["ghosts_per_node"]) == (64, 0, 252, 1)
    assert "252 workers beside one ghost per node" in text
    coll = [e for e in b["executors"] if e["backend"] == "mpi-collective"]
    assert coll and all(sum(e["contraction_modes"].values()) > 0 for e in coll)
    for name in ("t2", "oooo", "ovoo", "oovv", "ovov", "ovvv", "vvvv", "total"):
        m = a["memory_per_rank"][name]
        assert m["max_over_mean"] == pytest.approx(m["max_bytes"] / m["mean_bytes"], rel=1e-3)
        assert m["max_over_mean"] <= 1.5
    assert set(a["memory_per_rank"]["(t)"]) == {"rows", "kernel"}
    assert {(e["backend"], e["variant"]) for e in a["executors"]} == {
        ("mpi-onesided", "original"), ("mpi-onesided", "inverted"), ("mpi-onesided", "cached"),
        ("mpi-collective", "summa"), ("mpi-collective", "2.5d")}
    assert all(e["bytes_per_rank"] > 0 and e["seconds_per_iteration"] > 0 for e in a["executors"])
    assert a["steps"] and all(s["tasks_per_rank"] == pytest.approx(s["tasks"] / 64) for s in a["steps"])
    # a slower network makes the same plan slower, never faster
    slow = tmp_path / "slow.json"
    assert main(["plan", str(xyz), "--ranks", "256", "--ranks-per-node", "64", "--network-bandwidth", "0.5",
                 "--network-latency", "50", "--json", str(slow)]) == 0
    slow_s = {(e["backend"], e["variant"]): e["seconds_per_iteration"] for e in json.loads(slow.read_text())["executors"]}
    for e in b["executors"]:
        assert slow_s[(e["backend"], e["variant"])] > e["seconds_per_iteration"]


@pytest.mark.parametrize("args", [["--ranks", "0"], ["--ranks", "many"], ["--ranks", "64", "--ranks-per-node", "-2"],
                                  ["--ranks", "64", "--memory-per-node", "lots"],
                                  ["--ranks", "64", "--network-bandwidth", "-1"],
                                  ["--ranks", "64", "--network-latency", "nan"],
                                  ["--ranks-per-node", "8"], ["--ranks", "64", "--method", "hf"]])
def test_bad_plan_options_are_one_line_errors(args, capsys):
    assert main(["plan", "examples/water.xyz", "--basis", "sto-3g", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error:") and "Traceback" not in err


def test_memory_budget_is_per_node(monkeypatch):
    monkeypatch.delenv("TESSERA_MEMORY_PER_RANK_MB", raising=False)
    assert memory_budget(min(1024, 64), memory_per_node=512 * 2**30)[0] == 8 * 2**30
    assert memory_budget(min(16, 64), memory_per_node=512 * 2**30)[0] == 32 * 2**30   # 16 ranks fill no node


def test_machine_model_one_node_is_local():
    m = Machine.calibrated()
    local, spread = m.on(64, 64), m.on(1024, 64)
    assert local["nodes"] == 1 and local["bandwidth"] == pytest.approx(m.copy_bytes_per_second)
    assert local["t_get"] == m.get_seconds and spread["t_get"] > m.get_seconds
    assert spread["nodes"] == 16 and spread["bandwidth"] < local["bandwidth"]


def test_auto_puts_the_network_between_nodes():
    """``auto`` decides with the formulas ``plan --ranks`` uses: on one node its local
    constants, across nodes the network between them (``Machine.on``)."""
    from tessera.backends.auto import LOCAL_COSTS, decide, run_costs
    from tessera.backends.machine import NETWORK_BANDWIDTH
    from tessera.chem.ccsd import CCSDStructure
    one = run_costs(8)
    assert all(one[k] == pytest.approx(v) for k, v in LOCAL_COSTS.items()) and one["nodes"] == 1
    two = run_costs(8, 4)
    off = 4 / 7                         # of a rank's 7 peers, 4 are on the other node
    assert two["nodes"] == 2 and two["t_get"] > one["t_get"] and two["t_coll"] > one["t_coll"]
    assert two["bandwidth"] == pytest.approx(1 / ((1 - off) / LOCAL_COSTS["bandwidth"] + off / (NETWORK_BANDWIDTH / 4)))
    structure = CCSDStructure(np.zeros(20, dtype=int), 5, 0)
    local = {(c["backend"], c["variant"]): c for c in decide(structure, 8, tile=8, rate=5e9)["candidates"]}
    spread = decide(structure, 8, tile=8, rate=5e9, ranks_per_node=2)["candidates"]
    for c in spread:                    # the same counts at other prices
        same = local[(c["backend"], c["variant"])]
        assert c["bytes_per_rank"] == same["bytes_per_rank"] and c["seconds"] != same["seconds"]
