"""Closed-shell CCSD driver: MP2 guess, Jacobi updates with DIIS, convergence control.

The equations live in ``ccsd_equations``; this module only iterates them.
DIIS (``chem.diis``) on the amplitude vector, in its CROP form (the subspace keeps the
extrapolated pairs; Ettenhuber, Jorgensen, J. Chem. Theory Comput. 11, 1518 (2015)) with
DIIS_SPACE pairs. At conv 1e-9 that took glycine cc-pVDZ 16 iterations (PySCF's DIIS of 6
pairs: 18), benzene 12 (13), H2O2 14 (16), N2 12 (13), water 11 (11); measured
against plain DIIS of 6, 8, 10, 12 pairs and CROP of 3-8. With distributed amplitudes each process
keeps the part of the vector it stores; inner products are summed over processes, so
every process gets the same DIIS coefficients. The DIIS history is kept in a temporary
file (``DIIS(on_disk=True)``, in the system's temporary folder, as PySCF keeps its CCSD
DIIS history), not in memory: glycine cc-pVDZ, 7 pairs of 11.4 MiB, 160 MiB of the
CCSD peak. With a ``checkpoint``
(``chem.checkpoint``) the amplitudes and the DIIS state are saved after the first and the
last iteration and, by its write policy, after iterations in between; a restart resumes
from them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, field

import numpy as np

import tessera as ts
from tessera.chem import ccsd_equations as eq
from tessera.chem.diis import DIIS
from tessera.chem.integrals import denominator
from tessera.errors import ConvergenceError, InputError
from tessera.tensor.pairs import free_for_ladder, free_plus_minus_last, kept_plus_minus, kept_plus_minus_last

log = logging.getLogger(__name__)

DIIS_SPACE = 7
# packed amplitude vectors (``_pack``) alive at a DIIS update, the peak of the driver's own
# arrays: the last vector, the new one, their difference (the error), and in ``DIIS.update``
# the weighted error, the extrapolated vector and (CROP) the extrapolated error; beside them
# the weights, one byte per element. The tensors (t2, tau, R2, Z, ...) are the iteration's
# intermediates, counted by the plans (``backends.iteration_counts``: ``pooled_bytes``).
PACKED_VECTORS = 6


@dataclass(frozen=True)
class CCSDResult:
    e_corr: float
    converged: bool
    iterations: list                  # dicts: iter, e_corr, delta, residual, seconds
    t1: object = field(repr=False)
    t2: object = field(repr=False)
    flops_per_iteration: int = 0


def _pack(t1, t2, keys) -> np.ndarray:
    """The amplitudes held here as one vector (empty on a rank that holds none): the
    blocks ``keys`` of each tensor, or, stored in pieces, the pieces held here."""
    return np.concatenate([np.zeros(0)] + [v for t, ks in zip((t1, t2), keys) for v in _runs(t, ks)])


def _runs(t, ks) -> list:
    """The flat runs of ``t`` in ``_pack``'s order (views; writable for a tensor in pieces)."""
    if t.pieced:
        return [t.dist.local_run()]
    return [t.blocks[k].ravel() for k in ks]


def _parts(t, ks) -> list:
    """(key, first element, elements) of each run of ``t`` in ``_pack``'s order."""
    if t.pieced:
        return t.dist.local_pieces()
    return [(k, 0, t.blocks[k].size) for k in ks]


def _weight(t1, t2, keys) -> np.ndarray:
    """Per element of ``_pack``'s vector, the elements of the whole amplitudes it stands
    for (T2 stores canonical blocks only: 2 for a block with a mirror image)."""
    return np.concatenate([np.zeros(0, np.uint8)] + [np.full(n, t.orbit_size(k), np.uint8)
                                                     for t, ks in zip((t1, t2), keys) for k, _, n in _parts(t, ks)])


