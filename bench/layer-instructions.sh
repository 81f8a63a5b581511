#!/usr/bin/env bash
# Instructions per request through the idem-http layer, counted by
# `valgrind --tool=callgrind`: the same on every run whatever else the
# machine is doing, so a change to the request path can be judged by one
# run where req/s on this shared machine swings by a third. Requests go
# through the service in-process (no sockets, one thread; mimalloc and a
# Prometheus recorder, as in `idem serve`). Each figure is the difference
# between N2 and N1 requests over N2-N1, so start-up and teardown cancel
# out (the records still held at the end are freed in both runs, in
# proportion: that part is counted); the first 100 requests, which warm
# up what is done once, are not counted. The writer thread of the SQLite store
# is counted; its disk time is not (callgrind counts instructions).
#
# IDEM_BENCH_MODES (default: all), IDEM_BENCH_N1 / IDEM_BENCH_N2 (1000 /
# 5000), IDEM_BENCH_BIN: a driver built before (for before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
if [ -z "${IDEM_BENCH_BIN:-}" ]; then
  out=$(cargo bench -p idem-cli --bench layer_instructions --no-run 2>&1)
  bin=$(printf '%s\n' "$out" | sed -n 's/.*(\(.*layer_instructions-[0-9a-f]*\)).*/\1/p' | tail -1)
  [ -x "$bin" ] || { printf '%s\n' "$out" >&2; echo "no driver binary" >&2; exit 1; }
else
  bin=$IDEM_BENCH_BIN
fi
n1=${IDEM_BENCH_N1:-1000}
n2=${IDEM_BENCH_N2:-5000}
modes=${IDEM_BENCH_MODES:-bare memory-new memory-replay sqlite-new sqlite-replay}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
count() {
  valgrind --tool=callgrind --zero-before=*start_counting* --callgrind-out-file="$tmp/cg.$1.$2" "$bin" "$1" "$2" 2>&1 \
    | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
echo "driver: $bin"
printf '%-16s %14s %10s\n' mode "instr/request" "× bare"
bare=""
for m in $modes; do
  a=$(count "$m" "$n1"); b=$(count "$m" "$n2")
  per=$(( (b - a) / (n2 - n1) ))
  [ "$m" = bare ] && bare=$per
  if [ -n "$bare" ]; then
    ratio=$(awk -v p="$per" -v b="$bare" 'BEGIN { printf "%.2f", p / b }')
  else
    ratio=-
  fi
  printf '%-16s %14s %10s\n' "$m" "$per" "$ratio"
done
[ -n "${IDEM_BENCH_KEEP:-}" ] && cp "$tmp"/cg.* "$IDEM_BENCH_KEEP"/ || true
