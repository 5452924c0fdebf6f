"""Compile recorded updates into steps of block work, with their flops, bytes and memory.

Each term ``s * A * B * ... [/ D]`` becomes a chain of pairwise steps: contractions
(one GEMM per symmetry sector, see ``layout``), Hadamard-type products (indices shared
by both factors and the output, block by block), and permuted, scaled additions. Factors
are combined greedily, cheapest pair first, through intermediates that hold only the
indices still needed. The pairing order of a term is cost-optimal: every order is
costed on the block-sparse structure it will run (sector GEMM flops, then the largest
intermediate), and the cheapest is taken (exhaustive search; terms have few factors).
Only symmetry-allowed block combinations appear. A target stored as canonical blocks
(``BlockTensor(canonical=True)``) is written at its canonical blocks only, after a check
that the update has the target's symmetry (``_check_symmetric_update``).
"""

from __future__ import annotations

import contextvars
import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from tessera.errors import ShapeError
from tessera.expr.terms import Ref, Term, Update
from tessera.plan.layout import Sector, group_irreps, matrix_layout
from tessera.tensor.block_tensor import BlockTensor, allowed_elements, symmetry_group
from tessera.tensor.pairs import pair_space, plus_minus, plus_minus_last


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
    packs: dict = {}
    token = _PACKS.set(packs)
    try:
        for up in updates:
            label = up.describe()
            labels.append(label)
            steps.extend(_plan_update(up, label, choices))
            # a tensor this update wrote is packed anew by the terms after it
            for key in [k for k, (source, _) in packs.items() if source is up.target.tensor]:
                del packs[key]
    finally:
        _PACKS.reset(token)
    return Plan(steps, labels, choices)


# the pair packs made so far by the plan being made (``plan_updates``): (source tensor's id,
# kind, pair space) -> (source, packed tensor)
_PACKS: contextvars.ContextVar = contextvars.ContextVar("tessera_packs", default=None)


def _pack_of(source: BlockTensor, kind: str, space, make) -> tuple:
    """(the tensor that packs ``source`` by ``kind`` into ``space``'s pairs, whether a term
    before it in this plan made it): a local plan packs an unchanged tensor once for all
    its terms (CCSD's tau: its pairs i <= j and their +/- halves over a <= b, once for
    Woooo's ovov tau and the ladder, not twice: glycine cc-pVDZ, three o^2 v^2 / 2 passes
    fewer per iteration). ``make()`` makes the empty packed tensor."""
    packs = _PACKS.get()
    if packs is None or source.dist is not None or plans_distributed():
        return make(), False
    key = (id(source), kind, space)
    if key in packs:
        return packs[key][1], True
    packed = make()
    packs[key] = (source, packed)       # the source held: its id names no other tensor meanwhile
    return packed, False


def _drop_pack(packed: BlockTensor) -> None:
    """Forget ``packed`` (of ``_pack_of``) where no step is planned to make it."""
    packs = _PACKS.get() or {}
    for key in [k for k, (_, p) in packs.items() if p is packed]:
        del packs[key]


# ------------------------------------------------------------------------- updates
def _plan_update(up: Update, label: str, choices: list) -> list:
    target = up.target
    terms = up.expr.terms()
    if target.tensor.aliases:
        _check_symmetric_update(terms, target, label)
    aliased = any(r.tensor is target.tensor for t in terms for r in _refs(t))
    out = target
    steps = []
    if aliased:     # compute into a fresh tensor, then move it into the target
        out = Ref(target.tensor.like("tmp"), target.indices)
    elif not up.accumulate:
        steps.append(Step("zero", target, label=label))
    dressed = _dressed_ladder(terms, out, label)
    if dressed:
        ladder, dressing, twin = dressed
        steps.extend(_symmetric_half(ladder.factors, out, ladder.scale, label, dressing)
                     or _plan_term(ladder, out, label, choices) + _mirror_pair(dressing, out, label, choices))
        terms = [t for t in terms if all(t is not u for u in dressed)]
    for t in terms:
        steps.extend(_plan_term(t, out, label, choices))
    if aliased:
        if not up.accumulate:
            steps.append(Step("zero", target, label=label))
        steps.append(_add_step(out, target, 1.0, None, label))
    return steps


