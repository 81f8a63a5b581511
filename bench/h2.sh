#!/usr/bin/env bash
# `idem serve` over HTTP/2 (h2c, prior knowledge) against nginx's own
# HTTP/2 hop, on this machine, in one run.
#
# nginx (one worker) serves a tiny HTTP/1.1 upstream on one port and, on
# a second port, an HTTP/2 hop (`listen ... http2`, h2c) that proxies to it
# over keep-alive HTTP/1.1: that hop is the reference. The gateway listens
# h2c (its default) and reaches the same upstream over HTTP/1.1, as the hop
# does. h2load (Debian's nghttp2-client; -c64 connections, -m8 streams
# each, -t2) sends IDEM_BENCH_REQUESTS requests a row (200000 by default):
# a GET without a key (passthrough) or a POST with one key for every
# request (replays; the hop's POST reaches the upstream every time).
# h2load cannot vary a header per request, so new keys are sent by a small
# generator of the repository's own (crates/idem-gateway/examples/
# h2load_keys.rs: the same -c64 -m8, a new key on every POST), against the
# gateway and against the hop alike; those two rows are compared with each
# other. Each row: requests/s, the ratio to the hop's row of the same
# kind, and CPU per request: the utime+stime of the serving process (the
# nginx worker, which serves the upstream too, or the gateway alone) over
# the requests finished.
#
# A last row runs HTTP/1.1 passthrough (wrk) against the gateway with and
# without `--no-http2`: what serving h2c on the plain listener (reading a
# connection's first bytes to choose) costs an HTTP/1.1 client.
# IDEM_BENCH_BIN runs another idem binary. Installs nginx-light,
# nghttp2-client and wrk with apt-get if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

REQUESTS="${IDEM_BENCH_REQUESTS:-200000}"

if ! command -v nginx >/dev/null || ! command -v h2load >/dev/null || ! command -v wrk >/dev/null; then
    echo "bench: installing nginx-light, nghttp2-client and wrk" >&2
    apt-get install -y nginx-light nghttp2-client wrk >/dev/null 2>&1 ||
        { apt-get update >/dev/null && apt-get install -y nginx-light nghttp2-client wrk >/dev/null; }
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"

# shellcheck source=bench/lib.sh
. bench/lib.sh
idem_binary
cargo build -q --release -p idem-gateway --example h2load_keys
KEYS_TOOL="$PWD/target/release/examples/h2load_keys"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

UP="$(free_port)"
HOP="$(free_port)"
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
daemon on;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $WORK/body;
    proxy_temp_path $WORK/proxy;
    upstream app { server 127.0.0.1:$UP; keepalive 128; }
    server {
        listen 127.0.0.1:$UP;
        keepalive_requests 100000;
        location / {
            default_type application/json;
            if (\$request_method = POST) { return 201 '{"id":"t-1","status":"created"}'; }
            return 200 '{"ok":true}';
        }
    }
    server {
        listen 127.0.0.1:$HOP http2;
        keepalive_requests 1000000;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
EOF
"$NGINX" -c "$WORK/nginx.conf" -e "$WORK/nginx-error.log" -p "$WORK"
NGINX_WORKER=""
for _ in $(seq 1 50); do
    [ -s "$WORK/nginx.pid" ] && NGINX_WORKER="$(pgrep -P "$(cat "$WORK/nginx.pid")" | head -1 || true)"
    [ -n "$NGINX_WORKER" ] && break
    sleep 0.1
done
[ -n "$NGINX_WORKER" ] || { echo "bench: no nginx worker" >&2; exit 1; }

BODY="$WORK/body.json"
printf '%s' '{"from":"acct-1","to":"acct-2","amount":100}' >"$BODY"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# load KIND URL N: N requests of KIND, get (passthrough), replay (one key)
# or new (a new key each), with h2load's report on stdout.
load() {
    local kind="$1" url="$2" n="$3"
    local args=(-c64 -m8 -t2)
    case "$kind" in
        new) "$KEYS_TOOL" "$url" "$n" 64 8; return ;;
        replay) args+=(-d "$BODY" -H 'content-type: application/json' -H 'idempotency-key: bench-h2-replayed-key-01') ;;
    esac
    h2load "${args[@]}" -n "$n" "$url"
}

