"""Completion handles of a GlobalArray's non-blocking operations (iget, iacc and their
patch forms): ``Handle.wait()`` flushes the targets the operation is pending on, once
per target and flush epoch (see ``runtime.global_array`` for the semantics)."""

from __future__ import annotations

from time import perf_counter

from tessera.errors import RuntimeLayerError


class Handle:
    """Completion handle of a non-blocking get or accumulate.

    The operation is issued at once (MPI_Get / MPI_Accumulate inside the rank's
    passive-target epoch); wait() flushes its target, unless a flush of that target
    has already happened since the operation was issued (then it is complete), so
    waiting on a batch of handles to one target costs one flush.
    """

    __slots__ = ("_ga", "_result", "_pending", "_op", "_parts", "_keep", "_done", "_perm")

    def __init__(self, ga, op, result, pending, parts, keep=None, perm=None):
        self._ga = ga
        self._perm = perm        # a get of an alias block: the result is transposed
        self._op = op
        self._result = result
        self._pending = pending  # ((target, flush epoch at issue), ...)
        self._parts = parts
        self._keep = keep
        self._done = not pending

    @property
    def done(self) -> bool:
        """True once the operation is complete (wait() returned, or nothing was pending)."""
        return self._done

    def wait(self):
        """Complete the operation; returns the ndarray for gets, None for accumulates."""
        if not self._done:
            t0 = perf_counter()
            ga = self._ga
            if ga._win is None:
                raise RuntimeLayerError(
                    f"waiting on a {self._op} of global array {ga.name!r} after it was freed; "
                    "wait on every handle before ga.free()."
                )
            epochs = ga._epochs
            for target, epoch in self._pending:
                if epochs[target] == epoch:
                    ga._win.Flush(target)
                    epochs[target] += 1
            dt = perf_counter() - t0
            if len(self._parts) == 1:
                ga._log.add_time(self._op, self._parts[0][0], dt)
            else:
                total = sum(n for _, n in self._parts) or 1
                for peer, n in self._parts:
                    ga._log.add_time(self._op, peer, dt * n / total)
            self._done = True
            self._keep = None
        return self._result if self._perm is None else self._result.transpose(self._perm)