def _refs(term) -> list:
    return list(term.factors) + ([term.divisor] if term.divisor is not None else [])


def _letter_spaces(refs: list, label: str) -> dict:
    spaces: dict = {}
    for r in refs:
        if len(set(r.indices)) != len(r.indices):
            raise ShapeError(f"{label}: repeated index in {r.indices!r}; diagonals are not supported")
        for ch, sp in zip(r.indices, r.tensor.spaces):
            if spaces.setdefault(ch, sp) != sp:
                raise ShapeError(f"{label}: index {ch!r} is used for spaces {spaces[ch].name!r} and {sp.name!r}")
    return spaces


def _plan_term(term, out: Ref, label: str, choices: list) -> list:
    spaces = _letter_spaces([out] + _refs(term), label)
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
        half = _symmetric_half(factors, out, term.scale, label)
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
        steps.append(_pair_step(a, b, dest, scale, label))
        factors = rest + [dest]
        if last:
            return steps
    steps.append(_add_step(factors[0], out, term.scale, term.divisor, label))
    return steps


def _ordered_union(x: str, y: str) -> str:
    return x + "".join(ch for ch in y if ch not in x)


@dataclass(frozen=True)
class _Operand:
    """A factor during the path search: its letters, spaces and irrep."""

    indices: str
    spaces: tuple
    irrep: int
    name: str


def _best_order(factors, out: Ref, term, label: str, choices: list) -> list:
    """The pair choices (positions in the shrinking factor list, as ``_plan_term`` uses
    them) of the cheapest pairing order: fewest flops, then smallest largest intermediate."""
    if len(factors) < 3:
        return [(0, 1)] if len(factors) == 2 else []
    final = set(out.indices) | set(term.divisor.indices if term.divisor is not None else "")
    ops = [_operand(r) for r in factors]
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
            made = _Operand(letters, tuple(sp[ch] for ch in letters), a.irrep ^ b.irrep,
                            f"({a.name}[{a.indices}] {b.name}[{b.indices}])")
            flops = _pair_flops(a, b, set(letters))
            elems = allowed_elements(made.spaces, made.irrep) if rest else 0
            for choices, f, m, text in _orders(rest + [made], final):
                out.append((((i, j),) + choices, flops + f, max(elems, m), text))
    return out


def _pair_flops(a: _Operand, b: _Operand, keep: set) -> int:
    """Flops of one pairwise step on the block structure: the sector GEMMs of a
    contraction, or the dense count of a Hadamard-type product (as the step is run)."""
    if set(a.indices) & set(b.indices) & keep:
        sp = dict(zip(a.indices, a.spaces)) | dict(zip(b.indices, b.spaces))
        return 2 * int(np.prod([sp[ch].dim for ch in sp], dtype=np.float64))
    return sum(s.flops for s in _contraction(a, b, frozenset(keep))[3])


def _operand(r: Ref) -> _Operand:
    return _Operand(r.indices, tuple(r.tensor.spaces), r.tensor.irrep, r.tensor.name or "tmp")


@lru_cache(maxsize=4096)
def _contraction(a: _Operand, b: _Operand, keep: frozenset) -> tuple:
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


# ------------------------------------------------------------------------- steps
def _add_step(a: Ref, out: Ref, scale: float, divisor, label: str) -> Step:
    if sorted(a.indices) != sorted(out.indices):
        raise ShapeError(f"{label}: {a.indices!r} -> {out.indices!r} is not a permutation; "
                         "an index summed in one factor only must be summed explicitly")
    if divisor is not None and sorted(divisor.indices) != sorted(out.indices):
        raise ShapeError(f"{label}: the denominator's indices {divisor.indices!r} must match {out.indices!r}")
    perms = {"a": tuple(a.indices.index(ch) for ch in out.indices)}
    if divisor is not None:
        perms["d"] = tuple(divisor.indices.index(ch) for ch in out.indices)
    return Step("add", out, (a,), scale, divisor, label, perms=perms, flops=a.tensor.stored_elements)


