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

import json

from tessera.profile.commlog import is_collective


def chrome_trace(records: list):
    """The trace events of every rank record (each with regions, tasks and ops), one JSON
    object text per event (formatted directly: a run has ~10^5 of them)."""
    base = min(r["t0_unix"] for r in records)
    names: dict = {}

    def q(name):                      # a JSON string, escaped once per distinct name
        out = names.get(name)
        if out is None:
            out = names[name] = json.dumps(name)
        return out

    for rec in records:
        pid = rec["rank"]
        off = rec["t0_unix"] - base
        yield json.dumps({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                          "args": {"name": f"rank {pid} (node {rec['node']})"}})
        tids = {0} | {g["thread"] for g in rec.get("regions", [])} | {t["thread"] for t in rec.get("tasks", [])}
        for tid in sorted(tids):
            yield json.dumps({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                              "args": {"name": "main" if tid == 0 else f"worker {tid}"}})
        for g in rec.get("regions", []):
            ts, end = (g["start"] + off) * 1e6, (g["start"] + g["seconds"] + off) * 1e6
            yield (f'{{"name":{q(g["name"])},"cat":"{g["kind"]}","ph":"X","ts":{ts!r},"dur":{max(0.0, end - ts)!r},'
                   f'"pid":{pid},"tid":{g["thread"]},"args":{{"flops":{g["flops"]}}}}}')
        for t in rec.get("tasks", []):
            ts, end = (t["start"] + off) * 1e6, (t["start"] + t["seconds"] + off) * 1e6
            yield (f'{{"name":{q(t["name"])},"cat":"task","ph":"X","ts":{ts!r},"dur":{max(0.0, end - ts)!r},'
                   f'"pid":{pid},"tid":{t["thread"]},"args":{{"index":{t["index"]}}}}}')
        for o in rec.get("ops", []):
            ts = (o["start"] + off) * 1e6
            args = f'"peer":{o["peer"]},"bytes":{o["bytes"]},"seconds":{o["seconds"]!r}'
            if is_collective(o["op"]):
                end = (o["start"] + o["seconds"] + off) * 1e6
                yield (f'{{"name":{q(o["op"])},"cat":"collective","ph":"X","ts":{ts!r},'
                       f'"dur":{max(0.0, end - ts)!r},"pid":{pid},"tid":0,'
                       f'"args":{{{args},"received":{json.dumps(o["peers"])}}}}}')
            else:
                yield (f'{{"name":{q(o["op"])},"cat":"one_sided","ph":"i","s":"t","ts":{ts!r},"pid":{pid},'
                       f'"tid":0,"args":{{{args}}}}}')


def write_trace(path: str, records: list) -> None:
    """``{"traceEvents": [...], ...}`` of the records into ``path``."""
    with open(path, "w") as f:
        f.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(
            {"format": records[0]["format"], "ranks": len(records)}) + ',"traceEvents":[\n')
        first = True
        for event in chrome_trace(records):
            f.write(event if first else ",\n" + event)
            first = False
        f.write("\n]}\n")