def _layout(t1, t2, keys) -> list:
    """(tensor name, key, shape) of each run in the order ``_pack`` puts them: a block,
    or a piece, named by its block's key and its first element, of shape (elements,)."""
    return [(name, k, t.blocks[k].shape) if not t.pieced else (name, (*k, start), (n,))
            for name, t, ks in zip(("t1", "t2"), (t1, t2), keys) for k, start, n in _parts(t, ks)]


def _unpack(vec, t1, t2, keys) -> None:
    pos = 0
    for t, ks in zip((t1, t2), keys):
        for blk in [t.dist.local_run()] if t.pieced else [t.blocks[k] for k in ks]:
            blk[...] = vec[pos:pos + blk.size].reshape(blk.shape)
            pos += blk.size
        t.version += 1


class CCSD:
    """Options for a CCSD calculation; ``kernel(ints)`` runs it and returns a CCSDResult."""

    def __init__(self, conv: float = 1e-8, conv_residual: float | None = None,
                 max_iter: int = 50, diis_space: int = DIIS_SPACE, progress=None, checkpoint=None):
        if conv <= 0:
            raise InputError(f"--conv must be positive, got {conv}")
        if max_iter < 1:
            raise InputError(f"--max-iter must be at least 1, got {max_iter}")
        self.conv = conv
        self.conv_residual = conv_residual if conv_residual is not None else max(100 * conv, 1e-10)
        self.max_iter = max_iter
        self.diis_space = diis_space
        self.progress = progress          # called with each iteration's dict
        self.checkpoint = checkpoint      # chem.checkpoint.Checkpoint: save (and resume) the state

    def kernel(self, ints, context=None) -> CCSDResult:
        ctx = context or ts.current_context()
        with ctx:
            ctx.drop_gathered()         # what the phase before kept (the transform's working memory)
            try:
                with contextlib.ExitStack() as cleanup:     # removes the DIIS history's file
                    return self._iterate(ints, ctx, cleanup)
            finally:            # the integrals' gathered matrices: no use after CCSD ((T) has its own)
                ctx.drop_gathered()
                free_plus_minus_last(ints.ovvv)      # the ladder dressing's M+- (local runs)

    def _iterate(self, ints, ctx, cleanup) -> CCSDResult:
        D1, D2 = _denominators(ints)
        t1 = eq.new(ints, "ov", "t1").fill_zero_blocks()
        t2 = eq.new(ints, "oovv", "t2")
        t2["ijab"] = ints.ovov["iajb"] / D2["ijab"]                                   # MP2 guess
        t2.fill_zero_blocks()
        keys = (sorted(t1.owned_keys()), sorted(t2.owned_keys()))      # T2: its canonical blocks (or pieces)
        weight = _weight(t1, t2, keys)
        fixed = eq.fixed_intermediates(ints)
        if not ctx.distributed:
            _ladder_form(ints)
        tau = eq.make_tau(ints, t1, t2)
        e_old = eq.correlation_energy(fixed["L"], tau)
        log.info("MP2 correlation energy %.12f", e_old)
        # reduce through the handle, not a bound method of t2: that would keep the first
        # t2 (and its distributed storage) alive for the whole run
        diis = DIIS(self.diis_space, reduce=t2.dist.allreduce if t2.dist is not None else None, weight=weight,
                    crop=True, on_disk=True)
        cleanup.callback(diis.close)
        log.debug("CCSD DIIS history in a temporary file in %s", diis.vectors.directory)
        history, flops, first = [], 0, 1
        # the MP2 guess and the fixed intermediates run once: what they kept of the
        # integrals would pin the frozen cache that the iterations' steps need
        ctx.drop_frozen()
        chk = self.checkpoint
        layout = _layout(t1, t2, keys) if chk is not None else None
        resumed = chk.resume(layout) if chk is not None else None
        if resumed is not None:
            _unpack(resumed.vector, t1, t2, keys)
            tau = eq.make_tau(ints, t1, t2)
            diis.restore(resumed.diis_vectors, resumed.diis_errors, resumed.diis_gram)
            history, e_old, first = resumed.history, resumed.e_corr, resumed.iteration + 1
            log.info("CCSD resumed after iteration %d, E=%.12f", resumed.iteration, e_old)
            del resumed             # its DIIS pairs are in the history's file now
        converged, vec = False, None
        for it in range(first, self.max_iter + 1):
            t0, f0 = time.perf_counter(), ctx.flops
            r1, r2 = eq.residual(ints, t1, t2, tau, fixed)
            del tau                     # free until the next amplitudes' tau
            if it == first:             # every plan has run: constants of one layout stored once
                ctx.store_constants_gathered()
            new1, new2 = _update(ints, r1, r2, D1, D2)
            del r1, r2                  # freed before the packed vectors are made
            new1.fill_zero_blocks()
            new2.fill_zero_blocks()
            # the old amplitudes are the last iteration's vector (unpacked into t1, t2)
            old_vec = vec if vec is not None else _pack(t1, t2, keys)
            new_vec = _pack(new1, new2, keys)
            vec = diis.update(new_vec, new_vec - old_vec)
            res = diis.error_norm
            _unpack(vec, new1, new2, keys)
            t1, t2 = new1, new2
            tau = eq.make_tau(ints, t1, t2)     # for the energy and the next residual
            e = eq.correlation_energy(fixed["L"], tau)
            flops, seconds = ctx.flops - f0, time.perf_counter() - t0
            row = {"iter": it, "e_corr": e, "delta": e - e_old, "residual": res, "seconds": seconds,
                   "flops": flops, "gflops_per_s": flops / seconds / 1e9 if seconds > 0 else 0.0}
            history.append(row)
            if self.progress:
                self.progress(row)
            converged = abs(e - e_old) < self.conv and res < self.conv_residual
            if chk is not None:         # after the iteration's report: the write is not in its time
                chk.save(it, e, history, layout, vec, diis, final=converged or it == self.max_iter)
            log.info("CCSD iter %d  E=%.12f  dE=%.3e  |r|=%.3e", it, e, e - e_old, res)
            e_old = e
            if converged:
                break
        result = CCSDResult(e_old, converged, history, t1, t2, flops)
        if not converged:
            raise ConvergenceError(
                f"CCSD did not converge in {self.max_iter} iterations: last energy change "
                f"{history[-1]['delta']:.2e}, residual {history[-1]['residual']:.2e} "
                f"(wanted {self.conv:.0e} and {self.conv_residual:.0e}); raise --max-iter",
                result)
        return result


