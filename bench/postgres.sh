#!/usr/bin/env bash
# PostgreSQL store: claim+complete pairs per second through PostgresStore
# (pool of 16) at 1, 16 and 256 tasks, against pgbench running the same two
# statements (the store's idem_claim call and its completion UPDATE, with
# the claim's fence carried over by \gset), prepared, at 1, 16 and 64
# clients. The backend's limit is pgbench's best. Needs pgbench and
# IDEM_TEST_POSTGRES_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
url="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
secs="${IDEM_BENCH_SECS:-5}"
export IDEM_TEST_POSTGRES_URL="$url" IDEM_BENCH_SECS="$secs"
psql "$url" -qc "DROP SCHEMA IF EXISTS idem_bench CASCADE" >/dev/null
cargo bench -q -p idem-postgres --bench postgres_claim_complete > target/pg-store.txt
psql "$url" -qc "TRUNCATE idem_bench.idem_records" >/dev/null
script=$(mktemp)
cat > "$script" <<'SQL'
\set k random(1, 1000000000000)
SELECT fence FROM idem_bench.idem_claim('bench', 'POST /bench', 'pgb-' || :k, '\x0102'::bytea, (extract(epoch from clock_timestamp()) * 1000)::bigint, 30000, 3600000) \gset
UPDATE idem_bench.idem_records SET status = 1, resource_id = NULL, response_status = 201, response_headers = '\x00'::bytea, response_body = '\x7b7d'::bytea, lease_until = NULL WHERE scope = 'bench' AND operation = 'POST /bench' AND key = 'pgb-' || :k AND fence = :fence AND status = 0;
SQL
: > target/pg-bench.txt
for c in 1 16 64; do
    tps=$(pgbench -n -M prepared -c "$c" -j 2 -T "$secs" -f "$script" "$url" 2>/dev/null | awk '/^tps/ {print $3}')
    echo "pgbench/$c $tps" >> target/pg-bench.txt
done
rm -f "$script"
python3 bench/ratio-table.py pgbench/ target/pg-bench.txt target/pg-store.txt
