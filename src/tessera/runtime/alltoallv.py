"""A personalised all-to-all of any size: MPI_Alltoallv in rounds when counts overflow.

MPI's counts and displacements are C ints, so one MPI_Alltoallv moves at most 2^31 - 1
elements into (or out of) one rank's buffer. ``alltoallv`` below calls it once when every
rank's send and receive totals fit (``LIMIT``), else in rounds: round r moves elements
r*L .. (r+1)*L - 1 of every (source, destination) pair, L = LIMIT // ranks, so no round's
total or displacement exceeds the limit. The ranks agree on the number of rounds by one
small allreduce (MAX) of their totals and largest pair count.
"""

from __future__ import annotations

import numpy as np

from tessera.errors import RuntimeLayerError

LIMIT = 2 ** 31 - 1      # elements per MPI_Alltoallv buffer (C int counts and displacements)


def offsets(counts) -> list:
    """Displacements of consecutive pieces of ``counts`` elements."""
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)[:-1]]).astype(int).tolist()


def round_counts(counts, r: int, per: int) -> list:
    """Elements of each pair moved in round ``r`` (elements r*per .. (r+1)*per - 1)."""
    return [max(0, min(c - r * per, per)) for c in counts]


def plan_rounds(totals_max: int, pair_max: int, nranks: int, limit: int) -> tuple:
    """(rounds, elements per pair per round) for the largest send/receive total and the
    largest single pair count over all ranks: (1, None) when one call fits the limit."""
    if totals_max <= limit:
        return 1, None
    if limit < nranks:
        raise RuntimeLayerError(f"alltoallv: a limit of {limit} elements per call cannot hold one element "
                                f"from each of {nranks} ranks; the limit must be at least the rank count.")
    per = limit // nranks
    return -(-pair_max // per), per


def alltoallv(comm, mpi, parts: list, recv_counts: list, limit: int | None = None) -> tuple:
    """Send ``parts[d]`` (flat float64) to rank d, receive ``recv_counts[s]`` elements from
    rank s; returns (receive buffer, displacements of each source in it). Collective."""
    limit = LIMIT if limit is None else int(limit)
    counts = [int(a.size) for a in parts]
    rc = [int(c) for c in recv_counts]
    rdis = offsets(rc)
    rbuf = np.empty(max(1, sum(rc)))
    mine = np.array([max(sum(counts), sum(rc)), max(counts + rc, default=0)], dtype=np.int64)
    if comm.Get_size() > 1:
        comm.Allreduce(mpi.IN_PLACE, mine, op=mpi.MAX)
    rounds, per = plan_rounds(int(mine[0]), int(mine[1]), len(parts), limit)
    if per is None:
        sbuf = np.concatenate(parts) if sum(counts) else np.zeros(1)
        comm.Alltoallv([sbuf, (counts, offsets(counts))], [rbuf, (rc, rdis)])
        return rbuf, rdis
    for r in range(rounds):
        sc, rcr = round_counts(counts, r, per), round_counts(rc, r, per)
        lo = r * per
        sbuf = np.concatenate([a[lo:lo + n] for a, n in zip(parts, sc)]) if sum(sc) else np.zeros(1)
        tmp = np.empty(max(1, sum(rcr)))
        comm.Alltoallv([sbuf, (sc, offsets(sc))], [tmp, (rcr, offsets(rcr))])
        for d, n, off in zip(rdis, rcr, offsets(rcr)):
            rbuf[d + lo:d + lo + n] = tmp[off:off + n]
    return rbuf, rdis
