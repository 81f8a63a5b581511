#!/usr/bin/env bash
# Messages per second through one consumer that applies each transfer in
# its own transaction without idem, against the same consumer with idem's
# atomic mode (one message at a time, and a fetched batch together), for
# each broker on SQLite and PostgreSQL. Uses `idem demo --broker URL
# --bench` (crates/idem/src/demo/broker/mod.rs).
#
#   IDEM_BENCH_MESSAGES  messages per row (default 5000)
#   IDEM_BENCH_NATS      default nats://127.0.0.1:4222
#   IDEM_BENCH_AMQP      default amqp://guest:guest@127.0.0.1:5672/%2f
#   IDEM_BENCH_POSTGRES  default postgres://postgres@127.0.0.1:5432/test
#   IDEM_BENCH_BIN       an idem binary (default: build this tree, release)
set -euo pipefail
cd "$(dirname "$0")/.."

n="${IDEM_BENCH_MESSAGES:-5000}"
nats="${IDEM_BENCH_NATS:-nats://127.0.0.1:4222}"
amqp="${IDEM_BENCH_AMQP:-amqp://guest:guest@127.0.0.1:5672/%2f}"
pg="${IDEM_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
bin="${IDEM_BENCH_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release -q -p idem-cli
    bin=target/release/idem
fi
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT

for broker in "$nats" "$amqp"; do
    for store in "sqlite:$dir/bench-$RANDOM.db" "$pg"; do
        case "$store" in sqlite:*) shown=SQLite ;; *) shown=PostgreSQL ;; esac
        echo "== ${broker%%://*} on $shown"
        RUST_LOG=warn "$bin" demo --broker "$broker" --store "$store" --bench --intents "$n" \
            | grep -v '^idem demo --bench'
    done
done
