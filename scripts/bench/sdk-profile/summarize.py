"""The top of a profile, as text: the functions with the most self time.

    summarize.py FILE [TOP=25]

FILE: a cProfile dump (*.pstats: sorted by tottime, then by cumulative
time), a V8 CPU profile (*.cpuprofile, from `node --cpu-prof`: self time
per function, from the samples), or py-spy's raw output (*.txt, collapsed
stacks `frame;frame;... COUNT`: self samples per leaf frame, and the
samples under each thread). scripts/bench/sdk-workers.sh writes FILE.top.txt
with it."""

import collections
import json
import pstats
import sys

path = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 25


def table(rows, total, unit):  # type: ignore[no-untyped-def]
    print(f"{'self':>9} {'%':>5}  function   (total {total:.0f} {unit})")
    for name, v in rows[:top]:
        print(f"{v:>9.0f} {100 * v / total if total else 0:>5.1f}  {name}")


if path.endswith(".pstats"):
    s = pstats.Stats(path)
    s.sort_stats("tottime").print_stats(top)
    s.sort_stats("cumulative").print_stats(top)
elif path.endswith(".cpuprofile"):
    prof = json.load(open(path))
    nodes = prof["nodes"]
    # Sample intervals: time per sample (µs), summed per node.
    per_node: dict = collections.Counter()
    deltas = prof.get("timeDeltas", [])
    for sid, dt in zip(prof["samples"], deltas):
        per_node[sid] += dt
    self_us: dict = collections.Counter()
    for n in nodes:
        cf = n["callFrame"]
        url = cf.get("url", "").rsplit("/", 2)
        where = "/".join(url[-2:]) if cf.get("url") else ""
        name = f"{cf.get('functionName') or '(anonymous)'} {where}:{cf.get('lineNumber', 0) + 1}"
        self_us[name] += per_node.get(n["id"], 0)
    total = sum(self_us.values())
    rows = [(k, v / 1000) for k, v in sorted(self_us.items(), key=lambda kv: -kv[1])]
    table(rows, total / 1000, "ms")
else:
    leaf: dict = collections.Counter()
    thread: dict = collections.Counter()
    total = 0
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        thread[frames[0]] += n
        leaf[frames[-1]] += n
    print("samples by thread:")
    table(sorted(thread.items(), key=lambda kv: -kv[1]), total, "samples")
    print("\nself samples by frame:")
    table(sorted(leaf.items(), key=lambda kv: -kv[1]), total, "samples")
