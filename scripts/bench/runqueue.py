#!/usr/bin/env python3
"""`runqueue.py snap FILE [PID...]`: every thread's /proc schedstat (time on
a CPU, time runnable and waiting for one, time slices) for the broker
(`leaseq serve`), PostgreSQL and the load generator (`leaseq bench`): of
the PIDs given and their descendants (runqueue.sh gives its broker, its
cluster's postmaster and its load generator), else of every such process
on the host.
`runqueue.py diff BEFORE AFTER JOBS`: the difference per job, per group."""
import json, os, sys


def group(pid):
    try:
        comm = open(f'/proc/{pid}/comm').read().strip()
        cmd = open(f'/proc/{pid}/cmdline').read().split('\0')
    except OSError:
        return None
    if comm == 'postgres':
        return 'postgres'
    if cmd and cmd[0].endswith('leaseq'):
        return {'serve': 'broker', 'bench': 'load generator'}.get(cmd[1] if len(cmd) > 1 else '')
    return None


def descendants(pids):
    seen, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            for tid in os.listdir(f'/proc/{pid}/task'):
                todo += open(f'/proc/{pid}/task/{tid}/children').read().split()
        except OSError:
            pass
    return seen


def snap(pids):
    out = {}
    for pid in (descendants(pids) if pids else filter(str.isdigit, os.listdir('/proc'))):
        g = group(pid)
        if g is None:
            continue
        try:
            tids = os.listdir(f'/proc/{pid}/task')
        except OSError:
            continue
        for tid in tids:
            try:
                on, wait, slices = map(int, open(f'/proc/{pid}/task/{tid}/schedstat').read().split())
            except (OSError, ValueError):
                continue
            out[f'{pid}/{tid}'] = [g, on, wait, slices]
    return out


if sys.argv[1] == 'snap':
    json.dump(snap(sys.argv[3:]), open(sys.argv[2], 'w'))
else:
    before, after, jobs = json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), float(sys.argv[4])
    total = {}
    for k, (g, on, wait, slices) in after.items():
        _, on0, wait0, slices0 = before.get(k, [g, 0, 0, 0])
        t = total.setdefault(g, [0, 0, 0])
        t[0] += on - on0
        t[1] += wait - wait0
        t[2] += slices - slices0
    for g, (on, wait, slices) in sorted(total.items()):
        print(f'{g:15s} on a CPU {on / jobs / 1e3:7.1f} µs/job   runnable, waiting {wait / jobs / 1e3:7.1f} µs/job   '
              f'{slices / jobs:5.2f} slices/job, {wait / max(slices, 1) / 1e3:6.1f} µs waiting per slice')
