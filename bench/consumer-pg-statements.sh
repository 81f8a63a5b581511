#!/usr/bin/env bash
# What the idempotency record costs PostgreSQL itself, per consumed
# message, without a broker or a client library in the way: pgbench (one
# client, prepared) runs the bench consumer's transfer transaction
#   - alone (the consumer without idem),
#   - with the claim through the store's idem_claim function and the
#     completion UPDATE (one-commit mode before the insert fast path),
#   - with the claim as the plain insert one-commit mode now runs first
#     (Statements::claim_new) and the completion UPDATE.
# The tables come from the real migrations: `idem records stale` creates
# the store's schema in a scratch database, dropped at the end.
#
#   IDEM_BENCH_POSTGRES  default postgres://postgres@127.0.0.1:5432/test
#   IDEM_BENCH_SECS      seconds per row and round (default 6; 3 rounds)
#   IDEM_BENCH_BIN       an idem binary (default: build this tree, release)
set -euo pipefail
cd "$(dirname "$0")/.."
url="${IDEM_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}"
secs="${IDEM_BENCH_SECS:-6}"
bin="${IDEM_BENCH_BIN:-}"
if [ -z "$bin" ]; then
    cargo build --release -q -p idem-cli
    bin=target/release/idem
fi
db="idem_consumer_bench_$$"
scratch="${url%/*}/$db"
dir="$(mktemp -d)"
trap 'psql "$url" -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1; [ -n "${IDEM_BENCH_KEEP:-}" ] || rm -rf "$dir"' EXIT
psql "$url" -qc "CREATE DATABASE $db" >/dev/null
"$bin" records stale --store "$scratch" >/dev/null
psql "$scratch" -q >/dev/null <<'SQL'
CREATE TABLE idem.accounts (id text PRIMARY KEY, balance bigint NOT NULL CHECK (balance >= 0));
CREATE TABLE idem.transfers (id bigserial PRIMARY KEY, idem_key text NOT NULL,
    from_acct text NOT NULL, to_acct text NOT NULL, amount bigint NOT NULL);
INSERT INTO idem.accounts SELECT 'acct-' || g, 1000000000 FROM generate_series(0, 15) g;
SQL

transfer="SELECT id, balance FROM idem.accounts WHERE id = ANY(ARRAY['acct-' || :i, 'acct-' || :j]) ORDER BY id FOR UPDATE;
UPDATE idem.accounts SET balance = balance - 1 WHERE id = 'acct-' || :i;
UPDATE idem.accounts SET balance = balance + 1 WHERE id = 'acct-' || :j;
INSERT INTO idem.transfers (idem_key, from_acct, to_acct, amount) VALUES ('k' || :k, 'acct-' || :i, 'acct-' || :j, 1) RETURNING id;"
head='\set i random(0, 15)
\set j (:i + 1) % 16
\set k random(1, 9000000000000000)'
complete="UPDATE idem.idem_records SET status = 1, resource_id = '42', response_status = 201, response_headers = '\\x00'::bytea, response_body = '{\"transfer\":42}'::bytea, lease_until = NULL WHERE scope = 's' AND operation = 'CONSUME apply-transfer' AND key = 'k' || :k AND fence = :fence AND status = 0;"
fp="'\\x02aabbccddeeff00112233445566778899aabbccddeeff0011223344556677889900'::bytea"
now='(extract(epoch from clock_timestamp()) * 1000)::bigint'
printf '%s\nBEGIN;\n%s\nCOMMIT;\n' "$head" "$transfer" > "$dir/without.sql"
printf '%s\nBEGIN;\nSELECT fence FROM idem.idem_claim('"'"'s'"'"', '"'"'CONSUME apply-transfer'"'"', '"'"'k'"'"' || :k, %s, %s, 30000, 86400000) \\gset\n%s\n%s\nCOMMIT;\n' \
    "$head" "$fp" "$now" "$transfer" "$complete" > "$dir/function.sql"
printf '%s\nBEGIN;\nINSERT INTO idem.idem_records (scope, operation, key, fingerprint, status, fence, created_at, lease_until, expires_at) VALUES ('"'"'s'"'"', '"'"'CONSUME apply-transfer'"'"', '"'"'k'"'"' || :k, %s, 0, nextval('"'"'idem.idem_fence'"'"'), %s, %s + 30000, %s + 86400000) ON CONFLICT DO NOTHING RETURNING fence \\gset\n%s\n%s\nCOMMIT;\n' \
    "$head" "$fp" "$now" "$now" "$now" "$transfer" "$complete" > "$dir/insert.sql"

declare -A total
for round in 1 2 3; do
    for row in without function insert; do
        ms=$(pgbench -n -M prepared -c 1 -T "$secs" -f "$dir/$row.sql" "$scratch" \
            | awk '/^latency average/ {print $4}')
        [ -n "$ms" ] || { echo "pgbench failed on $row" >&2; exit 1; }
        total[$row]=$(python3 -c "print(${total[$row]:-0} + $ms)")
    done
done
echo "pgbench, 1 client, prepared, ${secs}s x 3 rounds (mean latency per transaction)"
for row in without function insert; do
    python3 -c "
m = ${total[$row]} / 3; base = ${total[without]} / 3
print(f'  {\"$row\":<9} {m:6.3f} ms  {base / m:4.2f}x the transfer without idem')"
done