# ------------------------------------------------------------------------- symmetric results
def _symmetric_half(factors, out: Ref, scale: float, label: str, dressing=None) -> list:
    """Steps that compute a contraction on the canonical pairs only, or [] when the rule
    does not apply. It applies when the target declares a symmetry ``sym`` swapping its
    first two axes (one space, e.g. R2[ijab] = R2[jiba]), one factor F carries those two
    letters first (tau[ijcd]), and the declared symmetries of both factors prove the term
    itself symmetric under ``sym`` (``_equal_terms``: a renaming of the summed letters maps
    each factor onto itself). Then F is packed to its pairs i <= j, contracted (half the GEMM rows),
    and the result R is added to the target: the ladder of closed-shell CCSD at
    o(o+1)/2 v^4 instead of o^2 v^4 (PySCF's packed ``_add_vvvv``). A local target takes
    R and its mirror image by ``sym`` in one ``unpack`` step (each target element read
    from its pair, once); a distributed one takes a half H (pairs i < j and half of
    i = j, ``unpack_half``) and H plus its transpose by ``sym``, two adds. With a
    ``dressing`` term (``_dressed_ladder``) it applies only in the +/- form, which then
    takes the dressing too (``_plus_minus_steps``)."""
    t = out.tensor
    if t.spaces[0] != t.spaces[1] or len(set(out.indices)) != len(out.indices):
        return []
    for ps in t.symmetry:
        sym = tuple(ps.perm)
        if ps.sign != 1 or sym[:2] != (1, 0) or any(sym[sym[k]] != k for k in range(len(sym))):
            continue
        for n, F in enumerate(factors):
            G = factors[1 - n]
            if F.indices[:2] != out.indices[:2] or set(F.indices[:2]) & set(G.indices):
                continue
            items = _items(Term(factors, scale))
            if not _equal_terms(_mirror(items, out, sym), items, set(out.indices)):
                continue
            pairs = pair_space(t.spaces[0])
            used = F.indices + G.indices + out.indices + "".join(r.indices for r in (dressing.factors if dressing else ()))
            p = next(ch for ch in "PQXYZpqxyz" if ch not in used)
            packed_t, shared = _pack_of(F.tensor, "pack", pairs, lambda: BlockTensor(
                (pairs,) + F.tensor.spaces[2:], F.tensor.irrep, name="pairs"))
            packed = Ref(packed_t, p + F.indices[2:])
            result = Ref(BlockTensor((pairs,) + t.spaces[2:], t.irrep, name="pairs"), p + out.indices[2:])
            # a G that changes (tau of R2 += Woooo tau) is gathered anew at every run of a
            # local plan: as the second factor its letters stay in its own order (kl, ab), a
            # copy without a transpose; distributed plans (and the cost model's) keep G first
            local = t.dist is None and not plans_distributed()
            pair = (packed, G) if local and not G.tensor.constant else (G, packed)
            pm = _plus_minus_steps(G, packed, result, scale, label, dressing)
            if dressing is not None and not pm:
                _drop_pack(packed_t)        # planned otherwise: nothing made it
                return []
            steps = [] if shared else [_pair_map(F, packed, "pack", label)]
            steps += pm or [_pair_step(*pair, result, scale, label)]
            if t.dist is None:      # local: one pass adds the pairs and their mirror images to the target
                return steps + [Step("add", out, (result,), 1.0, None, label, pairs="unpack",
                                     perms={"a": tuple(range(result.tensor.ndim)), "sym": sym})]
            half = Ref(BlockTensor(t.spaces, t.irrep, name="half", placement=t.placement), out.indices)
            return steps + [_pair_map(result, half, "unpack_half", label),
                            _add_step(half, out, 1.0, None, label),
                            _add_step(Ref(half.tensor, "".join(out.indices[sym[k]] for k in range(len(sym)))),
                                      out, 1.0, None, label)]
    return []


