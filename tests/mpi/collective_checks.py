"""mpi-collective's exchanges under `mpiexec -n K`: alltoallv in rounds, requests by owner,
frozen operands moved once.

Rank 0 prints one JSON object:
- ``alltoallv``: for send sizes 0..11 elements per pair (rank- and pair-dependent), whether
  every rank received exactly the expected values with the chunk limit at 5 elements
  (many rounds) and at the default (one call), and how many MPI_Alltoallv calls the limit
  of 5 took;
- ``requests``: max |error| of blocks fetched by request (``fetch_blocks``, whole blocks and
  parts) against the dense tensor, and whether any allgather was used;
- ``patches``: patches cut along two axes of every block of a canonical-block tensor (aliases
  included) by each executor: max error, and mpi-onesided's get bytes beside the remote
  patches' bytes;
- ``frozen``: R = W * tau (ladder pattern) run three times per case (nothing, W, tau or
  both frozen, on the grid; nothing or W frozen with the products on the output's owners), and a permuted addition plus a Hadamard product (``owner_none``,
  ``owner_frozen``): the bytes received over all ranks per run (alltoallv and broadcasts)
  and the max error against numpy;
- ``cached_split``: mpi-onesided ``cached`` with a cache bound of 0 (every product a batch of
  its own): max error against numpy, accumulates over all ranks and block products.
"""

import json
from unittest import mock

import numpy as np

import tessera as ts
from tessera import BlockTensor, IndexSpace
from tessera.backends.context import Context
from tessera.runtime import World, alltoallv as chunked

COLL_OPS = ("alltoallv", "bcast_row", "bcast_col")


def pair_data(src, dst):
    n = (3 * src + 5 * dst) % 12
    return np.arange(n, dtype=np.float64) + 1000 * src + 100 * dst


class CountingComm:
    """world.comm with its MPI_Alltoallv calls counted."""

    def __init__(self, comm):
        self.comm, self.calls = comm, 0

    def Alltoallv(self, *args):
        self.calls += 1
        return self.comm.Alltoallv(*args)

    def __getattr__(self, name):
        return getattr(self.comm, name)


def check_alltoallv(world) -> dict:
    me, size = world.rank, world.size
    send = [pair_data(me, d) for d in range(size)]
    counts = [pair_data(s, me).size for s in range(size)]
    out = {}
    for label, limit in (("limit5", 5), ("default", chunked.LIMIT)):
        with mock.patch.object(chunked, "LIMIT", limit):
            recv = world.alltoallv(send, counts)               # the runtime's path
        comm = CountingComm(world.comm)
        rbuf, rdis = chunked.alltoallv(comm, world._MPI, send, counts, limit)
        ok = all(np.array_equal(recv[s], pair_data(s, me)) for s in range(size)) and \
            all(np.array_equal(rbuf[d:d + c], pair_data(s, me)) for s, (d, c) in enumerate(zip(rdis, counts)))
        out[label] = {"ok": bool(world.allreduce(np.array([int(ok)]), "min")[0]), "calls": comm.calls}
    return out


def check_requests(world) -> dict:
    rng = np.random.default_rng(11)
    o = IndexSpace.from_irreps("o", rng.integers(0, 2, 5), 2)
    v = IndexSpace.from_irreps("v", rng.integers(0, 2, 8), 3)
    with Context("mpi-collective") as ctx:
        T = BlockTensor.random((o, o, v, v), 0, rng=rng, name="T")
        dense = T.to_dense()
        keys = sorted(T.allowed_keys())
        mine = keys[world.rank::world.size] + keys[:2]        # overlapping requests, remote blocks
        parts = [(T, k, (2, 0, 1)) for k in keys[-3:]]        # the first row of axis 2
        snap = world.comm_log.snapshot()
        got = ctx.executor.fetch_blocks([(T, k) for k in mine] + parts)
        ops = sorted({r.op for r in world.comm_log.records(snap)})
        err = 0.0
        for k in mine + [k for _, k, _ in parts]:
            ref = dense[np.ix_(*(s.orbitals[s.slice(t)] for s, t in zip(T.spaces, k)))]
            err = max(err, float(np.abs(got[(T.uid, k)] - ref).max()) if (T.uid, k) in got else 0.0)
            if (T.uid, k, (2, 0, 1)) in got:
                err = max(err, float(np.abs(got[(T.uid, k, (2, 0, 1))] - ref[:, :, 0:1]).max()))
        complete = all((T.uid, k) in got for k in mine) and all((T.uid, k, p) in got for _, k, p in parts)
    return {"err": err, "ops": ops, "complete": complete}


