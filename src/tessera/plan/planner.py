"""Compile recorded updates into steps of block work, with their flops, bytes and memory:
the cost-optimal pairing of each term's factors.

Each term ``s * A * B * ... [/ D]`` becomes a chain of pairwise steps (``plan.steps``):
contractions (one GEMM per symmetry sector, see ``layout``), Hadamard-type products
(indices shared by both factors and the output, block by block), and permuted, scaled
additions. Factors
are combined greedily, cheapest pair first, through intermediates that hold only the
indices still needed. The pairing order of a term is cost-optimal: every order is
costed on the block-sparse structure it will run (sector GEMM flops, then the largest
intermediate), and the cheapest is taken (exhaustive search; terms have few factors).
Only symmetry-allowed block combinations appear. A target stored as canonical blocks
(``BlockTensor(canonical=True)``) is written at its canonical blocks only, after a check
that the update has the target's symmetry; such results (half contractions on the
canonical pairs, the +/- ladder, mirror images) are planned by ``plan.symmetric``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from tessera.errors import ShapeError
from tessera.expr.terms import Ref, Update
from tessera.plan.steps import Factor, Step, add_step, contraction, factor_of, letter_spaces, pair_step, term_refs
from tessera.plan.symmetric import check_symmetric_update, dressed_ladder, mirror_half, pair_packs, symmetric_half
from tessera.tensor.block_tensor import BlockTensor, allowed_elements


@dataclass(frozen=True)
class PathChoice:
    """The pairing orders of one multi-factor term: (path, flops, largest intermediate
    elements), cheapest first; ``paths[0]`` is the one planned."""

    term: str
    paths: tuple


@dataclass
class Plan:
    steps: list
    labels: list
    choices: list = field(default_factory=list)

    @property
    def flops(self) -> int:
        return sum(s.flops for s in self.steps)

    @property
    def peak_memory(self) -> int:
        return max((s.memory for s in self.steps), default=0)

    def per_update(self) -> list:
        """(label, flops, bytes moved, tasks) for each update, in order."""
        out: dict = {}
        for s in self.steps:
            f, b, n = out.get(s.label, (0, 0, 0))
            out[s.label] = (f + s.flops, b + s.bytes_moved(), n + max(1, len(s.sectors)))
        return [(lab, *out[lab]) for lab in self.labels if lab in out]

    def render(self) -> str:
        lines = [f"{'flops':>12s} {'bytes':>12s} {'GEMMs':>6s}  update"]
        for lab, f, b, n in self.per_update():
            lines.append(f"{f:12.3e} {b:12.3e} {n:6d}  {lab}")
        lines.append(f"total {self.flops:.4e} flops, peak temporary memory {self.peak_memory / 2**20:.1f} MiB")
        return "\n".join(lines)

    def render_paths(self) -> str:
        """The pairing chosen for each term of three or more factors, against the others."""
        lines = []
        for c in self.choices:
            lines.append(f"  {c.term}")
            for n, (path, flops, elems) in enumerate(c.paths):
                mark = "chosen" if n == 0 else f"{flops / max(c.paths[0][1], 1):6.2f}x"
                lines.append(f"    {mark:>7s} {flops:11.3e} flops {8 * elems / 2**20:9.1f} MiB  {path}")
        return "\n".join(lines)


def plan_updates(updates: list) -> Plan:
    steps, labels, choices = [], [], []
    with pair_packs() as packs:
        for up in updates:
            label = up.describe()
            labels.append(label)
            steps.extend(_plan_update(up, label, choices))
            # a tensor this update wrote is packed anew by the terms after it
            for key in [k for k, (source, _) in packs.items() if source is up.target.tensor]:
                del packs[key]
    return Plan(steps, labels, choices)


def _plan_update(up: Update, label: str, choices: list) -> list:
    target = up.target
    terms = up.expr.terms()
    if target.tensor.aliases:
        check_symmetric_update(terms, target, label)
    aliased = any(r.tensor is target.tensor for t in terms for r in term_refs(t))
    out = target
    steps = []
    if aliased:     # compute into a fresh tensor, then move it into the target
        out = Ref(target.tensor.like("tmp"), target.indices)
    elif not up.accumulate:
        steps.append(Step("zero", target, label=label))
    dressed = dressed_ladder(terms, out, label)
    if dressed:
        ladder, dressing, twin = dressed
        half_steps = symmetric_half(ladder.factors, out, ladder.scale, label, dressing)
        if not half_steps:          # the ladder, then the dressing once and with its mirror image
            half_steps = _plan_term(ladder, out, label, choices)
            half, adds = mirror_half(out, label)
            half_steps += _plan_term(dressing, half, label, choices) + adds
        steps.extend(half_steps)
        terms = [t for t in terms if all(t is not u for u in dressed)]
    for t in terms:
        steps.extend(_plan_term(t, out, label, choices))
    if aliased:
        if not up.accumulate:
            steps.append(Step("zero", target, label=label))
        steps.append(add_step(out, target, 1.0, None, label))
    return steps


def _plan_term(term, out: Ref, label: str, choices: list) -> list:
    spaces = letter_spaces([out] + term_refs(term), label)
    factors = list(term.factors)
    have = set("".join(r.indices for r in factors))
    missing = set(out.indices) - have
    if missing:
        raise ShapeError(f"{label}: output index {''.join(sorted(missing))!r} appears in no factor")
    irrep = 0
    for r in factors:
        irrep ^= r.tensor.irrep
    if irrep != out.tensor.irrep and len(factors) > 0:
        raise ShapeError(f"{label}: the term has irrep {irrep}, the target {out.tensor.irrep}")
    if len(factors) == 2 and term.divisor is None:
        half = symmetric_half(factors, out, term.scale, label)
        if half:
            return half
    steps = []
    order = _best_order(factors, out, term, label, choices)
    while len(factors) > 1:
        i, j = order.pop(0)
        a, b = factors[i], factors[j]
        rest = [f for n, f in enumerate(factors) if n not in (i, j)]
        last = not rest and term.divisor is None
        if last:
            dest, scale = out, term.scale
        else:
            keep = set(out.indices) | set("".join(r.indices for r in rest))
            if term.divisor is not None:
                keep |= set(term.divisor.indices)
            letters = "".join(ch for ch in _ordered_union(a.indices, b.indices) if ch in keep)
            tmp = BlockTensor(tuple(spaces[ch] for ch in letters), a.tensor.irrep ^ b.tensor.irrep, name="tmp")
            dest, scale = Ref(tmp, letters), 1.0
        steps.append(pair_step(a, b, dest, scale, label))
        factors = rest + [dest]
        if last:
            return steps
    steps.append(add_step(factors[0], out, term.scale, term.divisor, label))
    return steps


def _ordered_union(x: str, y: str) -> str:
    return x + "".join(ch for ch in y if ch not in x)


def _best_order(factors, out: Ref, term, label: str, choices: list) -> list:
    """The pair choices (positions in the shrinking factor list, as ``_plan_term`` uses
    them) of the cheapest pairing order: fewest flops, then smallest largest intermediate."""
    if len(factors) < 3:
        return [(0, 1)] if len(factors) == 2 else []
    final = set(out.indices) | set(term.divisor.indices if term.divisor is not None else "")
    ops = [factor_of(r) for r in factors]
    paths = _ranked_orders(tuple(ops), frozenset(final))
    show = " * ".join(f"{op.name}[{op.indices}]" for op in ops)
    choices.append(PathChoice(show, tuple((p[3], p[1], p[2]) for p in paths)))
    return list(paths[0][0])


@lru_cache(maxsize=4096)
def _ranked_orders(ops: tuple, final: frozenset) -> tuple:
    """``_orders`` cheapest first; cached, as the same terms are planned every iteration."""
    return tuple(sorted(_orders(list(ops), final), key=lambda p: (p[1], p[2])))


def _orders(ops: list, final: frozenset) -> list:
    """Every pairing order of ``ops``: (pair choices, flops, largest intermediate, text)."""
    if len(ops) == 1:
        return [((), 0, 0, ops[0].name)]
    out = []
    for i in range(len(ops)):
        for j in range(i + 1, len(ops)):
            a, b = ops[i], ops[j]
            rest = [op for n, op in enumerate(ops) if n not in (i, j)]
            keep = final | set("".join(op.indices for op in rest))
            letters = "".join(ch for ch in _ordered_union(a.indices, b.indices) if ch in keep)
            sp = dict(zip(a.indices, a.spaces)) | dict(zip(b.indices, b.spaces))
            made = Factor(letters, tuple(sp[ch] for ch in letters), a.irrep ^ b.irrep,
                            f"({a.name}[{a.indices}] {b.name}[{b.indices}])")
            flops = _pair_flops(a, b, set(letters))
            elems = allowed_elements(made.spaces, made.irrep) if rest else 0
            for choices, f, m, text in _orders(rest + [made], final):
                out.append((((i, j),) + choices, flops + f, max(elems, m), text))
    return out


def _pair_flops(a: Factor, b: Factor, keep: set) -> int:
    """Flops of one pairwise step on the block structure: the sector GEMMs of a
    contraction, or the dense count of a Hadamard-type product (as the step is run)."""
    if set(a.indices) & set(b.indices) & keep:
        sp = dict(zip(a.indices, a.spaces)) | dict(zip(b.indices, b.spaces))
        return 2 * int(np.prod([sp[ch].dim for ch in sp], dtype=np.float64))
    return sum(s.flops for s in contraction(a, b, frozenset(keep))[3])
