#!/usr/bin/env bash
# A/B of the broker's tokio worker threads (TOKIO_WORKER_THREADS) at light load:
# scripts/bench/ab-env.sh with that variable (the load generator keeps its own
# default). Until 2026-11-26 this script warmed its cluster with 3 s at 500
# jobs/s instead of 15 s flat out and a CHECKPOINT.
#   usage: scripts/bench/ab-threads.sh OUTDIR [ROUNDS]
#   env:   VARIANTS="2 1" (thread counts), RATES="1000 100", DUR=10
DUR=${DUR:-10} exec "$(dirname "$0")/ab-env.sh" "${1:?OUTDIR}" "${2:-2}" TOKIO_WORKER_THREADS "${VARIANTS:-2 1}"