# False while planning on structure alone for a distributed run (``distributed_plans``):
# its executors run the ladder on the pairs i <= j only, and the plans must count that
_PLUS_MINUS = contextvars.ContextVar("tessera_plus_minus", default=True)


@contextmanager
def distributed_plans(distributed: bool = True):
    """Plans made inside are those of a distributed run (the ladder without the +/- form,
    ``_plus_minus_steps``), though their tensors are local: the cost model's structure plans."""
    token = _PLUS_MINUS.set(not distributed)
    try:
        yield
    finally:
        _PLUS_MINUS.reset(token)


def plans_distributed() -> bool:
    """Whether plans made now are those of a distributed run (``distributed_plans``)."""
    return not _PLUS_MINUS.get()


def _plus_minus_steps(G: Ref, X: Ref, R: Ref, scale: float, label: str, dressing=None) -> list:
    """R[Pab] += scale * G[..] X[Pcd] (G over a, b, c, d in any order) in the symmetric/
    antisymmetric form over the virtual pairs a <= b, c <= d (``tensor.pairs.plus_minus``:
    Scuseria, Janssen, Schaefer, J. Chem. Phys. 89, 7382 (1988); PySCF ``_add_vvvv``):
    X packed to X+ and X-, two GEMMs with V+ and V- (about half the multiply-adds of
    one with G), unpacked into R; or [] when the rule does not apply. It applies when G
    is frozen and local (V+- are made from it once and kept), R and X are local, a, b
    share a space, c, d share a space, and G's declared symmetry gives G[abcd] = G[badc]
    (e.g. the ladder's (ac|bd) = (bd|ac)); V+- are stored as canonical halves when it
    also gives the swap of (ab) with (cd) ((ac|bd) = (ca|db), real orbitals).

    A ``dressing`` term s' H[k y c d] t[k x] X[ijcd] ({x, y} = {a, b}, H frozen and
    local; its mirror image is the update's other dressing term, ``_dressed_ladder``)
    makes the operand G + s'(H t + its mirror), the t1-dressed ladder W[acbd] =
    (ac|bd) - t_ka (kc|bd) - t_kb (ac|kd) of closed-shell CCSD. It is applied to the
    packed X+- of the ladder, not to V+- (no v^4 operand made per iteration): S^s[P, k, y]
    = sum_cd M^s[k, y, cd] X^s[P, cd] (M+- of H, ``tensor.pairs.plus_minus_last``), then
    R[Pab] += sum_s (s' t[k x] S^s[P k y] + s s' t[k y] S^s[P k x]) = s' t[k x] (S+ + S-)[P k y]
    + s' t[k y] (S+ - S-)[P k x]: the term and its mirror at 2 x 2 o(o+1)/2 v(v+1)/2 o v
    flops (about o^3 v^3, half of the pair of terms as (H X) t on all i, j), the rest
    o^3 v^2 in two products with t, each a pass over R's pairs (the sum and difference of
    S+- are o^2 v^2 / 2, R's pairs o^2 v^2 / 2 x v)."""
    g = G.tensor
    if not _PLUS_MINUS.get() or not g.constant or any(t.dist is not None for t in (g, X.tensor, R.tensor)) or g.ndim != 4:
        return []
    (a, b), (c, d) = R.indices[1:], X.indices[1:]
    if len(R.indices) != 3 or len(X.indices) != 3 or sorted(G.indices) != sorted(a + b + c + d):
        return []
    sp = dict(zip(G.indices, g.spaces))
    if sp[a] != sp[b] or sp[c] != sp[d]:
        return []
    same = _equal_strings(g, G.indices)
    rename = lambda m: "".join(m.get(ch, ch) for ch in G.indices)  # noqa: E731
    if rename({a: b, b: a, c: d, d: c}) not in same:
        return []
    symmetric = sp[a] == sp[c] and rename({a: c, c: a, b: d, d: b}) in same
    dress = _dressing_operands(dressing, R, X) if dressing is not None else None
    if dressing is not None and dress is None:
        return []
    vp, vm = plus_minus(g, tuple(G.indices.index(ch) for ch in a + b + c + d), symmetric)
    used = R.indices + X.indices + G.indices + "".join(r.indices for r in (dressing.factors if dressing else ()))
    A, C = [ch for ch in "XYZxyz" if ch not in used][:2]
    p = R.indices[0]
    # the GEMM's rows are the fewer pairs: OpenBLAS runs glycine's ladder (2850 virtual
    # pairs, 210 occupied) as X+- @ V+- (210 rows) at 54-58 GFLOP/s of one core's CPU, as
    # V+- @ X+-^T (2850 rows) at 40-42 (1 thread, 2850 x 2850 x 210, numpy.matmul)
    x_rows = R.tensor.spaces[0].dim < vp.spaces[0].dim
    steps, made = [], []
    for v, sign in ((vp, "plus"), (vm, "minus")):
        packed_t, shared = _pack_of(X.tensor, f"{sign}_pack", vp.spaces[1], lambda: BlockTensor(
            (X.tensor.spaces[0], vp.spaces[1]), X.tensor.irrep, name=f"x{sign}"))
        packed = Ref(packed_t, p + C)
        product = Ref(BlockTensor((R.tensor.spaces[0], vp.spaces[0]), R.tensor.irrep, name=f"r{sign}"), p + A)
        pair = (packed, Ref(v, A + C)) if x_rows else (Ref(v, A + C), packed)
        steps += ([] if shared else [_pair_map(X, packed, f"{sign}_pack", label)]) + [
                  _pair_step(*pair, product, scale, label),
                  _pair_map(product, R, f"{sign}_unpack", label)]
        if dress is not None:
            h, hl, t, k, x, y = dress
            m = plus_minus_last(h, tuple(hl.index(ch) for ch in k + y + c + d))[sign == "minus"]
            sk = Ref(BlockTensor((R.tensor.spaces[0], m.spaces[0], m.spaces[1]), X.tensor.irrep ^ h.irrep,
                                 name="tmp"), p + k + y)
            steps.append(_pair_step(packed, Ref(m, k + y + C), sk, 1.0, label))
            made.append(sk)
    if dress is None:
        return steps
    h, hl, t, k, x, y = dress
    (plus, minus), spaces, irrep = made, made[0].tensor.spaces, made[0].tensor.irrep
    both, diff = (Ref(BlockTensor(spaces, irrep, name=name), p + k + y) for name in ("tmp_sum", "tmp_diff"))
    return steps + [_add_step(plus, both, 1.0, None, label), _add_step(minus, both, 1.0, None, label),
                    _add_step(plus, diff, 1.0, None, label), _add_step(minus, diff, -1.0, None, label),
                    _pair_step(t, both, R, dressing.scale, label),
                    _pair_step(Ref(t.tensor, t.indices.replace(x, y)), Ref(diff.tensor, p + k + x), R,
                               dressing.scale, label)]


