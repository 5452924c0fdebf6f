"""One step of block work and how a pairwise step is made: ``Step`` (a zero, a permuted
and scaled addition, a contraction with its symmetry sectors, a Hadamard-type product, or
an addition through a pair space), ``pair_step`` (a contraction, one GEMM per symmetry
sector, see ``layout``, or a Hadamard-type product), ``add_step``, ``pair_map``, and the
checks of a term's letters. ``plan.planner`` chains them into the steps of a term;
``plan.symmetric`` into the steps of a symmetric result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from tessera.errors import ShapeError
from tessera.expr.terms import Ref
from tessera.plan.layout import Sector, group_irreps, matrix_layout


@dataclass
class Step:
    kind: str                 # "zero" | "add" | "contract" | "hadamard" | "copy"
    out: Ref
    inputs: tuple = ()
    scale: float = 1.0
    divisor: Ref | None = None
    label: str = ""           # the update this step belongs to (from the expression)
    sectors: list = field(default_factory=list)
    perms: dict = field(default_factory=dict)
    pairs: str | None = None  # an "add" through a pair space: "pack" | "unpack_half" | "unpack" | "plus_pack" | ... (tensor.pairs)
    flops: int = 0
    memory: int = 0           # bytes of temporary matrices the step needs

    def bytes_moved(self) -> int:
        """Bytes the step reads and writes: its inputs' stored bytes, and what it adds into
        the output (a contraction: its products). Counted when asked (``tessera plan``),
        not while planning: summing a canonical tensor's blocks costs more than running
        a small step."""
        read = sum(r.tensor.nbytes for r in self.inputs)
        if self.kind == "contract":
            return read + 8 * sum(s.rows.total * s.cols.total for s in self.sectors)
        if self.kind == "add":
            return read + (self.out.tensor.nbytes if self.pairs else read)
        return read

    def describe(self) -> str:
        ins = " * ".join(f"{r.tensor.name or 'tmp'}[{r.indices}]" for r in self.inputs)
        div = f" / {self.divisor.tensor.name}[{self.divisor.indices}]" if self.divisor else ""
        return f"{self.kind:8s} {self.out.tensor.name or 'tmp'}[{self.out.indices}] += {self.scale:+g} {ins}{div}"


@dataclass(frozen=True)
class Factor:
    """A factor during the path search: its letters, spaces and irrep."""

    indices: str
    spaces: tuple
    irrep: int
    name: str


def factor_of(r: Ref) -> Factor:
    return Factor(r.indices, tuple(r.tensor.spaces), r.tensor.irrep, r.tensor.name or "tmp")


@lru_cache(maxsize=4096)
def contraction(a: Factor, b: Factor, keep: frozenset) -> tuple:
    """(a's kept letters, contracted letters, b's kept letters, sectors) of a pairwise
    contraction: one GEMM per irrep of the contracted letters, empty ones left out
    (cached per structure, shared: do not modify)."""
    sp = dict(zip(a.indices, a.spaces)) | dict(zip(b.indices, b.spaces))
    grp = lambda letters: tuple(sp[ch] for ch in letters)  # noqa: E731
    ext_a = tuple(ch for ch in a.indices if ch in keep)
    contr = tuple(ch for ch in a.indices if ch in b.indices)
    ext_b = tuple(ch for ch in b.indices if ch in keep)
    sectors = []
    for g in group_irreps(grp(contr)):
        rows = matrix_layout(grp(ext_a), a.irrep ^ g)
        inner = matrix_layout(grp(contr), g)
        cols = matrix_layout(grp(ext_b), b.irrep ^ g)
        if rows.total and inner.total and cols.total:
            sectors.append(Sector(g, rows, inner, cols))
    return ext_a, contr, ext_b, tuple(sectors)


def term_refs(term) -> list:
    return list(term.factors) + ([term.divisor] if term.divisor is not None else [])


def letter_spaces(refs: list, label: str) -> dict:
    spaces: dict = {}
    for r in refs:
        if len(set(r.indices)) != len(r.indices):
            raise ShapeError(f"{label}: repeated index in {r.indices!r}; diagonals are not supported")
        for ch, sp in zip(r.indices, r.tensor.spaces):
            if spaces.setdefault(ch, sp) != sp:
                raise ShapeError(f"{label}: index {ch!r} is used for spaces {spaces[ch].name!r} and {sp.name!r}")
    return spaces


def add_step(a: Ref, out: Ref, scale: float, divisor, label: str) -> Step:
    if sorted(a.indices) != sorted(out.indices):
        raise ShapeError(f"{label}: {a.indices!r} -> {out.indices!r} is not a permutation; "
                         "an index summed in one factor only must be summed explicitly")
    if divisor is not None and sorted(divisor.indices) != sorted(out.indices):
        raise ShapeError(f"{label}: the denominator's indices {divisor.indices!r} must match {out.indices!r}")
    perms = {"a": tuple(a.indices.index(ch) for ch in out.indices)}
    if divisor is not None:
        perms["d"] = tuple(divisor.indices.index(ch) for ch in out.indices)
    return Step("add", out, (a,), scale, divisor, label, perms=perms, flops=a.tensor.stored_elements)


def pair_map(a: Ref, out: Ref, kind: str, label: str) -> Step:
    return Step("add", out, (a,), 1.0, None, label, perms={"a": tuple(range(a.tensor.ndim))}, pairs=kind)


def pair_step(a: Ref, b: Ref, out: Ref, scale: float, label: str) -> Step:
    sa, sb, so = set(a.indices), set(b.indices), set(out.indices)
    for r, other in ((a, sb), (b, sa)):
        lonely = set(r.indices) - other - so
        if lonely:
            raise ShapeError(f"{label}: index {''.join(sorted(lonely))!r} of {r.tensor.name}[{r.indices}] "
                             "appears in no other factor and not in the output")
    if sa & sb & so:
        return hadamard_step(a, b, out, scale, label)
    ext_a, contr, ext_b, sectors = contraction(factor_of(a), factor_of(b), frozenset(so))
    perms = {
        "a": tuple(a.indices.index(ch) for ch in ext_a + contr),
        "b": tuple(b.indices.index(ch) for ch in contr + ext_b),
        "c": tuple((ext_a + ext_b).index(ch) for ch in out.indices),
    }
    m = sum(8 * (s.rows.total * s.inner.total + s.inner.total * s.cols.total + s.rows.total * s.cols.total)
            for s in sectors)
    return Step("contract", out, (a, b), scale, None, label, sectors=list(sectors), perms=perms,
                flops=sum(s.flops for s in sectors), memory=m)


def hadamard_step(a: Ref, b: Ref, out: Ref, scale: float, label: str) -> Step:
    expr = f"{a.indices},{b.indices}->{out.indices}"
    sizes = {ch: s.dim for r in (a, b) for ch, s in zip(r.indices, r.tensor.spaces)}
    dense = int(np.prod([sizes[ch] for ch in set(a.indices + b.indices)], dtype=np.float64))
    return Step("hadamard", out, (a, b), scale, None, label, perms={"einsum": expr},
                flops=2 * dense)
