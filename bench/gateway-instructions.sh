#!/usr/bin/env bash
# Instructions per request through `idem serve`, counted by
# `valgrind --tool=callgrind`: the gateway's own user-space work (hyper's
# server and client, the layer, the store, the proxy), the same on every
# run whatever else this shared machine is doing, where its req/s and CPU
# per request swing by a third within the hour. The kernel's work (TCP,
# wake-ups) is not counted: bench/gateway.sh measures the whole.
#
# The upstream and the client are Python processes (an HTTP/1.1
# keep-alive server answering 201 with a small JSON body, and a
# keep-alive client sending requests one at a time on one connection),
# so nothing but the gateway runs under valgrind. For each mode the
# gateway starts on a fresh store, serves IDEM_BENCH_WARM requests
# (default 200: connections, the pool, lazily built state), has its
# counters zeroed
# (callgrind_control -z), serves IDEM_BENCH_N more (default 2000), and is
# dumped: the figure is the dump's total over N. Idle-time work (timers,
# the sweeper) lands in it too, which is small beside the requests.
#
# Modes (IDEM_BENCH_MODES, default all): passthrough (GET, no key),
# memory-new, memory-replay, sqlite-new (new keys: a key per request;
# replays: one key). IDEM_BENCH_BIN: another idem binary (before/after).
# IDEM_BENCH_KEEP: a directory to copy the callgrind dumps into, for
# callgrind_annotate.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
# shellcheck source=bench/lib.sh
. bench/lib.sh
idem_binary
N="${IDEM_BENCH_N:-2000}"
WARM="${IDEM_BENCH_WARM:-200}"
MODES="${IDEM_BENCH_MODES:-passthrough memory-new memory-replay sqlite-new}"
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# The upstream: HTTP/1.1 keep-alive, 201 and a small JSON body for every
# request (200 for GET), its body read and dropped; its answers carry
# `Connection: keep-alive`, as nginx's do.
cat >"$WORK/upstream.py" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def answer(self, status, body):
        n = int(self.headers.get("content-length") or 0)
        if n:
            self.rfile.read(n)
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        # As nginx and most servers answer an HTTP/1.1 keep-alive request.
        self.send_header("connection", "keep-alive")
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        self.answer(201, b'{"id":"t-1","status":"created"}')
    def do_GET(self):
        self.answer(200, b'{"ok":true}')
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
# The client: COUNT requests on one keep-alive connection; fails on any
# answer other than the mode's.
cat >"$WORK/client.py" <<'PY'
import http.client, sys
port, mode, count, run = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = http.client.HTTPConnection("127.0.0.1", port)
body = b'{"from":"acct-1","to":"acct-2","amount":100}'
for i in range(count):
    if mode == "passthrough":
        c.request("GET", "/transfers")
        want = 200
    else:
        key = f"bench-{run}-replayed" if mode.endswith("replay") else f"bench-{run}-{i:08d}"
        c.request("POST", "/transfers", body,
                  {"Idempotency-Key": key, "Content-Type": "application/json"})
        want = 201
    r = c.getresponse()
    r.read()
    if r.status != want:
        sys.exit(f"request {i}: {r.status}, not {want}")
PY

UP="$(free_port)"
python3 "$WORK/upstream.py" "$UP" &
PIDS+=("$!")
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$UP") 2>/dev/null && break; sleep 0.1; done

# count MODE: prints MODE and its instructions per request; exits
# non-zero if the gateway does not start or any answer is not the mode's.
count() {
    local mode="$1" store
    case "$mode" in
        sqlite-*) store="sqlite:$WORK/idem-$mode.db" ;;
        *) store="memory:" ;;
    esac
    local port admin
    port="$(free_port)"; admin="$(free_port)"
    valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.$mode" \
        "$BIN" serve --upstream "http://127.0.0.1:$UP" --store "$store" --threads 1 \
        --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
        >"$WORK/idem-$mode.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    local ready=""
    for _ in $(seq 300); do
        curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && { ready=1; break; }
        sleep 0.2
    done
    [ -n "$ready" ] || { cat "$WORK/idem-$mode.log" >&2; echo "bench: the gateway did not start ($mode)" >&2; exit 1; }
    local run="$RANDOM$RANDOM"
    python3 "$WORK/client.py" "$port" "$mode" "$WARM" "$run"
    callgrind_control -z "$pid" >/dev/null 2>&1 ||
        { echo "bench: callgrind_control -z failed ($mode)" >&2; exit 1; }
    python3 "$WORK/client.py" "$port" "$mode" "$N" "$run-measured"
    callgrind_control -d "$pid" >/dev/null 2>&1 ||
        { echo "bench: callgrind_control -d failed ($mode)" >&2; exit 1; }
    kill "$pid"; wait "$pid" 2>/dev/null || true
    local total
    total="$(sed -n 's/^summary: //p' "$WORK"/cg."$mode".* | tail -1)"
    [ -n "$total" ] || { echo "bench: no callgrind dump ($mode)" >&2; exit 1; }
    if [ -n "${IDEM_BENCH_KEEP:-}" ]; then
        mkdir -p "$IDEM_BENCH_KEEP"
        cp "$WORK"/cg."$mode".* "$IDEM_BENCH_KEEP"/
    fi
    printf '%-16s %14s\n' "$mode" "$(( total / N ))"
}

echo "binary: $BIN; $N requests a mode after $WARM, one connection, --threads 1"
printf '%-16s %14s\n' mode "instr/request"
for m in $MODES; do
    count "$m"
done
