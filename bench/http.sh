#!/usr/bin/env bash
# Requests/s and p99 through the idem-http layer (in-process) and through
# `idem serve` (its own process), new keys and replays, memory and SQLite,
# each against its baseline measured in the same run. Load generator:
# reqwest, 32 keep-alive tasks (IDEM_BENCH_CONCURRENCY), 5 s a figure
# (IDEM_BENCH_SECS).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p idem-cli --bench http
