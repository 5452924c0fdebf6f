"""Results with a pair symmetry (a target stored as canonical blocks, e.g. R2[ijab] =
R2[jiba]): the check that an update has the target's symmetry
(``check_symmetric_update``), the contraction on the canonical pairs only
(``symmetric_half``: CCSD's ladder on i <= j), its symmetric/antisymmetric form over the
virtual pairs with the t1 dressing (``_plus_minus_steps``, ``dressed_ladder``), a term
computed once and added with its mirror image (``mirror_half``), the pair packs a plan
shares between its terms (``pair_packs``) and the switch to distributed plans
(``distributed_plans``). ``plan.planner`` calls them while it plans an update.
"""

from __future__ import annotations

import contextvars
import itertools
from contextlib import contextmanager

import numpy as np

from tessera.errors import ShapeError
from tessera.expr.terms import Ref, Term
from tessera.plan.steps import Step, add_step, letter_spaces, pair_map, pair_step, term_refs
from tessera.tensor.block_tensor import BlockTensor, symmetry_group
from tessera.tensor.pairs import pair_space, plus_minus, plus_minus_last


# the pair packs made so far by the plan being made (``plan.planner.plan_updates``, ``pair_packs``): (source tensor's id,
# kind, pair space) -> (source, packed tensor)
_PACKS: contextvars.ContextVar = contextvars.ContextVar("tessera_packs", default=None)


@contextmanager
def pair_packs():
    """The pair packs of one plan, made anew for it (``plan.planner.plan_updates``): the
    dict, (source tensor's id, kind, pair space) -> (source, packed tensor)."""
    token = _PACKS.set({})
    try:
        yield _PACKS.get()
    finally:
        _PACKS.reset(token)


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


def symmetric_half(factors, out: Ref, scale: float, label: str, dressing=None) -> list:
    """Steps that compute a contraction on the canonical pairs only, or [] when the rule
    does not apply. It applies when the target declares a symmetry ``sym`` swapping its
    first two axes (one space, e.g. R2[ijab] = R2[jiba]), one factor F carries those two
    letters first (tau[ijcd]), and the declared symmetries of both factors prove the term
    itself symmetric under ``sym`` (``_equal_terms``: a renaming of the summed letters maps
    each factor onto itself). Then F is packed to its pairs i <= j, contracted (half the GEMM rows),
    and the result R is added to the target: the ladder of closed-shell CCSD at
    o(o+1)/2 v^4 instead of o^2 v^4 (PySCF's packed ``_add_vvvv``). A local target takes
    R and its mirror image by ``sym`` in one ``unpack`` step (each target element read
    from its pair, once); a distributed one, and a target planned on structure alone for
    a distributed run (``distributed_plans``: the steps it runs, which the cost model
    counts), takes a half H (pairs i < j and half of i = j, ``unpack_half``) and H plus
    its transpose by ``sym``, two adds. With a
    ``dressing`` term (``dressed_ladder``) it applies only in the +/- form, which then
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
            steps = [] if shared else [pair_map(F, packed, "pack", label)]
            steps += pm or [pair_step(*pair, result, scale, label)]
            if local:      # one pass adds the pairs and their mirror images to the target
                return steps + [Step("add", out, (result,), 1.0, None, label, pairs="unpack",
                                     perms={"a": tuple(range(result.tensor.ndim)), "sym": sym})]
            half = Ref(BlockTensor(t.spaces, t.irrep, name="half", placement=t.placement), out.indices)
            return steps + [pair_map(result, half, "unpack_half", label),
                            add_step(half, out, 1.0, None, label),
                            add_step(Ref(half.tensor, "".join(out.indices[sym[k]] for k in range(len(sym)))),
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
    local; its mirror image is the update's other dressing term, ``dressed_ladder``)
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
        steps += ([] if shared else [pair_map(X, packed, f"{sign}_pack", label)]) + [
                  pair_step(*pair, product, scale, label),
                  pair_map(product, R, f"{sign}_unpack", label)]
        if dress is not None:
            h, hl, t, k, x, y = dress
            m = plus_minus_last(h, tuple(hl.index(ch) for ch in k + y + c + d))[sign == "minus"]
            sk = Ref(BlockTensor((R.tensor.spaces[0], m.spaces[0], m.spaces[1]), X.tensor.irrep ^ h.irrep,
                                 name="tmp"), p + k + y)
            steps.append(pair_step(packed, Ref(m, k + y + C), sk, 1.0, label))
            made.append(sk)
    if dress is None:
        return steps
    h, hl, t, k, x, y = dress
    (plus, minus), spaces, irrep = made, made[0].tensor.spaces, made[0].tensor.irrep
    both, diff = (Ref(BlockTensor(spaces, irrep, name=name), p + k + y) for name in ("tmp_sum", "tmp_diff"))
    return steps + [add_step(plus, both, 1.0, None, label), add_step(minus, both, 1.0, None, label),
                    add_step(plus, diff, 1.0, None, label), add_step(minus, diff, -1.0, None, label),
                    pair_step(t, both, R, dressing.scale, label),
                    pair_step(Ref(t.tensor, t.indices.replace(x, y)), Ref(diff.tensor, p + k + x), R,
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


def dressed_ladder(terms: list, out: Ref, label: str):
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
                    letter_spaces([out] + term_refs(term), label)
                    if np.bitwise_xor.reduce([r.tensor.irrep for r in term.factors]) != out.tensor.irrep:
                        raise ShapeError(f"{label}: a term's irrep differs from the target's {out.tensor.irrep}")
                return ladder, dress[0], dress[1]
    return None


def mirror_half(out: Ref, label: str) -> tuple:
    """(H, steps) for a term and its mirror image by ``out``'s pair symmetry: the term is
    computed once into the temporary H (every i, j; the caller plans it), then ``steps``
    add H and its mirror image to ``out``."""
    t = out.tensor
    sym = next(tuple(ps.perm) for ps in t.symmetry if ps.sign == 1 and tuple(ps.perm)[:2] == (1, 0))
    half = Ref(BlockTensor(t.spaces, t.irrep, name="half", placement=t.placement), out.indices)
    mirror = Ref(half.tensor, "".join(out.indices[sym[k]] for k in range(len(sym))))
    return half, [add_step(half, out, 1.0, None, label), add_step(mirror, out, 1.0, None, label)]


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


def check_symmetric_update(terms: list, out: Ref, label: str) -> None:
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
