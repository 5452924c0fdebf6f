"""The Chrome Trace Event format of a run's records (opens in Perfetto and chrome://tracing).

One process per rank (pid = rank), one thread per worker thread of that rank (tid 0:
the main thread, which issues every MPI call). Regions (phases, iterations, equation
steps, task sets) and tasks are complete events ("X", category = the region's kind or
"task"); collectives are complete events on the main thread (category "collective"),
one-sided and counter operations are instant events ("i", thread scope) at their
start, with peer, bytes and seconds in ``args``. Times are microseconds since the
earliest rank started (ranks aligned by their wall clocks). Each rank writes its own
events (``write_part``, in parallel); rank 0 joins the parts (``join_parts``).
"""

from __future__ import annotations

import json
import os
import shutil

from tessera.profile.commlog import is_collective


def rank_events(rec: dict, base: float):
    """The trace events of one rank record (regions, tasks and ops as columns), one JSON
    object text per event (formatted directly: a run has ~10^5 of them); ``base``: the
    unix time of the earliest rank's start."""
    names: dict = {}

    def q(name):                      # a JSON string, escaped once per distinct name
        out = names.get(name)
        if out is None:
            out = names[name] = json.dumps(name)
        return out

    pid = rec["rank"]
    off = rec["t0_unix"] - base
    empty: dict = {}
    regions, tasks, ops = rec.get("regions", empty), rec.get("tasks", empty), rec.get("ops", empty)
    yield json.dumps({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                      "args": {"name": f"rank {pid} (node {rec['node']})"}})
    for tid in sorted({0, *regions.get("thread", []), *tasks.get("thread", [])}):
        yield json.dumps({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                          "args": {"name": "main" if tid == 0 else f"worker {tid}"}})
    if regions:
        for name, kind, start, sec, flops, tid in zip(regions["name"], regions["kind"], regions["start"],
                                                      regions["seconds"], regions["flops"], regions["thread"]):
            ts, end = (start + off) * 1e6, (start + sec + off) * 1e6
            yield (f'{{"name":{q(name)},"cat":"{kind}","ph":"X","ts":{ts!r},"dur":{max(0.0, end - ts)!r},'
                   f'"pid":{pid},"tid":{tid},"args":{{"flops":{flops}}}}}')
    if tasks:
        for name, index, start, sec, tid in zip(tasks["name"], tasks["index"], tasks["start"], tasks["seconds"],
                                                tasks["thread"]):
            ts, end = (start + off) * 1e6, (start + sec + off) * 1e6
            yield (f'{{"name":{q(name)},"cat":"task","ph":"X","ts":{ts!r},"dur":{max(0.0, end - ts)!r},'
                   f'"pid":{pid},"tid":{tid},"args":{{"index":{index}}}}}')
    if ops:
        for op, peer, nbytes, start, sec, peers in zip(ops["op"], ops["peer"], ops["bytes"], ops["start"],
                                                        ops["seconds"], ops["peers"]):
            ts = (start + off) * 1e6
            args = f'"peer":{peer},"bytes":{nbytes},"seconds":{sec!r}'
            if is_collective(op):
                end = (start + sec + off) * 1e6
                yield (f'{{"name":{q(op)},"cat":"collective","ph":"X","ts":{ts!r},'
                       f'"dur":{max(0.0, end - ts)!r},"pid":{pid},"tid":0,'
                       f'"args":{{{args},"received":{json.dumps(peers)}}}}}')
            else:
                yield (f'{{"name":{q(op)},"cat":"one_sided","ph":"i","s":"t","ts":{ts!r},"pid":{pid},'
                       f'"tid":0,"args":{{{args}}}}}')


def write_part(path: str, rec: dict, base: float) -> None:
    """One rank's events, comma-separated, for ``join_parts`` (each rank writes its own)."""
    with open(path, "w") as f:
        f.write(",\n".join(rank_events(rec, base)))


def join_parts(path: str, parts: list, meta: dict) -> None:
    """``{"traceEvents": [...], ...}`` of the ranks' parts into ``path``; the parts are removed."""
    with open(path, "w") as f:
        f.write('{"displayTimeUnit":"ms","otherData":' + json.dumps(meta) + ',"traceEvents":[\n')
        for i, part in enumerate(parts):
            with open(part) as src:
                if i:
                    f.write(",\n")
                shutil.copyfileobj(src, f, 1 << 20)
        f.write("\n]}\n")
    for part in parts:
        os.remove(part)
