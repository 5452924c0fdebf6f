"""What a distributed Fock build reports: per-rank busy time, tasks executed and stolen,
load imbalance (max/mean busy time), counter operations local and remote, screening.

Busy time is the wall time a rank spent computing tasks (integrals and contractions);
``busy_cpu_s`` is the same interval in thread CPU time, which differs from it when ranks
share cores (oversubscription).  Imbalance = max over ranks / mean over ranks of busy
time, summed over all Fock builds (1.0 is perfect).
"""

from __future__ import annotations

from tessera.profile.records import imbalance

_SUMMED = ("busy_s", "busy_cpu_s", "tasks_s", "reduce_s", "wall_s", "tasks", "stolen", "steals",
           "counter_local", "counter_remote", "integrals")

#: The in-memory build over ranks (``incore.IncoreFock``): its integral tasks run on this
#: rank, shell pairs whose representatives it keeps or computes anew in every build, and
#: integral tasks it stole.
INTEGRAL_DEAL_KEYS = ("integral_tasks", "integral_pairs_kept", "integral_pairs_recomputed",
                      "integral_tasks_stolen")


def _rank_totals(history: list) -> dict:
    out = {k: 0 for k in _SUMMED}
    for h in history:
        for k in _SUMMED:
            out[k] += h.get(k, 0)
    builds = [h for h in history if not h.get("replay")]
    out["fock_builds"] = len(history)
    out["first_build"] = {k: history[0].get(k, 0) for k in _SUMMED} if history else {}
    out["victims"] = {}
    for h in builds:
        for v, n in h.get("victims", {}).items():
            out["victims"][int(v)] = out["victims"].get(int(v), 0) + n
    out["busy_per_build_s"] = [h["busy_s"] for h in history]
    out["tasks_per_build"] = [h.get("tasks_active", 0) for h in history]
    for k in ("shell_quartets_computed", "shell_quartets_screened"):     # the direct build's
        if history and k in history[0]:
            out[f"{k}_per_build"] = [h[k] for h in history]
    out["incremental_builds"] = sum(bool(h.get("incremental")) for h in history)
    out["incore_bytes"] = history[0].get("incore_bytes", 0) if history else 0
    for k in INTEGRAL_DEAL_KEYS:            # the in-memory build over ranks: its integral tasks
        if history and k in history[0]:
            out[k] = history[0][k]
    return out


def summarize(builder, ranks, **extra) -> dict:
    """Collective over ``ranks`` (``Context.ranks``): the ``info`` dict of the RHF
    Reference, identical on every rank."""
    mine = _rank_totals(builder.history)
    mine["rank"] = ranks.rank
    per_rank = ranks.allgather(mine)
    tasks = builder.tasks
    busy = [r["busy_s"] for r in per_rank]
    busy_cpu = [r["busy_cpu_s"] for r in per_rank]
    nbuild = per_rank[0]["fock_builds"]
    per_build = [imbalance([r["busy_per_build_s"][i] for r in per_rank])
                 for i in range(nbuild)]
    local = sum(r["counter_local"] for r in per_rank)
    remote = sum(r["counter_remote"] for r in per_rank)
    blocks = {} if tasks is None else {    # the 8-fold incore build has no tasks
        "nblocks": builder.blocks.nblocks,
        "block_sizes": builder.blocks.sizes,
        "tasks_total": len(tasks),
        "block_quartets": tasks.n_block_quartets,
        "block_quartets_skipped": tasks.n_block_quartets_skipped,
        "shell_quartets": tasks.n_shell_quartets,
        "shell_quartets_skipped": tasks.n_shell_quartets_skipped,
        "tasks_per_build": per_rank[0]["tasks_per_build"],
        "incremental_builds": per_rank[0]["incremental_builds"],
    }
    if getattr(builder, "ranges", None) is not None:      # the direct skeleton build's tasks
        blocks = {
            "tasks_total": len(builder.ranges),
            "shell_quartets": builder.quartet_counts[1],
            "shell_quartets_skipped": builder.quartet_counts[0],
            "tasks_per_build": per_rank[0]["tasks_per_build"],
            "incremental_builds": per_rank[0]["incremental_builds"],
        }
    return {
        **extra,
        "nranks": ranks.size,
        **blocks,
        "threads": builder.threads,
        "setup_s": builder.setup_seconds,
        "fock_builds": nbuild,
        "busy_s": busy,
        "tasks_executed": [r["tasks"] for r in per_rank],
        "tasks_stolen": [r["stolen"] for r in per_rank],
        "steals": [r["steals"] for r in per_rank],
        "imbalance": imbalance(busy),
        "busy_cpu_s": busy_cpu,
        "imbalance_cpu": imbalance(busy_cpu),
        "imbalance_per_build": per_build,
        "counter_ops": {"local": local, "remote": remote,
                        "local_fraction": local / (local + remote) if local + remote else None},
        "per_rank": per_rank,
    }
