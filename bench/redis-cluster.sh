#!/usr/bin/env bash
# Redis Cluster store: claim+complete pairs per second through RedisStore
# on a cluster of three masters with one replica each (started here on
# ports BASE..BASE+5, torn down at the end), at 1, 16 and 256 tasks, with
# and without waiting for a replica's acknowledgement (WAIT 1) after each
# write; against `redis-benchmark --cluster` sending the store's own claim
# and complete scripts by EVALSHA at 1, 16 and 64 connections per master,
# no pipelining. redis-benchmark puts one node's hash tag ({tag}) in every
# key of a command, so each call's keys share a slot as the store's do; a
# "pair" rate is 1 / (1/claims + 1/completes), and its completes hit
# records that were never claimed (a little cheaper than real ones).
# The backend's limit is redis-benchmark's best.
# Needs redis-server, redis-cli and redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${IDEM_BENCH_SECS:-5}"
base="${IDEM_BENCH_CLUSTER_PORT:-7101}"
dir=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT

nodes=()
for i in 0 1 2 3 4 5; do
    port=$((base + i))
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
        --cluster-config-file nodes.conf --dir "$dir/$port" --save "" --appendonly no \
        >/dev/null 2>&1 &
    pids+=($!)
    nodes+=("127.0.0.1:$port")
done
for i in 0 1 2 3 4 5; do
    until redis-cli -p $((base + i)) ping >/dev/null 2>&1; do sleep 0.1; done
done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
until redis-cli -p "$base" cluster info | grep -q cluster_state:ok \
    && [ "$(redis-cli -p "$base" cluster nodes | grep -c slave)" = 3 ]; do sleep 0.2; done
for i in 0 1 2 3 4 5; do
    until redis-cli -p $((base + i)) info replication | grep -Eq 'role:master|master_link_status:up'; do sleep 0.2; done
done

url="redis-cluster://127.0.0.1:$base"
export IDEM_BENCH_SECS="$secs"
IDEM_TEST_REDIS_URL="$url" cargo bench -q -p idem-redis --bench redis_claim_complete \
    > target/redis-cluster-store.txt
IDEM_TEST_REDIS_URL="$url?wait_replicas=1&wait_timeout_ms=1000" \
    cargo bench -q -p idem-redis --bench redis_claim_complete \
    | sed 's|^store/|store+wait/|' >> target/redis-cluster-store.txt

claim_sha=""; complete_sha=""
for i in 0 1 2 3 4 5; do
    claim_sha=$(redis-cli -p $((base + i)) SCRIPT LOAD "$(cat crates/idem-redis/src/lua/claim.lua)")
    complete_sha=$(redis-cli -p $((base + i)) SCRIPT LOAD "$(cat crates/idem-redis/src/lua/complete.lua)")
done
now=$(($(date +%s) * 1000))
n=$((20000 * secs))
rate() {
    tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($(i+1) ~ /requests/) print $i}' | tail -1
}
: > target/redis-cluster-bench.txt
for c in 1 16 64; do
    claims=$(redis-benchmark --cluster -p "$base" -c "$c" -n "$n" -r 100000000 -q \
        EVALSHA "$claim_sha" 4 "idem-rb:{tag}:r:__rand_int__" "idem-rb:{tag}:f:__rand_int__" "idem-rb:{tag}:in-progress" "idem-rb:{tag}:k:__rand_int__" fpfpfpfpfpfpfpfpfpfpfpfpfpfpfpfp "$now" $((now + 30000)) $((now + 3600000)) "POST /bench" $((now + 4200000)) 1 \
        | rate)
    completes=$(redis-benchmark --cluster -p "$base" -c "$c" -n "$n" -r 100000000 -q \
        EVALSHA "$complete_sha" 2 "idem-rb:{tag}:r:__rand_int__" "idem-rb:{tag}:in-progress" 1 1 "" 201 "" "{}" \
        | rate)
    python3 -c "print('redis-benchmark/$c', 1 / (1 / $claims + 1 / $completes))" >> target/redis-cluster-bench.txt
done
python3 bench/ratio-table.py redis-benchmark/ target/redis-cluster-bench.txt target/redis-cluster-store.txt
