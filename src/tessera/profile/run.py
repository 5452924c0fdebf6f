"""A run's records: per rank, summed over ranks, printed at the end, written with --profile.

At the end of a run every rank turns its :class:`~tessera.profile.records.Recorder` and
its :class:`~tessera.profile.commlog.CommLog` into one plain record (``rank_record``):
its regions, tasks and communication events (when profiling), its per-operation totals,
its row of the rank x rank matrix and where its time went. One gather of the small part
of those records (no events) gives rank 0 the run's summary (``summarize``), printed on
every run as the table of ``render_table``: per operation kind the calls, the bytes
moved between ranks, the bytes that left the node, the time and its share of the run,
and the computational efficiency E(N).

With ``tessera run --profile DIR`` (``finish``): every rank writes its own full record
to ``DIR/records.<rank>.json`` (events as columns, ``rows`` turns them back into one dict
per event; no rank gathers the others' events) and its trace events to
``DIR/trace.<rank>.part``, then rank 0 writes ``DIR/records.json`` (the index: format
version, run summary, the rank files), ``DIR/result.json`` (the run's JSON) and
``DIR/trace.json`` (profile.trace: the parts joined; on several nodes DIR must be a
shared file system).

Definitions (per rank; docs/profile.md):
- compute: seconds of arithmetic (block products, task work; on serial/threads every
  step and task set), see ``backends.context``;
- one_sided: seconds in get/put/acc and their completion (sync); counter: fetch_add;
  collective: every collective (barrier included);
- idle: wall time in none of these (waiting, serial work outside the executors, Python);
- E(N) = T_comp / (T_N * N): compute seconds summed over ranks over the run's wall time
  (slowest rank) times every rank, ghost ranks included (Casper's definition).
"""

from __future__ import annotations

import json
import os
import threading
import time

from tessera.errors import InputError
from tessera.profile.commlog import LOCAL_OPS, ONE_SIDED_OPS, is_collective
from tessera.profile.energy import gpu_reason

FORMAT = "tessera-profile-2"
TIME_KINDS = ("compute", "one_sided", "collective", "counter", "idle")


def _category(op: str) -> str:
    if op == "fetch_add":
        return "counter"
    if op in ONE_SIDED_OPS or op in LOCAL_OPS:
        return "one_sided"
    return "collective"


def rank_record(recorder, log=None, *, rank: int = 0, node_of=None, ranks_total: int = 1) -> dict:
    """This rank's plain record (see module docstring); ``log`` None: no communication."""
    wall = time.perf_counter() - recorder.t0
    node_of = list(node_of or [0])
    me_node = node_of[rank] if rank < len(node_of) else 0
    threads = _thread_ids(recorder)
    totals: dict = {}
    time_in = dict.fromkeys(TIME_KINDS, 0.0)
    row = {"one_sided": [0] * len(node_of), "collective": [0] * len(node_of)}
    received = log.received() if log is not None else {}
    for r in (log.records() if log is not None else []):
        t = totals.setdefault(r.op, {"calls": 0, "bytes": 0, "moved_bytes": 0, "offnode_bytes": 0,
                                     "seconds": 0.0})
        t["calls"] += r.count
        t["bytes"] += r.nbytes
        t["seconds"] += r.seconds
        time_in[_category(r.op)] += r.seconds
        if not is_collective(r.op) and 0 <= r.peer < len(node_of):
            row["one_sided"][r.peer] += r.nbytes
            if r.peer != rank:
                t["moved_bytes"] += r.nbytes
                t["offnode_bytes"] += r.nbytes if node_of[r.peer] != me_node else 0
    for (op, peer), n in received.items():
        t = totals[op]
        row["collective"][peer] += n
        t["moved_bytes"] += n
        t["offnode_bytes"] += n if node_of[peer] != me_node else 0
    time_in["compute"] = recorder.compute
    time_in["idle"] = max(0.0, wall - sum(time_in.values()))
    out = {
        "format": FORMAT, "rank": rank, "node": me_node, "ranks": len(node_of),
        "ranks_total": ranks_total, "t0_unix": time.time() - wall, "wall_seconds": wall,
        "time": time_in, "totals": totals, "matrix_row": row,
        "phases": {g.label: g.seconds for g in recorder.regions if g.kind == "phase"},
        "table": {label: {"calls": c, "seconds": s, "flops": f, "kind": recorder.kinds[label]}
                  for label, (c, s, f) in recorder.table.items()},
    }
    meter = recorder.energy
    out["energy"] = {"available": bool(meter and meter.available), "joules": dict(recorder.joules),
                     "reason": "the run was not profiled (--profile)" if meter is None else meter.reason,
                     "gpu_reason": gpu_reason()}
    if recorder.detailed:         # columns, not one dict per event: cheap to build and write
        regions = recorder.regions
        out["regions"] = {"name": [g.label for g in regions], "kind": [g.kind for g in regions],
                          "start": [g.start for g in regions], "seconds": [g.seconds for g in regions],
                          "flops": [g.flops for g in regions],
                          "thread": [threads.get(g.thread, 0) for g in regions]}
        tasks = recorder.tasks
        out["tasks"] = {"name": [t[0] for t in tasks], "index": [t[1] for t in tasks],
                        "start": [t[2] for t in tasks], "seconds": [t[3] for t in tasks],
                        "thread": [threads.get(t[4], 0) for t in tasks]}
        shift = recorder.t0 - log.t0 if log is not None else 0.0
        events = (log.events or []) if log is not None else []
        out["ops"] = {"op": [e[0] for e in events], "peer": [e[1] for e in events],
                      "bytes": [e[2] for e in events], "start": [e[3] - shift for e in events],
                      "seconds": [e[4] for e in events],
                      "peers": [[list(p) for p in e[5]] if e[5] else [] for e in events]}
    return out