def _dressing_operands(term, R: Ref, X: Ref):
    """(H, H's letters, t, k, x, y) of a dressing term s' H[k y c d] t[k x] F[ijcd] of the
    +/- ladder R[Pab] += G X[Pcd] (``_plus_minus_steps``), or None when the term is not
    of that form (H frozen and local, t of two letters, k summed: in neither R nor F,
    {x, y} = {a, b})."""
    (a, b), (c, d) = R.indices[1:], X.indices[1:]
    hs = [r for r in term.factors if r.tensor.ndim == 4 and set(r.indices) & {a, b}]    # not F[ijcd]
    ts = [r for r in term.factors if r.tensor.ndim == 2]
    if len(term.factors) != 3 or len(hs) != 1 or len(ts) != 1:
        return None
    H, t = hs[0], ts[0]
    F = next(r for r in term.factors if r is not H and r is not t)        # F[ijcd]: k is not i or j
    k = next((ch for ch in t.indices if ch not in a + b + F.indices), None)
    x = next((ch for ch in t.indices if ch in a + b), None)
    y = b if x == a else a
    if k is None or x is None or sorted(H.indices) != sorted(k + y + c + d) or not H.tensor.constant \
            or H.tensor.dist is not None or t.tensor.dist is not None:
        return None
    return H.tensor, H.indices, t, k, x, y