def _denominators(ints, energies: bool = True) -> tuple:
    """D1[ia] = e_i - e_a and D2[ijab] = e_i + e_j - e_a - e_b (canonical orbitals: the
    Jacobi update of the amplitudes, Scuseria, Janssen and Schaefer, J. Chem. Phys. 89,
    7382 (1988)), D2 placed as T2; ``energies`` False: their structure only (planning)."""
    eo, ev = ints.eo, ints.ev
    return (denominator(ints.spaces("ov"), (eo, ev) if energies else None, (1, -1), "D1"),
            denominator(ints.spaces("oovv"), (eo, eo, ev, ev) if energies else None, (1, 1, -1, -1), "D2",
                        eq.T2_SYMMETRY, eq.amplitude_placement("oovv")))


def _update(ints, r1, r2, D1, D2) -> tuple:
    """The new amplitudes t1 = R1 / D1, t2 = R2 / D2 (``_denominators``)."""
    new1, new2 = eq.new(ints, "ov", "t1"), eq.new(ints, "oovv", "t2")
    with ts.equations():
        new1["ia"] = r1["ia"] / D1["ia"]
        new2["ijab"] = r2["ijab"] / D2["ijab"]
    return new1, new2


def _ladder_form(ints) -> None:
    """Before the iterations of a local run: the ladder's V+- made once and vvvv freed,
    which nothing reads after them (``tensor.pairs``: ``plus_minus``, ``free_for_ladder``).
    The ladder term is planned on amplitudes without data (nothing runs): the planner
    makes V+- when it runs the ladder in the +/- form, and keeps them on vvvv for the
    residuals' plans; where it does not, vvvv is kept."""
    from tessera.backends.context import PlanningContext
    tau, r2 = (_structural(eq.new(ints, "oovv", name)) for name in ("tau", "R2"))
    t1 = _structural(eq.new(ints, "ov", "t1"))
    with PlanningContext(), ts.equations():
        eq.ladder(ints, r2, tau, t1)
    free_for_ladder(ints.vvvv)