def check_patches(world) -> dict:
    """Patches cut along two axes (``(0, lo, hi, 2, lo, hi)``) of every block of a tensor
    kept as canonical blocks (T2's pair symmetry: half the keys are aliases), fetched by
    each executor: max error against the dense tensor, and for mpi-onesided the bytes its
    gets moved and the bytes of the remote patches asked for (equal: an alias's patch is
    cut from its canonical block at the owner, not fetched whole)."""
    from tessera.chem.ccsd_equations import T2_SYMMETRY
    rng = np.random.default_rng(5)
    o = IndexSpace.from_irreps("o", np.zeros(5, int), 3)
    v = IndexSpace.from_irreps("v", np.zeros(7, int), 4)
    dense = rng.standard_normal((5, 5, 7, 7))
    dense = dense + dense.transpose(1, 0, 3, 2)
    out = {}
    for backend in ("mpi-onesided", "mpi-collective"):
        with Context(backend) as ctx:
            T = BlockTensor.from_dense(dense, (o, o, v, v), name="T2", symmetry=T2_SYMMETRY, canonical=True)
            T.dist.ga.sync()                                         # every rank's blocks in place
            err = float(np.abs(T.to_dense() - dense).max())
            keys = sorted(T.allowed_keys())
            part = (0, 1, 2, 2, 1, 3)                  # row 1 of axis 0, columns 1..2 of axis 2
            snap = world.comm_log.snapshot()
            got = ctx.executor.fetch_blocks([(T, k, part) for k in keys])
            gets = sum(r.nbytes for r in world.comm_log.records(snap) if r.op == "get")
            remote = sum(8 * T.block_shape(k)[1] * T.block_shape(k)[3] * 2 for k in keys if T.blocks.get(k) is None)
            for k in keys:
                ref = dense[np.ix_(*(s.orbitals[s.slice(t)] for s, t in zip(T.spaces, k)))][1:2, :, 1:3]
                err = max(err, float(np.abs(got[(T.uid, k, part)] - ref).max()))
            out[backend] = {"err": err, "aliases": len(T.dist.ga.aliases),
                            "gets": int(world.allreduce(np.array([gets]), "sum")[0]),
                            "remote": int(world.allreduce(np.array([remote]), "sum")[0])}
    return out


def check_frozen(world) -> dict:
    o = IndexSpace.from_irreps("o", np.zeros(4, int), 2)
    v = IndexSpace.from_irreps("v", np.zeros(9, int), 3)
    out = {}
    for case in ("none", "W", "tau", "both", "stationary_c_none", "stationary_c_W"):
        # the grid's panels (stationary never), and products on the output's owners (c)
        with Context("mpi-collective", variant="summa", stationary="c" if case.startswith("stationary") else "never"):
            W = BlockTensor.random((v, v, v, v), 0, rng=np.random.default_rng(1), name="W")
            tau = BlockTensor.random((o, o, v, v), 0, rng=np.random.default_rng(2), name="tau")
            if case in ("W", "both", "stationary_c_W"):
                W.freeze()
            if case in ("tau", "both"):
                tau.freeze()
            ref = np.einsum("abcd,ijcd->ijab", W.to_dense(), tau.to_dense())
            R = BlockTensor((o, o, v, v), 0, name="R")
            moved, err = [], 0.0
            for _ in range(3):
                snap = world.comm_log.snapshot()
                with ts.equations():
                    R["ijab"] = W["abcd"] * tau["ijcd"]
                mine = int(world.comm_log.row(world.size, COLL_OPS, since=snap).sum())
                moved.append(int(world.allreduce(np.array([mine]), "sum")[0]))
                err = max(err, float(np.abs(R.to_dense() - ref).max()))
        out[case] = {"moved": moved, "err": err}
    # owner-computes steps: a permuted addition and a Hadamard product of frozen inputs
    for case in ("owner_none", "owner_frozen"):
        with Context("mpi-collective", variant="summa"):
            W = BlockTensor.random((v, v, v, v), 0, rng=np.random.default_rng(1), name="W")
            tau = BlockTensor.random((o, o, v, v), 0, rng=np.random.default_rng(2), name="tau")
            if case == "owner_frozen":
                W.freeze()
                tau.freeze()
            w_, t_ = W.to_dense(), tau.to_dense()
            ref_s = w_.transpose(1, 0, 3, 2) - 0.5 * w_.transpose(2, 3, 0, 1)
            ref_h = t_ * t_.transpose(1, 0, 3, 2)
            S, H = BlockTensor((v, v, v, v), 0, name="S"), BlockTensor((o, o, v, v), 0, name="H")
            moved, err = [], 0.0
            for _ in range(3):
                snap = world.comm_log.snapshot()
                with ts.equations():
                    S["abcd"] = W["badc"] - 0.5 * W["cdab"]
                    H["ijab"] = tau["ijab"] * tau["jiba"]
                mine = int(world.comm_log.row(world.size, COLL_OPS, since=snap).sum())
                moved.append(int(world.allreduce(np.array([mine]), "sum")[0]))
                err = max(err, float(np.abs(S.to_dense() - ref_s).max()), float(np.abs(H.to_dense() - ref_h).max()))
        out[case] = {"moved": moved, "err": err}
    return out


def check_cached_split(world) -> dict:
    """mpi-onesided cached with a cache bound of 0 bytes: every batch is one product, each
    accumulating its part of the output block; the result is numpy's."""
    o = IndexSpace.from_irreps("o", np.zeros(4, int), 2)
    v = IndexSpace.from_irreps("v", np.zeros(9, int), 3)
    with Context("mpi-onesided", variant="cached", cache_mb=0):
        W = BlockTensor.random((v, v, v, v), 0, rng=np.random.default_rng(1), name="W")
        tau = BlockTensor.random((o, o, v, v), 0, rng=np.random.default_rng(2), name="tau")
        R = BlockTensor((o, o, v, v), 0, name="R")
        snap = world.comm_log.snapshot()
        with ts.equations():
            R["ijab"] = W["abcd"] * tau["ijcd"]
        accs = sum(r.count for r in world.comm_log.records(snap) if r.op in ("acc", "local_acc"))
        accs = int(world.allreduce(np.array([accs]), "sum")[0])
        err = float(np.abs(R.to_dense() - np.einsum("abcd,ijcd->ijab", W.to_dense(), tau.to_dense())).max())
    return {"err": err, "accs": accs, "products": 3 ** 2 * 2 ** 2 * 3 ** 2}


def main():
    world = World.get()
    result = {"nranks": world.size, "alltoallv": check_alltoallv(world), "requests": check_requests(world),
              "patches": check_patches(world),
              "frozen": check_frozen(world), "cached_split": check_cached_split(world)}
    if world.rank == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
