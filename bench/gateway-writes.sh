#!/usr/bin/env bash
# What `idem serve` writes a request with the SQLite store, new keys: the
# gateway process's bytes written to the disk (`write_bytes` of
# /proc/PID/io) and its write system calls (`syscw`, sockets and eventfd
# included) over 8 s of bench/gateway.sh's SQLite new-key row, divided by
# the requests the gateway counted (`idem_requests_total`) in those 8 s.
# Bytes and calls a request do not move with the machine's speed as req/s
# does. IDEM_BENCH_BIN: another idem binary (before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
IDEM_BENCH_ROWS='sqlite new' IDEM_BENCH_SECS=16 bash bench/gateway.sh >"$out" 2>&1 &
bench=$!
bin="$(basename "${IDEM_BENCH_BIN:-idem}")"
pid=""
for _ in $(seq 600); do
    pid="$(pgrep -f "$bin serve .*sqlite" | head -1 || true)"
    [ -n "$pid" ] && break
    sleep 0.5
done
[ -n "$pid" ] || { cat "$out" >&2; echo "bench: no gateway on SQLite appeared" >&2; exit 1; }
admin="$(tr '\0' ' ' <"/proc/$pid/cmdline" | sed -n 's/.*--admin-listen \([^ ]*\).*/\1/p')"
sample() {
    local requests
    requests="$(curl -fs "http://$admin/metrics" | awk '/^idem_requests_total/ {s += $2} END {print s + 0}')"
    echo "$requests $(awk '/^write_bytes/ {b = $2} /^syscw/ {c = $2} END {print b, c}' "/proc/$pid/io")"
}
sleep 6
read -r r1 b1 c1 < <(sample)
sleep 8
read -r r2 b2 c2 < <(sample)
wait "$bench"
n=$((r2 - r1))
[ "$n" -gt 0 ] || { echo "bench: no requests counted" >&2; exit 1; }
awk -v n="$n" -v b=$((b2 - b1)) -v c=$((c2 - c1)) 'BEGIN {
    printf "requests %d, disk bytes written a request %.0f, write calls a request %.2f\n", n, b / n, c / n }'
