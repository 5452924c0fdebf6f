"""The equation language: ``R2["ijab"] += W["abcd"] * tau["ijcd"]``.

``T["ijab"]`` is a ``Ref`` (a tensor with index letters). Products of refs and scalars
are ``Term``s, sums of terms are ``Sum``s; ``+=``, ``-=`` and ``=`` on a tensor record an
``Update``. Updates made inside ``with tessera.equations():`` are planned and executed
together when the block ends; outside such a block each update runs at once. Nothing here
loops over blocks: that is the planner's and the executors' job.
"""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from tessera.errors import ShapeError


class Expr(ABC):
    """Anything that can be added and scaled: a Ref, a Term or a Sum."""

    @abstractmethod
    def terms(self) -> list:
        """The expression as a flat list of Terms."""

    def __add__(self, other):
        return Sum(self.terms() + _as_expr(other).terms())

    def __sub__(self, other):
        return Sum(self.terms() + (-_as_expr(other)).terms())

    def __neg__(self):
        return Sum([t.scaled(-1.0) for t in self.terms()])

    def __rmul__(self, scalar):
        return self.__mul__(scalar)

    def __mul__(self, other):
        if _is_scalar(other):
            return Sum([t.scaled(float(other)) for t in self.terms()])
        other = _as_expr(other)
        return Sum([Term(a.factors + b.factors, a.scale * b.scale, _join_div(a.divisor, b.divisor))
                    for a in self.terms() for b in other.terms()])

    def __truediv__(self, other):
        if _is_scalar(other):
            return self * (1.0 / float(other))
        if not isinstance(other, Ref):
            raise ShapeError("only a single tensor (e.g. a denominator D['ijab']) can divide a term")
        return Sum([Term(t.factors, t.scale, _join_div(t.divisor, other)) for t in self.terms()])


@dataclass(frozen=True, eq=False)
class Ref(Expr):
    """A tensor with one index letter per axis."""

    tensor: object
    indices: str

    def __post_init__(self):
        if len(self.indices) != self.tensor.ndim:
            raise ShapeError(f"tensor {self.tensor.name!r} has {self.tensor.ndim} indices, "
                             f"got the index string {self.indices!r}")

    def terms(self) -> list:
        return [Term([self], 1.0, None)]

    def __iadd__(self, value):
        record(Update(self, _as_expr(value), accumulate=True))
        return _Recorded(self)

    def __isub__(self, value):
        record(Update(self, -_as_expr(value), accumulate=True))
        return _Recorded(self)


@dataclass(frozen=True)
class Term(Expr):
    """scale * prod(factors) [/ divisor]."""

    factors: list
    scale: float
    divisor: Ref | None = None

    def terms(self) -> list:
        return [self]

    def scaled(self, s: float) -> "Term":
        return Term(self.factors, self.scale * s, self.divisor)

    @property
    def letters(self) -> str:
        return ",".join(r.indices for r in self.factors)


@dataclass(frozen=True)
class Sum(Expr):
    items: list = field(default_factory=list)

    def terms(self) -> list:
        return list(self.items)


@dataclass(frozen=True)
class Update:
    """target (+)= expr."""

    target: Ref
    expr: Expr
    accumulate: bool

    def describe(self) -> str:
        op = "+=" if self.accumulate else "="
        parts = []
        for t in self.expr.terms():
            f = " * ".join(f"{r.tensor.name or '?'}[{r.indices}]" for r in t.factors)
            d = f" / {t.divisor.tensor.name}[{t.divisor.indices}]" if t.divisor is not None else ""
            parts.append(f"{t.scale:+g} {f}{d}")
        return f"{self.target.tensor.name or '?'}[{self.target.indices}] {op} " + " ".join(parts)


class _Recorded:
    """Returned by ``Ref.__iadd__`` so that the tensor's ``__setitem__`` knows it is done."""

    def __init__(self, ref: Ref):
        self.ref = ref


def _is_scalar(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) or type(x).__name__ in ("float64", "int64")


def _as_expr(x) -> Expr:
    if isinstance(x, Expr):
        return x
    raise ShapeError(f"cannot use a {type(x).__name__} in a tensor expression; expected T['ij'] terms")


def _join_div(a, b):
    if a is not None and b is not None:
        raise ShapeError("a term can be divided by one denominator tensor only")
    return a if a is not None else b


# --------------------------------------------------------------------- recording
_batch: contextvars.ContextVar = contextvars.ContextVar("tessera_batch", default=None)
_runner = None     # runs a list of updates on the current context; set by the backends


def set_runner(run) -> None:
    """Install ``run(updates)``, which executes updates (``tessera.backends.context`` does,
    on import): the equation language itself knows no backend."""
    global _runner
    _runner = run


def _run(updates) -> None:
    if _runner is None:
        raise ShapeError("no backend is loaded to run equations; import tessera (which loads "
                         "tessera.backends.context) before recording updates")
    _runner(updates)


def record(update: Update) -> None:
    """Append to the open ``equations()`` block, or execute at once when none is open."""
    batch = _batch.get()
    if batch is not None:
        batch.append(update)
    else:
        _run([update])


def assign(tensor, indices: str, value) -> None:
    """``T["ij"] = expr``: replace T's contents (``+=`` has already been recorded)."""
    if isinstance(value, _Recorded):
        if value.ref.tensor is not tensor:
            raise ShapeError("augmented assignment target changed tensor")
        return
    record(Update(Ref(tensor, indices), _as_expr(value), accumulate=False))


class equations:
    """``with tessera.equations():`` collects updates and runs them as one plan on exit."""

    def __init__(self, context=None):
        self.context = context
        self.updates: list = []

    def __enter__(self):
        self._token = _batch.set(self.updates)
        return self

    def __exit__(self, exc_type, exc, tb):
        _batch.reset(self._token)
        if exc_type is None and self.updates:
            if self.context is not None:
                self.context.execute(self.updates)
            else:
                _run(self.updates)
        return False