# h2row NAME URL KIND PID: KIND as for `load`.
h2row() {
    local name="$1" url="$2" kind="$3" pid="$4"
    load "$kind" "$url" 20000 >/dev/null 2>&1 || true
    local before after out rps done
    before="$(cpu_ticks "$pid")"
    out="$(load "$kind" "$url" "$REQUESTS")"
    after="$(cpu_ticks "$pid")"
    rps="$(echo "$out" | awk '/^finished in/ {print $4}')"
    done="$(echo "$out" | awk '/^requests:/ {print $6}')"
    local codes
    codes="$(echo "$out" | awk '/^status codes:/ {print $3, $5, $7, $9}')"
    local cpu_us=$(( (after - before) * TICK_US / (done > 0 ? done : 1) ))
    printf '%s\t%s\t%s\t%s\n' "$name" "$rps" "$cpu_us" "$codes" >>"$WORK/rows.tsv"
    printf 'bench: %-36s %10s req/s  %5s us/req  2xx/3xx/4xx/5xx %s\n' "$name" "$rps" "$cpu_us" "$codes" >&2
}

# wrkrow NAME URL PID: HTTP/1.1 passthrough GETs.
wrkrow() {
    local name="$1" url="$2" pid="$3"
    wrk -t2 -c64 -d1s "$url" >/dev/null 2>&1 || true
    local before after out rps reqs
    before="$(cpu_ticks "$pid")"
    out="$(wrk -t2 -c64 -d8s "$url")"
    after="$(cpu_ticks "$pid")"
    rps="$(echo "$out" | awk '/^Requests\/sec/ {print $2}')"
    reqs="$(echo "$out" | awk '/requests in/ {print $1}')"
    local cpu_us=$(( (after - before) * TICK_US / (reqs > 0 ? reqs : 1) ))
    printf '%s\t%s\t%s\t-\n' "$name" "$rps" "$cpu_us" >>"$WORK/rows.tsv"
    printf 'bench: %-36s %10s req/s  %5s us/req\n' "$name" "$rps" "$cpu_us" >&2
}

# gateway EXTRA...: starts `idem serve` (memory store) with EXTRA flags;
# sets GW_PORT and GW_PID.
gateway() {
    local admin
    GW_PORT="$(free_port)"; admin="$(free_port)"
    "$BIN" serve --upstream "http://127.0.0.1:$UP" --store memory \
        --listen "127.0.0.1:$GW_PORT" --admin-listen "127.0.0.1:$admin" \
        --max-connections 4096 "$@" >"$WORK/idem.log" 2>&1 &
    GW_PID=$!
    PIDS+=("$GW_PID")
    for _ in $(seq 1 100); do
        curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
        sleep 0.1
    done
}

h2row "nginx h2 hop GET" "http://127.0.0.1:$HOP/get" get "$NGINX_WORKER"
gateway
h2row "idem h2c GET (passthrough)" "http://127.0.0.1:$GW_PORT/get" get "$GW_PID"
h2row "nginx h2 hop POST" "http://127.0.0.1:$HOP/transfers" replay "$NGINX_WORKER"
h2row "idem h2c POST (replays)" "http://127.0.0.1:$GW_PORT/transfers" replay "$GW_PID"
h2row "nginx h2 hop POST, new-key tool" "http://127.0.0.1:$HOP/transfers" new "$NGINX_WORKER"
h2row "idem h2c POST (new keys, memory)" "http://127.0.0.1:$GW_PORT/transfers" new "$GW_PID"
wrkrow "idem http/1.1 GET, h2c on" "http://127.0.0.1:$GW_PORT/get" "$GW_PID"
kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true
gateway --no-http2
wrkrow "idem http/1.1 GET, --no-http2" "http://127.0.0.1:$GW_PORT/get" "$GW_PID"
kill "$GW_PID"; wait "$GW_PID" 2>/dev/null || true

echo
printf '| row | req/s | x hop | CPU us/req |\n|---|---:|---:|---:|\n'
awk -F'\t' '
    $1 == "nginx h2 hop GET" { get = $2 }
    $1 == "nginx h2 hop POST" { post = $2 }
    $1 == "nginx h2 hop POST, new-key tool" { keys = $2 }
    { rows[NR] = $0 }
    END {
        for (i = 1; i <= NR; i++) {
            split(rows[i], f, "\t")
            ref = (f[1] ~ /new/) ? keys : (f[1] ~ /POST/) ? post : get
            ratio = (f[1] ~ /http\/1.1/ || ref == 0) ? "-" : sprintf("%.2f", f[2] / ref)
            printf "| %s | %.0f | %s | %s |\n", f[1], f[2], ratio, f[3]
        }
    }' "$WORK/rows.tsv"
