#!/usr/bin/env bash
# Store throughput: claim+complete pairs per second for the memory and
# SQLite stores at 1, 16 and 256 tasks, with the same-run baseline of plain
# rusqlite autocommit. Prints the table BENCHMARKS.md records.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf target/criterion/claim_complete
cargo bench -p idem-sqlite --bench claim_complete -- --noplot "$@" >&2
python3 bench/criterion-ratios.py claim_complete sqlite_autocommit_baseline