def _thread_ids(recorder) -> dict:
    """threading ident -> small thread number (0: the main thread, then in order of use)."""
    ids = {threading.main_thread().ident: 0}
    for ident in [g.thread for g in recorder.regions] + [t[4] for t in recorder.tasks]:
        ids.setdefault(ident, len(ids))
    return ids


def rows(record: dict, kind: str) -> list:
    """The events of one kind (``regions``, ``tasks`` or ``ops``) of a rank record as one
    dict per event (the files hold them as columns)."""
    columns = record.get(kind) or {}
    return [dict(zip(columns, values)) for values in zip(*columns.values())]


def light(record: dict) -> dict:
    """The part of a rank record that rank 0 gathers on every run (no events)."""
    return {k: v for k, v in record.items() if k not in ("regions", "tasks", "ops")}


def summarize(parts: list) -> dict:
    """The run over every rank, from each rank's (light) record."""
    ops: dict = {}
    for p in parts:
        for op, t in p["totals"].items():
            s = ops.setdefault(op, dict.fromkeys(t, 0))
            for k, v in t.items():
                s[k] += v
    wall = max(p["wall_seconds"] for p in parts)
    n = parts[0]["ranks_total"]
    compute = sum(p["time"]["compute"] for p in parts)
    return {
        "format": FORMAT, "ranks": len(parts), "ranks_total": n,
        "nodes": len({p["node"] for p in parts}), "wall_seconds": wall, "compute_seconds": compute,
        "efficiency": compute / (wall * n) if wall > 0 else 0.0,
        "ops": dict(sorted(ops.items())),
        "matrix": {kind: [p["matrix_row"][kind] for p in parts] for kind in ("one_sided", "collective")},
        "per_rank": [{"rank": p["rank"], "wall": p["wall_seconds"], **p["time"]} for p in parts],
        "energy": _energy(parts),
    }


def _energy(parts: list) -> dict:
    """Joules per phase summed over nodes (one rank per node: the counters are the node's)."""
    gpu = {"gpu_available": False, "gpu_reason": parts[0]["energy"]["gpu_reason"]}
    missing = [p for p in parts if not p["energy"]["available"]]
    if missing:
        return {"available": False, "reason": missing[0]["energy"]["reason"], **gpu}
    joules: dict = {}
    seen = set()
    for p in parts:
        if p["node"] in seen:
            continue
        seen.add(p["node"])
        for phase, j in p["energy"]["joules"].items():
            joules[phase] = joules.get(phase, 0.0) + j
    return {"available": True, "joules": joules, "total": sum(joules.values()), **gpu}


