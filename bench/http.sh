#!/usr/bin/env bash
# Throughput and p99 through the idem-http layer (memory and SQLite, new
# keys and replays) against the same service without it, in one run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench -q -p idem-http --bench layer_throughput
