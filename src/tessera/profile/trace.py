"""The Chrome Trace Event format of a run's records (opens in Perfetto and chrome://tracing).

One process per rank (pid = rank), one thread per worker thread of that rank (tid 0:
the main thread, which issues every MPI call). Regions (phases, iterations, equation
steps, task sets) and tasks are complete events ("X", category = the region's kind or
"task"); collectives are complete events on the main thread (category "collective"),
one-sided and counter operations are instant events ("i", thread scope) at their
start, with peer, bytes and seconds in ``args``. Times are microseconds since the
earliest rank started (ranks aligned by their wall clocks).
"""

from __future__ import annotations

from tessera.profile.commlog import is_collective


def chrome_trace(records: list) -> dict:
    """{"traceEvents": [...]} of every rank record (each with regions, tasks and ops)."""
    base = min(r["t0_unix"] for r in records)
    events = []
    for rec in records:
        pid = rec["rank"]
        off = rec["t0_unix"] - base

        def us(t, off=off):
            return (t + off) * 1e6

        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {pid} (node {rec['node']})"}})
        tids = {0} | {g["thread"] for g in rec.get("regions", [])} | {t["thread"] for t in rec.get("tasks", [])}
        for tid in sorted(tids):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": "main" if tid == 0 else f"worker {tid}"}})
        for g in rec.get("regions", []):
            events.append(_complete(g["name"], g["kind"], us(g["start"]), us(g["start"] + g["seconds"]),
                                    pid, g["thread"], {"flops": g["flops"]}))
        for t in rec.get("tasks", []):
            events.append(_complete(t["name"], "task", us(t["start"]), us(t["start"] + t["seconds"]),
                                    pid, t["thread"], {"index": t["index"]}))
        for o in rec.get("ops", []):
            args = {"peer": o["peer"], "bytes": o["bytes"], "seconds": o["seconds"]}
            if is_collective(o["op"]):
                args["received"] = o["peers"]
                events.append(_complete(o["op"], "collective", us(o["start"]),
                                        us(o["start"] + o["seconds"]), pid, 0, args))
            else:
                events.append({"name": o["op"], "cat": "one_sided", "ph": "i", "s": "t",
                               "ts": us(o["start"]), "pid": pid, "tid": 0, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"format": records[0]["format"], "ranks": len(records)}}


def _complete(name, cat, ts, end, pid, tid, args) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": max(0.0, end - ts),
            "pid": pid, "tid": tid, "args": args}