def _dressed_ladder(terms: list, out: Ref, label: str):
    """(ladder, dressing, twin) of an update R[ijab] += G[..] F[ijcd] + s' H[..] t[..]
    F[ijcd] + (its mirror image by R's pair symmetry, the twin), the t1-dressed ladder
    of closed-shell CCSD (``_plus_minus_steps``); or None. Planned in the +/- form when
    that applies, else as the ladder and the dressing computed once and added with its
    mirror image (``_mirror_pair``): the same terms, one choice made by the planner."""
    sym = next((tuple(ps.perm) for ps in out.tensor.symmetry if ps.sign == 1 and tuple(ps.perm)[:2] == (1, 0)), None)
    if sym is None:
        return None
    for ladder in terms:
        if len(ladder.factors) != 2 or ladder.divisor is not None:
            continue
        for F in ladder.factors:
            if F.indices[:2] != out.indices[:2]:
                continue
            dress = [t for t in terms if len(t.factors) == 3 and t.divisor is None
                     and any(r.tensor is F.tensor and r.indices == F.indices for r in t.factors)]
            if len(dress) == 2 and dress[0].scale == dress[1].scale and \
                    _equal_terms(_mirror(_items(dress[0]), out, sym), _items(dress[1]), set(out.indices)):
                for term in (ladder, dress[0]):         # the checks of _plan_term: letters, irreps
                    _letter_spaces([out] + _refs(term), label)
                    if np.bitwise_xor.reduce([r.tensor.irrep for r in term.factors]) != out.tensor.irrep:
                        raise ShapeError(f"{label}: a term's irrep differs from the target's {out.tensor.irrep}")
                return ladder, dress[0], dress[1]
    return None


def _mirror_pair(term, out: Ref, label: str, choices: list) -> list:
    """Steps of a term and its mirror image by ``out``'s pair symmetry: the term computed
    once into a temporary H (every i, j), then H and its mirror image added to ``out``."""
    t = out.tensor
    sym = next(tuple(ps.perm) for ps in t.symmetry if ps.sign == 1 and tuple(ps.perm)[:2] == (1, 0))
    half = Ref(BlockTensor(t.spaces, t.irrep, name="half", placement=t.placement), out.indices)
    mirror = Ref(half.tensor, "".join(out.indices[sym[k]] for k in range(len(sym))))
    return _plan_term(term, half, label, choices) + [_add_step(half, out, 1.0, None, label),
                                                      _add_step(mirror, out, 1.0, None, label)]


def _pair_map(a: Ref, out: Ref, kind: str, label: str) -> Step:
    return Step("add", out, (a,), 1.0, None, label, perms={"a": tuple(range(a.tensor.ndim))}, pairs=kind)


def _items(term) -> list:
    """A term's factors (kind 0) and divisor (kind 1) as (kind, tensor, letters)."""
    out = [(0, r.tensor, r.indices) for r in term.factors]
    return out + ([(1, term.divisor.tensor, term.divisor.indices)] if term.divisor is not None else [])


def _mirror(items: list, out: Ref, perm: tuple) -> list:
    """``items`` with the output letters renamed by the target symmetry ``perm``."""
    rename = {out.indices[k]: out.indices[perm[k]] for k in range(len(perm))}
    return [(kind, t, "".join(rename.get(ch, ch) for ch in letters)) for kind, t, letters in items]