def render_table(summary: dict) -> str:
    """NWChem-like statistics per operation kind, and E(N)."""
    wall = summary["wall_seconds"]
    n = summary["ranks_total"]
    lines = [f"\nRun statistics ({summary['ranks']} rank(s)"
             + (f" + {n - summary['ranks']} ghost(s)" if n > summary["ranks"] else "")
             + f", {summary['nodes']} node(s); counts and times summed over ranks)",
             f"{'operation':12s} {'calls':>9s} {'MiB moved':>10s} {'MiB off-node':>12s} "
             f"{'seconds':>9s} {'% of run':>8s}"]
    for op, t in summary["ops"].items():
        share = 100.0 * t["seconds"] / (wall * summary["ranks"]) if wall > 0 else 0.0
        lines.append(f"{op:12s} {t['calls']:9d} {t['moved_bytes'] / 2**20:10.2f} "
                     f"{t['offnode_bytes'] / 2**20:12.2f} {t['seconds']:9.3f} {share:8.1f}")
    share = 100.0 * summary["compute_seconds"] / (wall * summary["ranks"]) if wall > 0 else 0.0
    lines.append(f"{'compute':12s} {'':9s} {'':10s} {'':12s} {summary['compute_seconds']:9.3f} {share:8.1f}")
    lines.append(f"Computational efficiency E({n}) = T_comp / (T_N x N) = "
                 f"{summary['compute_seconds']:.3f} s / ({wall:.3f} s x {n}) = {summary['efficiency']:.3f}")
    return "\n".join(lines)


def finish(recorder, world=None, directory: str | None = None, data: dict | None = None) -> dict | None:
    """Collective over the world's ranks (if any): the run summary on rank 0 (None
    elsewhere); with ``directory`` also the profile files (module docstring)."""
    from tessera.profile import trace
    if world is None:
        record = rank_record(recorder)
        rank, base = 0, record["t0_unix"]
    else:
        record = rank_record(recorder, world.comm_log, rank=world.rank, node_of=world.node_of,
                             ranks_total=world.full_size)
        rank = world.rank
        base = world.allreduce(record["t0_unix"], op="min") if directory is not None else 0.0
    if directory is not None:       # every rank writes its own files, in parallel
        _write(os.path.join(directory, f"records.{rank}.json"), record)
        _guard(trace.write_part, os.path.join(directory, f"trace.{rank}.part"), record, base)
    # once rank 0 has every rank's part of the gather, every rank has written its files
    parts = [light(record)] if world is None else world.gather(light(record))
    if rank != 0:
        return None
    summary = summarize(parts)
    if directory is not None:
        result = dict(data or {}, statistics=summary)
        _write(os.path.join(directory, "result.json"), result)
        _write(os.path.join(directory, "records.json"),
               {"format": FORMAT, "summary": summary, "rank_files":
                [f"records.{r}.json" for r in range(len(parts))], "run": _run_info(result)})
        _guard(trace.join_parts, os.path.join(directory, "trace.json"),
               [os.path.join(directory, f"trace.{r}.part") for r in range(len(parts))],
               {"format": FORMAT, "ranks": len(parts)})
    return summary


def _guard(write, path: str, *args) -> None:
    try:
        write(path, *args)
    except OSError as err:
        raise InputError(f"cannot write {path}: {err.strerror}") from None


def _run_info(data: dict) -> dict:
    """What identifies the calculation (for comparing runs in a report)."""
    return {k: data.get(k) for k in ("molecule", "basis", "method", "backend", "variant", "schedule",
                                     "ranks", "tile", "nocc", "nvir", "frozen_core")}


def prepare(directory: str) -> str:
    """Create the profile directory (an error names why it cannot be)."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise InputError(f"cannot create --profile directory {directory!r}: {err.strerror}; "
                         "give a writable path") from None
    return directory


def _write(path: str, obj) -> None:
    text = json.dumps(obj, default=float)        # the C encoder: json.dump's chunks are slower
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as err:
        raise InputError(f"cannot write {path}: {err.strerror}") from None


def load_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise InputError(f"{path} does not exist; a profile directory holds records.json, "
                         "records.<rank>.json, result.json and trace.json "
                         "(written by tessera run --profile DIR)") from None
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {path}: {err}") from None