def minimal_flops(o, v) -> int:
    """Flops of one lean closed-shell CCSD iteration on the block structure of spaces
    ``o``, ``v``: o^2 v^4 + 8 o^3 v^3 + o^4 v^2 in C1 (the ladder and the o^4 v^2 term on
    pairs i <= j, four particle-hole ring contractions; PySCF ``ccsd.py``, Scuseria,
    Janssen, Schaefer 1988), each counted per irrep g of the index pairs it multiplies."""
    no = np.bincount(o.irreps, minlength=8)
    nv = np.bincount(v.irreps, minlength=8)
    pair = lambda x, y: np.array([sum(x[h] * y[h ^ g] for h in range(8)) for g in range(8)])  # noqa: E731
    oo, vv, ov = pair(no, no), pair(nv, nv), pair(no, nv)
    return int(np.sum(oo * vv**2 + 8 * ov**3 + oo**2 * vv))


@dataclass(frozen=True)
class IterationStructure:
    """One CCSD iteration at given tile sizes, planned without data: the cost model's
    and ``tessera plan``'s view of a run. ``plans``: the plans of one iteration;
    ``tensors``: what a run stores (T2 and the integral classes, empty, with their
    placement); ``tiles``: tile sizes per space; ``held``: bytes the driver holds beside
    them and the plans' intermediates (the constants D1, D2, L, VO, the packed amplitude
    vectors of a DIIS update, ``PACKED_VECTORS``, a local run's ladder V+-, which replace vvvv among the stored
    tensors, counted whole: once gathered, their off-diagonal blocks are views of the
    gathered squares the working set counts too, an upper bound by about 2/3 of V+-; not
    the DIIS history, which is in a file), spread over the ranks like T2; ``dressing``: bytes of
    the M+- of a local run's t1 dressing of the ladder, made in its first iteration and
    from its first residual on held as their gathered matrices only
    (``Context.store_constants_gathered``), which the executor's working set counts."""
    o: object
    v: object
    plans: list
    tensors: list
    tiles: dict
    held: dict = field(default_factory=dict)
    dressing: int = 0


def _structural(t):
    """``t`` with every allowed block present as a read-only zero of no memory (a
    zero-stride view, one per block shape): what a run stores, for planning without data."""
    zeros: dict = {}

    def zero(shape):
        if shape not in zeros:
            zeros[shape] = np.broadcast_to(np.float64(0.0), shape)
        return zeros[shape]
    t.blocks = {k: zero(t.block_shape(k)) for k in t.allowed_keys()}
    return t