def _equal_terms(xs: list, ys: list, external: set) -> bool:
    """Whether the products ``xs`` and ``ys`` (``_items``) are equal as tensors over the
    ``external`` letters, given the factors' declared symmetries: some renaming of the
    summed letters and some matching of the factors (same tensor) maps each factor of
    ``xs`` onto an index string its symmetry group makes equal to its partner's."""
    if len(xs) != len(ys):
        return False
    sx = sorted({ch for _, _, s in xs for ch in s} - external)
    sy = sorted({ch for _, _, s in ys for ch in s} - external)
    if len(sx) != len(sy):
        return False
    for image in itertools.permutations(sy):
        ren = dict(zip(sx, image))
        if _match([(k, t, "".join(ren.get(ch, ch) for ch in s)) for k, t, s in xs], ys):
            return True
    return False


def _match(xs: list, ys: list) -> bool:
    if not xs:
        return True
    kind, t, s = xs[0]
    return any(k == kind and u is t and s in _equal_strings(u, letters) and _match(xs[1:], ys[:n] + ys[n + 1:])
               for n, (k, u, letters) in enumerate(ys))


def _equal_strings(tensor, letters: str) -> set:
    """Index strings under which ``tensor`` has the same values (its symmetry group)."""
    return {"".join(letters[g[k]] for k in range(len(g)))
            for g in symmetry_group(tuple(tensor.symmetry), tensor.ndim)}


def _check_symmetric_update(terms: list, out: Ref, label: str) -> None:
    """A target stored as canonical blocks (``canonical=True``) receives its canonical
    blocks only, which is exact when the update's sum has the target's symmetry: under
    each declared symmetry every term is symmetric itself (a product of symmetric
    factors, or factors swapped into each other) or its mirror image is another term of
    the update with the same scale (X + X^T written explicitly). Anything else is refused."""
    external = set(out.indices)
    for ps in out.tensor.symmetry:
        if ps.sign != 1:
            continue
        free = [(term.scale, _items(term)) for term in terms]
        for term in terms:
            image = _mirror(_items(term), out, tuple(ps.perm))
            n = next((n for n, (scale, items) in enumerate(free)
                      if scale == term.scale and _equal_terms(image, items, external)), None)
            if n is None:
                text = " * ".join(f"{t.name}[{s}]" for _, t, s in _items(term))
                raise ShapeError(f"{label}: {out.tensor.name!r} stores canonical blocks only and is "
                                 f"symmetric under {tuple(ps.perm)}, but the term {term.scale:+g} {text} is "
                                 "not, and its mirror image is not in the update; add the mirror term "
                                 "(X + X^T) or make the target canonical=False")
            free.pop(n)


def _pair_step(a: Ref, b: Ref, out: Ref, scale: float, label: str) -> Step:
    sa, sb, so = set(a.indices), set(b.indices), set(out.indices)
    for r, other in ((a, sb), (b, sa)):
        lonely = set(r.indices) - other - so
        if lonely:
            raise ShapeError(f"{label}: index {''.join(sorted(lonely))!r} of {r.tensor.name}[{r.indices}] "
                             "appears in no other factor and not in the output")
    if sa & sb & so:
        return _hadamard_step(a, b, out, scale, label)
    ext_a, contr, ext_b, sectors = _contraction(_operand(a), _operand(b), frozenset(so))
    perms = {
        "a": tuple(a.indices.index(ch) for ch in ext_a + contr),
        "b": tuple(b.indices.index(ch) for ch in contr + ext_b),
        "c": tuple((ext_a + ext_b).index(ch) for ch in out.indices),
    }
    m = sum(8 * (s.rows.total * s.inner.total + s.inner.total * s.cols.total + s.rows.total * s.cols.total)
            for s in sectors)
    return Step("contract", out, (a, b), scale, None, label, sectors=list(sectors), perms=perms,
                flops=sum(s.flops for s in sectors), memory=m)


def _hadamard_step(a: Ref, b: Ref, out: Ref, scale: float, label: str) -> Step:
    expr = f"{a.indices},{b.indices}->{out.indices}"
    sizes = {ch: s.dim for r in (a, b) for ch, s in zip(r.indices, r.tensor.spaces)}
    dense = int(np.prod([sizes[ch] for ch in set(a.indices + b.indices)], dtype=np.float64))
    return Step("hadamard", out, (a, b), scale, None, label, perms={"einsum": expr},
                flops=2 * dense)
