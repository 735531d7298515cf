#!/usr/bin/env python3
"""Reads `perf script -F comm,pid,tid,time,event,trace` of raw_syscalls
sys_enter/sys_exit (scripts/bench/trace-hops.sh) and splits each one-job Enqueue
call at the broker into its hops:

  request read -> statement sent            the broker's work before PostgreSQL
  statement sent -> read by the backend     waking the backend
  in the backend                            statement, commit (fdatasync,
                                            futex waits: locks another
                                            backend holds, at a commit most
                                            likely the WAL write lock)
  reply sent -> read by the broker          waking the broker
  reply read -> response written            the broker's work after

The broker's connections are told apart by what goes over them: the producer
connection is the one whose writes are the Enqueue responses (the most
frequent write size on a connection that is also read), the statement is
the most frequent message size the broker sends to PostgreSQL with a reply
of one size (the one-job insert of a light load).
"""
import bisect, collections, re, statistics, sys

NR = {0: 'read', 1: 'write', 20: 'writev', 44: 'sendto', 45: 'recvfrom', 75: 'fdatasync', 202: 'futex'}
line = re.compile(r'\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit): NR (\d+) (.*)')
pending, ev = {}, []
for l in sys.stdin:
    m = line.match(l)
    if not m:
        continue
    comm, tid, t, kind, nr, rest = m[1], int(m[3]), float(m[4]), m[5], int(m[6]), m[7]
    if kind == 'enter':
        a = rest.strip('()').split(', ')
        try:
            fd = int(a[0], 16)
        except ValueError:
            fd = -1
        pending[tid] = (t, nr, fd)
    elif tid in pending:
        t0, nr0, fd = pending.pop(tid)
        ev.append((t0, t, comm == 'postgres', tid, NR.get(nr0, nr0), fd, int(rest.split('= ')[1])))

broker = [e for e in ev if not e[2]]
pg = [e for e in ev if e[2]]
# The one-job statement: the most frequent size of the broker's sends to
# PostgreSQL that can hold the job's payload (100 bytes in the scripts'
# runs). Smaller sends are left out: a pool's Sync after each statement (as
# sqlx's PgPool sends when the floor broker gives a connection back), and a
# one-job delete at 100/s, are as frequent.
stmt = collections.Counter(e[6] for e in broker if e[4] == 'sendto' and e[6] >= 100).most_common(1)[0][0]
# Its reply: the most frequent size a backend sends after reading a statement of that size.
replies = collections.Counter()
for tid in {e[3] for e in pg}:
    got = False
    for e in sorted(x for x in pg if x[3] == tid):
        if e[4] == 'recvfrom' and e[6] == stmt:
            got = True
        elif got and e[4] == 'sendto':
            replies[e[6]] += 1
            got = False
reply = replies.most_common(1)[0][0]
# The producer connection: of the gRPC connections (those the broker
# writes with writev), the one it most often reads a message from that can
# hold a payload, the Enqueue requests; the Enqueue response is the writev
# size seen most often on it. (Consumers' connections carry acks, smaller.)
grpc = {e[5] for e in broker if e[4] == 'writev'}
prod = collections.Counter(e[5] for e in broker
                           if e[4] == 'recvfrom' and e[5] in grpc and e[6] >= 100).most_common(1)[0][0]
resp_size = collections.Counter(e[6] for e in broker
                                if e[4] == 'writev' and e[5] == prod).most_common(1)[0][0]

req = sorted(e[1] for e in broker if e[4] == 'recvfrom' and e[5] == prod and e[6] > 0)
resp = sorted(e[0] for e in broker if e[4] == 'writev' and e[5] == prod and e[6] == resp_size)
bsend = sorted(e[0] for e in broker if e[4] == 'sendto' and e[6] == stmt)
brecv = sorted(e[1] for e in broker if e[4] == 'recvfrom' and e[6] == reply)
rows = []
for tid in {e[3] for e in pg}:
    start = None
    for e in sorted(x for x in pg if x[3] == tid):
        t0, t1, _, _, name, _, r = e
        if name == 'recvfrom' and r == stmt and start is None:
            start, fs, fx = t1, 0.0, 0.0
        elif start is not None and name == 'fdatasync':
            fs += t1 - t0
        elif start is not None and name == 'futex':
            fx += t1 - t0
        elif start is not None and name == 'sendto':
            rows.append((start, t0, fs, fx))
            start = None
hops = collections.defaultdict(list)
for s, e, fs, fx in rows:
    i = bisect.bisect_left(bsend, s) - 1
    j = bisect.bisect_left(brecv, e)
    if i < 0 or j >= len(brecv):
        continue
    k = bisect.bisect_left(req, bsend[i]) - 1
    m = bisect.bisect_left(resp, brecv[j])
    if k < 0 or m >= len(resp):
        continue
    hops['1 request read -> statement sent (broker)'].append(bsend[i] - req[k])
    hops['2 statement sent -> read by the backend'].append(s - bsend[i])
    hops['3 in the backend'].append(e - s)
    hops['3a   of which fdatasync'].append(fs)
    hops['3b   of which futex waits'].append(fx)
    hops['4 reply sent -> read by the broker'].append(brecv[j] - e)
    hops['5 reply read -> response written (broker)'].append(resp[m] - brecv[j])
    hops['= request read -> response written'].append(resp[m] - req[k])


def q(v, p):
    v = sorted(v)
    return v[int(p * (len(v) - 1))] * 1e3


n = len(hops['3 in the backend'])
print(f'{n} Enqueue calls (statement {stmt} bytes, reply {reply}; producer fd {prod})')
print(f'   own fdatasync in {sum(1 for x in hops["3a   of which fdatasync"] if x > 0)}, '
      f'futex waits in {sum(1 for x in hops["3b   of which futex waits"] if x > 0)}')
for name, v in sorted(hops.items()):
    print(f'{name:44s} p50 {q(v, .5):.3f}  p90 {q(v, .9):.3f}  p99 {q(v, .99):.3f}  mean {statistics.mean(v) * 1e3:.3f} ms')
