"""Which rank owns which block: cyclic, contiguous, balanced by cost, or user-given.

Pure Python and deterministic: every rank computes the same map from the same input.
Keys are taken in the order given (GlobalArray passes them sorted).
"""

from __future__ import annotations

import heapq
from typing import Mapping, Sequence

from tessera.errors import RuntimeLayerError

DISTRIBUTIONS = ("cyclic", "contiguous", "balanced")


def assign_owners(
    keys: Sequence[tuple],
    nranks: int,
    distribution: str = "cyclic",
    costs: Mapping | Sequence | None = None,
    owners: Mapping | None = None,
    default_costs: Sequence[float] | None = None,
) -> dict:
    """Return {key: rank} for ranks 0..nranks-1.

    cyclic: the i-th key goes to rank i mod nranks.
    contiguous: keys are cut into nranks consecutive runs whose lengths differ by <= 1.
    balanced: greedy longest-processing-time: keys by decreasing cost (ties: key order)
        each go to the rank with the least total cost so far (ties: lowest rank). Costs
        come from `costs` (dict key->cost or a sequence aligned with keys) or, if None,
        from `default_costs` (GlobalArray passes the block sizes).
    owners: {key: rank} for every key; overrides `distribution`.
    """
    if nranks < 1:
        raise RuntimeLayerError(f"cannot distribute blocks over {nranks} ranks; expected >= 1.")
    if owners is not None:
        return _check_owners(keys, nranks, owners)
    if distribution not in DISTRIBUTIONS:
        raise RuntimeLayerError(
            f"unknown distribution {distribution!r}; expected one of "
            f"{', '.join(DISTRIBUTIONS)}, or pass owners={{key: rank}}."
        )
    if costs is not None and distribution != "balanced":
        raise RuntimeLayerError(
            f"costs were given but distribution is {distribution!r}; costs are used only by "
            "distribution='balanced'. Drop costs or choose 'balanced'."
        )
    n = len(keys)
    if distribution == "cyclic":
        return {k: i % nranks for i, k in enumerate(keys)}
    if distribution == "contiguous":
        base, extra = divmod(n, nranks)
        out, i = {}, 0
        for r in range(nranks):
            for _ in range(base + (1 if r < extra else 0)):
                out[keys[i]] = r
                i += 1
        return out
    weights = _costs_list(keys, costs if costs is not None else default_costs)
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    heap = [(0.0, r) for r in range(nranks)]
    out = {}
    for i in order:
        load, r = heapq.heappop(heap)
        out[keys[i]] = r
        heapq.heappush(heap, (load + weights[i], r))
    return out


def loads(owner_map: Mapping, nranks: int, weights: Mapping) -> list[float]:
    """Total weight per rank of an owner map (for reporting balance)."""
    out = [0.0] * nranks
    for k, r in owner_map.items():
        out[r] += float(weights[k])
    return out


def _costs_list(keys, costs) -> list[float]:
    if costs is None:
        return [1.0] * len(keys)
    if isinstance(costs, Mapping):
        missing = [k for k in keys if k not in costs]
        if missing:
            raise RuntimeLayerError(
                f"costs has no entry for {len(missing)} block(s), e.g. {missing[0]}; expected "
                "a cost for every block key. Add the missing keys to costs."
            )
        values = [costs[k] for k in keys]
    else:
        values = list(costs)
        if len(values) != len(keys):
            raise RuntimeLayerError(
                f"costs has {len(values)} entries but there are {len(keys)} blocks; expected "
                "one cost per block in sorted key order, or a dict {key: cost}."
            )
    out = []
    for k, v in zip(keys, values):
        try:
            f = float(v)
        except (TypeError, ValueError):
            f = float("nan")
        if not f >= 0.0 or f == float("inf"):
            raise RuntimeLayerError(
                f"cost of block {k} is {v!r}; expected a finite number >= 0."
            )
        out.append(f)
    return out


def _check_owners(keys, nranks, owners) -> dict:
    out = {}
    for k in keys:
        if k not in owners:
            raise RuntimeLayerError(
                f"owners has no rank for block {k}; expected an owner for every block key "
                f"({len(keys)} blocks). Add it or use a distribution."
            )
        r = owners[k]
        if isinstance(r, bool) or not hasattr(r, "__index__") or not 0 <= int(r) < nranks:
            raise RuntimeLayerError(
                f"owner of block {k} is {r!r}; expected a rank 0 <= r < {nranks} (the number "
                "of worker ranks)."
            )
        out[k] = int(r)
    extra = [k for k in owners if k not in out]
    if extra:
        raise RuntimeLayerError(
            f"owners names {len(extra)} block(s) that the array does not have, e.g. "
            f"{extra[0]!r}; expected only keys of existing blocks."
        )
    return out
