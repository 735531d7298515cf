#!/usr/bin/env python3
"""Where the tail of a latency run sits in time.

Reads a `leaseq bench --scenario latency --latency-log FILE` log
(`sent_us,latency_us` per delivery) and prints:
  - the percentiles;
  - the stalls: 100 ms windows with a delivery above 8 ms, and their worst;
  - how the slow deliveries (above the run's p99) spread over 100 ms
    windows: a few windows holding most of them means stalls (something
    periodic or a pause of a process); an even spread means queueing for a
    core, job by job;
  - the windows with the most slow deliveries, with their worst latency;
  - for a few periods, how the slow deliveries fall on the phase of that
    period (a timer of that period shows as one crowded phase bin).

    scripts/bench/latency-tail.py /tmp/lat.csv
"""
import signal
import sys


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, int(p / 100 * len(sorted_vals)))
    return sorted_vals[i]


def main(path):
    rows = []
    with open(path) as f:
        next(f)
        for line in f:
            s, l = line.split(",")
            rows.append((int(s), int(l)))
    if not rows:
        print("no deliveries")
        return
    lat = sorted(l for _, l in rows)
    p50, p90, p99, p999 = (pct(lat, p) for p in (50, 90, 99, 99.9))
    print(f"{len(rows)} deliveries; p50 {p50/1000:.2f} ms, p90 {p90/1000:.2f}, "
          f"p99 {p99/1000:.2f}, p99.9 {p999/1000:.2f}, max {lat[-1]/1000:.2f}")
    worst = {}
    for s, l in rows:
        w = s // 100_000
        worst[w] = max(worst.get(w, 0), l)
    print("stalls (100 ms windows with a delivery above 8 ms; start s: worst ms):",
          " ".join(f"{w/10:.1f}:{l/1000:.0f}" for w, l in sorted(worst.items()) if l > 8000) or "none")
    slow = [(s, l) for s, l in rows if l > p99]
    if not slow:
        return
    windows = {}
    for s, l in slow:
        w = s // 100_000
        n, worst = windows.get(w, (0, 0))
        windows[w] = (n + 1, max(worst, l))
    span = (max(s for s, _ in rows) // 100_000) + 1
    ranked = sorted(windows.items(), key=lambda kv: -kv[1][0])
    top = ranked[: max(1, span // 20)]
    share = sum(n for _, (n, _) in top) / len(slow)
    print(f"{len(slow)} deliveries above p99 in {len(windows)} of {span} windows of 100 ms; "
          f"the busiest 5 % of windows hold {share:.0%} of them")
    print("busiest windows (start s: slow deliveries, worst ms):")
    for w, (n, worst) in ranked[:12]:
        print(f"  {w/10:7.1f}: {n:4d}, {worst/1000:7.2f}")
    for period_ms in (100, 250, 500, 1000, 2000, 3000, 5000, 7000, 10000):
        bins = [0] * 10
        for s, _ in slow:
            bins[(s // 1000 % period_ms) * 10 // period_ms] += 1
        peak = max(bins) / len(slow)
        print(f"  phase of a {period_ms:5d} ms period (10 bins, even = 10 %): "
              f"peak bin {peak:.0%}  {bins}")


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # | head
    main(sys.argv[1])
