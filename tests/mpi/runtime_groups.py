"""World.alltoallv and World.split (Group) under `mpiexec -n K`, against a NumPy model.

Every rank builds the same model from the rank numbers alone. Sections:
- alltoallv: rank s sends rank d a known integer-valued array of a length that depends
  on (s, d) (zero for some pairs); every received piece must equal the model, and the
  comm log must show the bytes sent to other ranks.
- a pr x pc grid (2 x 2 at 4 ranks): row groups (color row, key column) and column
  groups (color column, key row); world_rank() against the grid; a bcast along every
  row and column from each possible root; allreduce and barrier in a group; the comm
  log records (op name, root's World rank as peer, bytes).
- errors (bad color, wrong number of send arrays, wrong dtype, a non-array bcast, use
  after free), and a group left alive until World.stop() (freed there: no warning).
Rank 0 prints one JSON object; tests/test_runtime_groups_mpi.py asserts on it.
"""

import json
import math

import numpy as np

from tessera.errors import RuntimeLayerError
from tessera.runtime import World


def piece(s: int, d: int) -> np.ndarray:
    """What rank s sends rank d: (s + 2d + 1) % 3 * (s + d + 1) elements (none for some
    pairs), integer-valued."""
    n = ((s + 2 * d + 1) % 3) * (s + d + 1)
    return 1000.0 * s + 100.0 * d + np.arange(n, dtype=np.float64)


def grid(size: int) -> tuple:
    pr = int(math.isqrt(size))
    while size % pr:
        pr -= 1
    return pr, size // pr


def error_of(fn):
    try:
        fn()
    except RuntimeLayerError as exc:
        return str(exc)
    return None


def recorded(log, snap, op):
    """{peer: [count, bytes]} of op since snap."""
    out = {}
    for r in log.records(since=snap):
        if r.op == op:
            out[str(r.peer)] = [r.count, r.nbytes]
    return out


def main():
    world = World.get()
    rank, size = world.rank, world.size
    log = world.comm_log
    out = {"size": size, "ghosts": world.full_size - size}

    # ---- alltoallv --------------------------------------------------------------
    snap = log.snapshot()
    recv = world.alltoallv([piece(rank, d) for d in range(size)],
                           [piece(s, rank).size for s in range(size)])
    bad = sum(not np.array_equal(recv[s], piece(s, rank)) for s in range(size))
    sent_other = 8 * sum(piece(rank, d).size for d in range(size) if d != rank)
    rec = recorded(log, snap, "alltoallv")
    out["alltoallv"] = {
        "mismatches": world.allreduce(bad, "sum"),
        "log_ok": bool(world.allreduce(int(rec == {"-1": [1, sent_other]}), "land")),
        "bytes_rank0": rec.get("-1", [0, 0])[1], "expected_rank0": 8 * sum(
            piece(0, d).size for d in range(1, size)),
        "received_total": world.allreduce(sum(int(r.size) for r in recv), "sum"),
        "expected_total": sum(piece(s, d).size for s in range(size) for d in range(size)),
    }
    # all empty: nothing moves, still one recorded call with 0 bytes
    snap = log.snapshot()
    empty = world.alltoallv([np.zeros(0)] * size, [0] * size)
    out["alltoallv_empty"] = bool(world.allreduce(int(all(e.size == 0 for e in empty) and
                                                      recorded(log, snap, "alltoallv") == {"-1": [1, 0]}),
                                                  "land"))

    # ---- row and column groups of a pr x pc grid ---------------------------------
    pr, pc = grid(size)
    my_row, my_col = divmod(rank, pc)
    row = world.split(my_row, my_col)      # same grid row, group rank = column
    col = world.split(my_col, my_row)      # same grid column, group rank = row
    checks = {
        "row_rank": row.rank == my_col and row.size == pc,
        "col_rank": col.rank == my_row and col.size == pr,
        "row_world_ranks": [row.world_rank(c) for c in range(pc)] == [my_row * pc + c for c in range(pc)],
        "col_world_ranks": [col.world_rank(r) for r in range(pr)] == [r * pc + my_col for r in range(pr)],
    }
    snap = log.snapshot()
    mism = 0
    expect_bytes: dict = {}
    for root in range(pc):                 # along the row from every column
        buf = np.full(5 + root, -1.0)
        if my_col == root:
            buf[:] = 10.0 * rank + np.arange(buf.size)
        row.bcast(buf, root, op_name="bcast_row")
        src = my_row * pc + root
        mism += not np.array_equal(buf, 10.0 * src + np.arange(buf.size))
        if pc > 1:
            expect_bytes.setdefault(("bcast_row", src), [0, 0])
            expect_bytes[("bcast_row", src)][0] += 1
            expect_bytes[("bcast_row", src)][1] += buf.nbytes
    for root in range(pr):                 # along the column from every row
        buf = np.full((2, 3 + root), -1.0)
        if my_row == root:
            buf[:] = -7.0 * rank - np.arange(buf.size).reshape(buf.shape)
        col.bcast(buf, root, op_name="bcast_col")
        src = root * pc + my_col
        mism += not np.array_equal(buf, -7.0 * src - np.arange(buf.size).reshape(buf.shape))
        if pr > 1:
            expect_bytes.setdefault(("bcast_col", src), [0, 0])
            expect_bytes[("bcast_col", src)][0] += 1
            expect_bytes[("bcast_col", src)][1] += buf.nbytes
    got_bytes = {}
    for r in log.records(since=snap):
        got_bytes[(r.op, r.peer)] = [r.count, r.nbytes]
    checks["bcast_log"] = got_bytes == expect_bytes
    # allreduce in a group: sum of the row's World ranks (array and scalar), max over a column
    s_arr = row.allreduce(np.array([float(rank), 1.0]), "sum")
    checks["row_allreduce"] = s_arr.tolist() == [float(sum(my_row * pc + c for c in range(pc))), float(pc)]
    checks["col_allreduce_max"] = col.allreduce(rank, "max") == (pr - 1) * pc + my_col
    row.barrier()
    out["groups"] = {k: bool(world.allreduce(int(v), "land")) for k, v in checks.items()}
    out["bcast_mismatches"] = world.allreduce(mism, "sum")
    out["grid"] = [pr, pc]
    out["bcast_bytes_rank0"] = sum(b for (op, _), (_, b) in got_bytes.items())
    out["bcast_expected_rank0"] = sum(b for _, b in expect_bytes.values())

    # ---- errors and lifetime -------------------------------------------------------
    errors = {
        "bad_color": error_of(lambda: world.split(-1, 0)),
        "alltoallv_len": error_of(lambda: world.alltoallv([np.zeros(0)] * (size + 1), [0] * size)),
        "alltoallv_dtype": error_of(lambda: world.alltoallv([np.zeros(1, dtype=np.int64)] * size,
                                                            [1] * size)),
        "bcast_object": error_of(lambda: row.bcast([1, 2], 0)),
        "world_rank_range": error_of(lambda: row.world_rank(pc)),
    }
    col.free()
    col.free()                              # a second free does nothing
    errors["use_after_free"] = error_of(lambda: col.bcast(np.zeros(2), 0))
    out["errors"] = errors
    out["live_groups_before_stop"] = len(world._groups)
    world.stop()                            # frees the row group
    out["row_freed_by_stop"] = row.freed
    if rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