class CCSDStructure:
    """``structure(tile, occ_tile)`` for ``backends.auto.decide``: the CCSD iteration of
    orbitals with irreps ``orbsym`` (``nocc`` occupied, ``nfrozen`` of them frozen), as a
    ``distributed`` run plans it (``plan.symmetric.distributed_plans``) or a local one."""

    def __init__(self, orbsym, nocc: int, nfrozen: int = 0, distributed: bool = False):
        self.orbsym, self.nfrozen, self.distributed = np.asarray(orbsym), int(nfrozen), bool(distributed)
        self.nocc = int(nocc) - self.nfrozen          # active occupied orbitals
        self._nocc_all = int(nocc)
        self._planned: dict = {}                      # tiling -> IterationStructure

    def __call__(self, tile: int, occ_tile: int | None = None) -> IterationStructure:
        """The iteration at these tiles, planned once per tiling (tiles that cut the spaces
        alike give the same object; callers read it, never change it)."""
        from tessera.chem.integrals import make_spaces
        o, v = make_spaces(self.orbsym, self._nocc_all, self.nfrozen, tile, occ_tile)
        tiling = tuple(tuple((tl.size, tl.irrep) for tl in s.tiles) for s in (o, v))
        if tiling not in self._planned:
            self._planned[tiling] = self._plan(o, v)
        return self._planned[tiling]

    def _plan(self, o, v) -> IterationStructure:
        from tessera.backends.context import PlanningContext
        from tessera.chem.integrals import CLASSES, MOIntegrals, class_tensor
        from tessera.plan.symmetric import distributed_plans
        ctx = PlanningContext()
        with ctx, distributed_plans(self.distributed):
            tensors = {name: _structural(class_tensor(name, o, v)).freeze() for name in CLASSES}
            ints = MOIntegrals(o, v, np.zeros(o.dim), np.zeros(v.dim), tensors, self.nfrozen)
            t1, t2 = _structural(eq.new(ints, "ov", "t1")), _structural(eq.new(ints, "oovv", "t2"))
            fixed = {k: _structural(t) for k, t in eq.fixed_intermediates(ints).items()}
            D1, D2 = (_structural(d).freeze() for d in _denominators(ints, energies=False))
            ctx.plans.clear()               # those are made once per CCSD, not per iteration
            _update(ints, *eq.residual(ints, t1, t2, fixed=fixed), D1, D2)
        elements = t1.stored_elements + t2.stored_elements
        # made once per CCSD and read by every iteration, not stored among the classes:
        # the denominators and the fixed intermediates (L for the energy, VO for W2)
        held = {"constants": sum(8 * t.stored_elements for t in (D1, D2, *fixed.values())),
                "packed vectors": (8 * PACKED_VECTORS + 1) * elements}     # the DIIS history is in a file
        plus_minus = kept_plus_minus(tensors["vvvv"])
        if plus_minus:          # a local run iterates with the ladder's V+- and vvvv freed (_ladder_form)
            held["ladder V+-"] = sum(8 * t.stored_elements for t in plus_minus)
        # and the M+- of ovvv its t1 dressing reads (plan.symmetric._plus_minus_steps)
        dressing = sum(8 * t.stored_elements for t in kept_plus_minus_last(tensors["ovvv"]))
        stored = [t2, *(t for n, t in tensors.items() if not (plus_minus and n == "vvvv"))]
        return IterationStructure(o, v, ctx.plans, stored,
                                  {"o": [t.size for t in o.tiles], "v": [t.size for t in v.tiles]}, held, dressing)

    def stored(self, tile: int, occ_tile: int | None = None) -> dict:
        """{name: empty tensor} of what a run stores at these tiles: the integral classes
        (vvvv first), T2 (canonical blocks) and one of each other structure of the T2-sized
        intermediates (each keeps its array through the iterations: ``Z`` (oovv, not
        pair-symmetric), ``W_ovov``, ``W_voov``), placed as the driver's (``eq.new``); no
        planning (``backends.balance`` places their blocks)."""
        from tessera.chem.integrals import CLASSES, class_tensor, make_spaces
        o, v = make_spaces(self.orbsym, self._nocc_all, self.nfrozen, tile, occ_tile)
        space = {"o": o, "v": v}

        def amplitude(name, letters, **kw):
            return ts.BlockTensor(tuple(space[x] for x in letters), 0, name=name,
                                  placement=eq.amplitude_placement(letters), **kw)
        return {**{n: class_tensor(n, o, v) for n in sorted(CLASSES, key=lambda n: -n.count("v"))},
                "t2": amplitude("t2", "oovv", symmetry=eq.T2_SYMMETRY, canonical=True),
                "Z": amplitude("Z", "oovv"), "W_ovov": amplitude("W_ovov", "ovov"),
                "W_voov": amplitude("W_voov", "voov")}
