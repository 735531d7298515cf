"""scripts/bench/sdk-rabbitmq.sh's tables: its results.jsonl as markdown
for docs/BENCHMARKS.md. Each figure is the range over the rounds; each
ratio's range is over the rounds too, each SDK run over its language's
RabbitMQ client run of the same round (the two ran minutes apart at most).

    rabbit_table.py RESULTS.jsonl

Environment: ENV_LINE, RABBIT_VERSION, BROKER (a header line);
WORKERS, PRODUCERS, SLEEPERS (the runs asked for: those without a figure
are listed)."""

import json
import os
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]

WORKERS = [
    ("python-async", "Python, async `Worker`", "pika"),
    ("python-sync", "Python, sync `Worker`", "pika"),
    ("node", "Node `Worker`", "amqplib"),
    ("rust", "Rust `Worker`", "lapin"),
]
PRODUCERS = [
    ("python-sync", "Python, `Client.enqueue`", "pika"),
    ("python-async", "Python, `AsyncClient.enqueue`", "pika"),
    ("node", "Node, `Client.enqueue`", "amqplib"),
    ("rust", "Rust, `Client::enqueue`", "lapin"),
]
PEER_WORKER = {
    "pika": "pika `BlockingConnection`, one `basic_ack` per message,",
    "amqplib": "amqplib, one `ack` per message,",
    "lapin": "lapin, one `ack().await` per message,",
}
PEER_PRODUCER = {
    "pika": "pika `BlockingConnection`, `confirm_delivery()`,",
    "amqplib": "amqplib `ConfirmChannel`, each `sendToQueue` awaited to its confirm,",
    "lapin": "lapin, each `basic_publish` awaited to its confirm,",
}
NAMES = {"pika": "pika", "amqplib": "amqplib", "lapin": "lapin"}


def runs(part: str, sdk: str) -> dict:
    """round -> line, for the runs of `part` by `sdk` that have a rate."""
    return {r["round"]: r for r in rows if r.get("part") == part and r.get("sdk") == sdk and r.get("rate")}


def span(values: list, fmt: str = "{:,.0f}", unit: str = "") -> str:
    """The range of `values` (one figure when they agree), with `unit`."""
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    one = fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}–{fmt.format(hi)}"
    return one + unit


def ratio(mine: dict, peer: dict) -> str:
    rs = [mine[k]["rate"] / peer[k]["rate"] for k in sorted(mine) if k in peer]
    return span(rs, "{:.2f}") + "×" if rs else "—"


def cpu(d: dict, key: str = "cpu_us_per_job") -> list:
    return [r[key] for r in d.values() if key in r]


print(os.environ.get("BROKER", "leaseq"), "·", f"RabbitMQ {os.environ.get('RABBIT_VERSION', '?')}", "quorum queue, persistent messages ·", os.environ.get("ENV_LINE", ""))
rounds = sorted({r["round"] for r in rows if "round" in r})
print(f"{len(rounds)} round(s); figures are the range over the rounds.\n")

w0 = next((r for r in rows if r.get("part") == "worker" and r.get("rate")), {})
print(
    f"Workers: one process, no-op handler, {w0.get('jobs', 0):,} jobs of 100 bytes pre-filled, "
    f"credit (prefetch) {w0.get('credit', '?')}, from the first delivery to the last handler completion.\n"
)
print("| language | leaseq SDK worker | RabbitMQ client | ratio | worker CPU per job | server CPU per job |")
print("|---|---|---|---|---|---|")
for sdk, label, peer in WORKERS:
    mine, theirs = runs("worker", sdk), runs("worker", peer)
    if not mine and not theirs:
        continue
    rate = span([r["rate"] for r in mine.values()], unit=" jobs/s")
    prate = span([r["rate"] for r in theirs.values()])
    print(
        f"| {label} | {rate} | {PEER_WORKER[peer]} {prate} | {ratio(mine, theirs)} "
        f"| {span(cpu(mine), '{:.0f}', ' µs')} ({NAMES[peer]} {span(cpu(theirs), '{:.0f}')}) "
        f"| broker {span(cpu(mine, 'server_cpu_us_per_job'), '{:.0f}', ' µs')} (RabbitMQ {span(cpu(theirs, 'server_cpu_us_per_job'), '{:.0f}')}) |"
    )

print("\nProducers: one process, single enqueues one after the other (no batching) against the client's publish of a persistent message with a publisher confirm awaited before the next.\n")
print("| language | leaseq SDK, single enqueues | RabbitMQ client, confirmed publishes | ratio | producer CPU per job | server CPU per job |")
print("|---|---|---|---|---|---|")
for sdk, label, peer in PRODUCERS:
    mine, theirs = runs("producer", sdk), runs("producer", peer)
    if not mine and not theirs:
        continue
    print(
        f"| {label} | {span([r['rate'] for r in mine.values()], unit=' jobs/s')} "
        f"| {PEER_PRODUCER[peer]} {span([r['rate'] for r in theirs.values()])} | {ratio(mine, theirs)} "
        f"| {span(cpu(mine), '{:.0f}', ' µs')} ({NAMES[peer]} {span(cpu(theirs), '{:.0f}')}) "
        f"| broker {span(cpu(mine, 'server_cpu_us_per_job'), '{:.0f}', ' µs')} (RabbitMQ {span(cpu(theirs, 'server_cpu_us_per_job'), '{:.0f}')}) |"
    )

sleeps = [r for r in rows if r.get("part") == "sleep" and r.get("rate")]
if sleeps:
    s0 = sleeps[0]
    print(
        f"\nA real handler: {s0.get('sleep_ms'):g} ms of sleep, concurrency "
        f"{s0.get('concurrency', s0.get('credit'))}, credit (prefetch) {s0.get('credit')}; "
        f"the ideal is {s0['ideal']:,} jobs/s.\n"
    )
    print("| SDK worker | jobs/s | of the ideal | worker CPU per job |")
    print("|---|---|---|---|")
    for sdk, label, _ in WORKERS:
        mine = runs("sleep", sdk)
        if mine:
            print(
                f"| {label} | {span([r['rate'] for r in mine.values()])} "
                f"| {span([r['of_ideal'] for r in mine.values()], '{:.2f}')} "
                f"| {span(cpu(mine), '{:.0f}', ' µs')} |"
            )

missing = [
    f"{part} {sdk}"
    for part, var in (("worker", "WORKERS"), ("producer", "PRODUCERS"), ("sleep", "SLEEPERS"))
    for sdk in os.environ.get(var, "").split()
    if not runs(part, sdk)
]
if missing:
    print("\nNo figure (skipped, or the run failed: OUTDIR/log):", ", ".join(missing))
