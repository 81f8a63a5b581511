#!/usr/bin/env bash
# Redis store: claim+complete pairs per second through RedisStore (one
# multiplexed connection) at 1, 16 and 256 tasks, against redis-benchmark
# sending the store's own claim and complete scripts by EVALSHA, with random
# keys, at 1, 16 and 64 connections, no pipelining. A redis-benchmark
# "pair" rate is 1 / (1/claims + 1/completes); its completes hit records
# that were never claimed, so they are a little cheaper than real ones.
# The backend's limit is redis-benchmark's best. Needs redis-benchmark and
# IDEM_TEST_REDIS_URL (host and port are taken from it).
set -euo pipefail
cd "$(dirname "$0")/.."
url="${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
secs="${IDEM_BENCH_SECS:-5}"
export IDEM_TEST_REDIS_URL="$url" IDEM_BENCH_SECS="$secs"
hostport="${url#redis://}"; host="${hostport%%:*}"; port="${hostport##*:}"; port="${port%%/*}"
cargo bench -q -p idem-redis --bench redis_claim_complete > target/redis-store.txt
claim_sha=$(redis-cli -h "$host" -p "$port" SCRIPT LOAD "$(cat crates/idem-redis/src/lua/claim.lua)")
complete_sha=$(redis-cli -h "$host" -p "$port" SCRIPT LOAD "$(cat crates/idem-redis/src/lua/complete.lua)")
now=$(($(date +%s) * 1000))
n=$((20000 * secs))
: > target/redis-bench.txt
for c in 1 16 64; do
    claims=$(redis-benchmark -h "$host" -p "$port" -c "$c" -n "$n" -r 100000000 -q \
        EVALSHA "$claim_sha" 4 "idem-rb:r:__rand_int__" idem-rb:fence idem-rb:in-progress "idem-rb:k:__rand_int__" fpfpfpfpfpfpfpfpfpfpfpfpfpfpfpfp "$now" $((now + 30000)) $((now + 3600000)) "POST /bench" $((now + 4200000)) 0 \
        | tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($(i+1) ~ /requests/) print $i}' | tail -1)
    completes=$(redis-benchmark -h "$host" -p "$port" -c "$c" -n "$n" -r 100000000 -q \
        EVALSHA "$complete_sha" 2 "idem-rb:r:__rand_int__" idem-rb:in-progress 1 1 "" 201 "" "{}" \
        | tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($(i+1) ~ /requests/) print $i}' | tail -1)
    python3 -c "print('redis-benchmark/$c', 1 / (1 / $claims + 1 / $completes))" >> target/redis-bench.txt
done
redis-cli -h "$host" -p "$port" --scan --pattern 'idem-rb:*' | xargs -r -n 1000 redis-cli -h "$host" -p "$port" DEL >/dev/null
python3 bench/ratio-table.py redis-benchmark/ target/redis-bench.txt target/redis-store.txt
