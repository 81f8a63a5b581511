#!/usr/bin/env bash
# `idem serve` against an nginx proxy hop, on this machine, in one run.
#
# nginx (one worker) serves a tiny upstream on one port and, on a second
# port, a plain keep-alive proxy hop to it: that hop is the reference. wrk
# (-t2 -c64, IDEM_BENCH_SECS seconds a row, 8 by default) sends a POST with
# a small JSON body and a new Idempotency-Key per request (or one key for
# every request: replays), or a GET without a key (passthrough). Each row:
# requests/s, the ratio to the nginx hop, p99, and CPU per request: the
# utime+stime the serving process spent (from /proc/PID/stat) over the
# requests wrk completed. For the upstream and the hop rows that process is
# the nginx worker, which serves the upstream too; for idem rows it is the
# gateway alone (the upstream's own CPU is the first row's). "machine
# CPU" is every process's CPU a request over the row (/proc/stat, both
# cores: wrk, the upstream and the store server included; under
# IDEM_BENCH_PERF, perf's too), and "machine idle" the share of the two
# cores nobody used: a row near 0% idle is bound by CPU. A third nginx
# row, "nginx hop in a process of its own", is a diagnostic: the same
# hop in a second nginx, which reaches the upstream across processes as the
# gateway does; its CPU is that hop's alone. Ratios stay to the reference.
# "preempted/request" is the measured process's (the one whose CPU is
# counted) nonvoluntary context switches, summed over its threads
# (/proc/PID/task/*/status), over the requests: how often the kernel took a
# CPU from it while it could still run, which is what the p99 of a row
# follows when more threads want the CPUs than there are
# (docs/benchmarks-history.md, "Preemptions", 2026-12-03).
#
# Stores: memory, SQLite (synchronous=FULL, the default) and, when
# IDEM_TEST_POSTGRES_URL / IDEM_TEST_REDIS_URL are set, PostgreSQL and
# Redis. Those are the test databases: the bench drops their `idem`
# schema / `idem:` keys before and after its rows (a run leaves a million
# records behind otherwise, and the Redis tests' SCANs then crawl).
# With IDEM_TEST_MYSQL_URL set, a MariaDB/MySQL row too (the bench drops
# the `idem` database around it). IDEM_BENCH_PERF=DIR records `perf
# record -g` profiles of the gateway and of the store server's processes
# during each shared store's new-keys row, into DIR (profile before
# optimising: `perf report -i DIR/postgres.gateway.data`), and for
# MariaDB and PostgreSQL the server's counters a request over that row
# (statements, commits, log flushes: DIR/mysql.counters.txt), which show
# the batches' size.
# IDEM_BENCH_BIN runs another idem binary (an older build, for
# before/after); IDEM_BENCH_ROWS picks rows by name (a grep -E pattern).
# IDEM_BENCH_ROUNDS (default 1) runs the whole table that many times and
# prints each row's median (the ratio is taken to the hop of the same
# round first): this shared machine's speed moves by a third within an
# hour, so one round compares rows of the same minute only.
# Installs nginx-light and wrk with apt-get if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS="${IDEM_BENCH_SECS:-8}"
ROUNDS="${IDEM_BENCH_ROUNDS:-1}"
CONNS="${IDEM_BENCH_CONNECTIONS:-64}"
ROWS="${IDEM_BENCH_ROWS:-.}"

if ! command -v nginx >/dev/null || ! command -v wrk >/dev/null; then
    echo "bench: installing nginx-light and wrk" >&2
    apt-get install -y nginx-light wrk >/dev/null 2>&1 ||
        { apt-get update >/dev/null && apt-get install -y nginx-light wrk >/dev/null; }
fi
NGINX="$(command -v nginx || echo /usr/sbin/nginx)"

# shellcheck source=bench/lib.sh
. bench/lib.sh
idem_binary

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null || true
    [ -f "$WORK/apart/nginx.pid" ] && kill "$(cat "$WORK/apart/nginx.pid")" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

UP="$(free_port)"
HOP="$(free_port)"
APART="$(free_port)"

# nginx_conf DIR SERVERS: one worker, its files under DIR, the upstream
# pool `app`, and SERVERS (server blocks).
nginx_conf() {
    mkdir -p "$1"
    cat >"$1/nginx.conf" <<EOF
worker_processes 1;
daemon on;
pid $1/nginx.pid;
error_log $1/nginx-error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/body;
    proxy_temp_path $1/proxy;
    upstream app { server 127.0.0.1:$UP; keepalive 128; }
$2
}
EOF
}
# hop_server PORT: a keep-alive proxy hop to the upstream.
hop_server() {
    cat <<EOF
    server {
        listen 127.0.0.1:$1;
        keepalive_requests 100000;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
EOF
}
# start_nginx DIR: starts it and prints its worker's pid (nginx writes its
# pid file before it forks the worker).
start_nginx() {
    "$NGINX" -c "$1/nginx.conf" -e "$1/nginx-error.log" -p "$1"
    local w=""
    for _ in $(seq 1 50); do
        [ -s "$1/nginx.pid" ] && w="$(pgrep -P "$(cat "$1/nginx.pid")" | head -1 || true)"
        [ -n "$w" ] && break
        sleep 0.1
    done
    [ -n "$w" ] || { echo "bench: no nginx worker in $1" >&2; exit 1; }
    echo "$w"
}

nginx_conf "$WORK" "    server {
        listen 127.0.0.1:$UP;
        keepalive_requests 100000;
        location / {
            default_type application/json;
            if (\$request_method = POST) { return 201 '{\"id\":\"t-1\",\"status\":\"created\"}'; }
            return 200 '{\"ok\":true}';
        }
    }
$(hop_server "$HOP")"
NGINX_WORKER="$(start_nginx "$WORK")"

# A diagnostic, not the reference: the same proxy hop in a second nginx
# (one worker), so that, like the gateway, it reaches its upstream in
# another process. The reference hop's worker serves its own upstream, so
# its upstream exchange wakes no other process; this one's wakes the
# upstream and is woken back, as the gateway's is. Its CPU is the hop's
# process alone, as for the idem rows.
nginx_conf "$WORK/apart" "$(hop_server "$APART")"
APART_WORKER="$(start_nginx "$WORK/apart")"

# wrk scripts: new keys, one key, passthrough GET. A new key is random, as
# a client's UUIDv4 is (idem's own retry client sends those), followed by
# the thread and a counter so that no two requests share one; with
# IDEM_BENCH_KEYS=sequential it is "bench-RUN-thread-counter", in the
# order it was sent (what every table before 2026-12-03, midday, used: a
# store keyed by the key then writes where it wrote last, which random
# keys do not let it do).
if [ "${IDEM_BENCH_KEYS:-random}" = sequential ]; then
    KEY_FORMAT='string.format("bench-%d-%d-%d", RUN, tid, counter)'
else
    KEY_FORMAT='string.format("%04x%04x-%04x-4%03x-%04x-%d-%d", r(), r(), r(), r() % 4096, r(), tid, counter)'
fi
cat >"$WORK/new.lua" <<EOF
local counter, threads = 0, 0
local r = function() return math.random(0, 65535) end
function setup(thread) threads = threads + 1; thread:set("tid", threads) end
function init(args) math.randomseed(RUN + tid * 7919) end
wrk.method = "POST"
wrk.body = '{"from":"acct-1","to":"acct-2","amount":100}'
wrk.headers["Content-Type"] = "application/json"
function request()
    counter = counter + 1
    return wrk.format(nil, "/transfers", {["Idempotency-Key"] = $KEY_FORMAT})
end
EOF
cat >"$WORK/replay.lua" <<'EOF'
wrk.method = "POST"
wrk.body = '{"from":"acct-1","to":"acct-2","amount":100}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Idempotency-Key"] = "bench-replayed-key-0001"
EOF
cat >"$WORK/get.lua" <<'EOF'
wrk.method = "GET"
EOF

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Times the kernel took the CPU from each of the process's threads while it
# could still run (nonvoluntary context switches), one "path:count" line a
# thread. A thread may end between the listing and the read: tolerated.
preemptions() { grep -H '^nonvoluntary_ctxt_switches' /proc/"$1"/task/*/status 2>/dev/null || true; }
# The switches between two such readings, thread by thread: a thread born
# in between counts from zero, one that ended loses only this row's share.
preempted_between() {
    awk -F: 'NR == FNR { b[$1] = $NF; next } { n += $NF - b[$1] } END { print n + 0 }' \
        <(printf '%s\n' "$1") <(printf '%s\n' "$2")
}
# The store server's CPU: utime+stime of every process named $1
# (PostgreSQL's backends included), one "pid:ticks" line each.
store_ticks() {
    local p
    for p in $(pgrep -x "$1" || true); do
        awk -v p="$p" '{print p ":" $14 + $15}' "/proc/$p/stat" 2>/dev/null || true
    done
}
TICK_US=$((1000000 / $(getconf CLK_TCK)))
# The whole machine's CPU ticks, all cores, from /proc/stat: "busy idle"
# (idle counts iowait). Over a row: every process's CPU a request (wrk,
# the upstream, the gateway, the store server, the kernel's softirqs), and
# how much of the two cores was left idle. A row that leaves none idle is
# bound by CPU: its rate is at most the cores' time over the machine's CPU
# a request.
machine_ticks() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6 }' /proc/stat; }
RUN_ID=$RANDOM

# row NAME URL SCRIPT PID [STORE_PROCESS]
row() {
    local name="$1" url="$2" script="$3" pid="$4" store_process="${5:-}"
    echo "$name" | grep -Eq "$ROWS" || return 0
    local lua="$WORK/run.lua"
    sed "s/RUN/$RUN_ID$RANDOM/" "$WORK/$script.lua" >"$lua"
    # A short warm-up (connections, the replayed key's first execution).
    wrk -t2 -c"$CONNS" -d1s -s "$lua" "$url" >/dev/null 2>&1 || true
    sed "s/RUN/$RUN_ID$RANDOM/" "$WORK/$script.lua" >"$lua"
    local before after out preempted_before preempted_after
    local store_before="" store_after="" machine_before machine_after
    machine_before="$(machine_ticks)"
    before="$(cpu_ticks "$pid")"
    preempted_before="$(preemptions "$pid")"
    [ -n "$store_process" ] && store_before="$(store_ticks "$store_process")"
    local perfs=()
    if [ -n "${IDEM_BENCH_PERF:-}" ] && [ -n "$store_process" ] && [ "$script" = new ]; then
        mkdir -p "$IDEM_BENCH_PERF"
        local tag="${store_process%%-*}"
        perf record -q -g -o "$IDEM_BENCH_PERF/$tag.gateway.data" -p "$pid" -- sleep "$SECS" >/dev/null 2>&1 &
        perfs+=($!)
        perf record -q -g -o "$IDEM_BENCH_PERF/$tag.server.data" -p "$(pgrep -d, -x "$store_process")" -- sleep "$SECS" >/dev/null 2>&1 &
        perfs+=($!)
        # The system calls and switches of each side over the row (divide
        # by the requests in the row's line): how many reads and writes a
        # key's store calls cost.
        local events=context-switches
        local call
        for call in read write readv writev recvfrom sendto recvmsg sendmsg epoll_wait futex fsync fdatasync pwrite64; do
            events="$events,syscalls:sys_enter_$call"
        done
        perf stat -x, -e "$events" -o "$IDEM_BENCH_PERF/$tag.gateway.syscalls.txt" -p "$pid" -- sleep "$SECS" >/dev/null 2>&1 &
        perfs+=($!)
        perf stat -x, -e "$events" -o "$IDEM_BENCH_PERF/$tag.server.syscalls.txt" -p "$(pgrep -d, -x "$store_process")" -- sleep "$SECS" >/dev/null 2>&1 &
        perfs+=($!)
    fi
    out="$(wrk -t2 -c"$CONNS" -d"${SECS}s" --latency -s "$lua" "$url")"
    for p in "${perfs[@]}"; do wait "$p" || true; done
    after="$(cpu_ticks "$pid")"
    machine_after="$(machine_ticks)"
    preempted_after="$(preemptions "$pid")"
    [ -n "$store_process" ] && store_after="$(store_ticks "$store_process")"
    local rps reqs p99 non2xx
    rps="$(echo "$out" | awk '/^Requests\/sec/ {print $2}')"
    reqs="$(echo "$out" | awk '/requests in/ {print $1}')"
    p99="$(echo "$out" | awk '$1 == "99%" {print $2}')"
    non2xx="$(echo "$out" | awk '/Non-2xx/ {print $5}')"
    local cpu_us=$(( (after - before) * TICK_US / (reqs > 0 ? reqs : 1) ))
    local preempted
    preempted="$(awk -v n="$(preempted_between "$preempted_before" "$preempted_after")" -v r="$reqs" \
        'BEGIN { printf "%.3f", n / (r > 0 ? r : 1) }')"
    # A store process born during the row counts from zero; one that
    # ended loses its share (none do: the gateway's pool lives on).
    local store_us="-"
    if [ -n "$store_process" ]; then
        store_us="$(awk -F: -v r="$reqs" -v t="$TICK_US" \
            'NR == FNR { b[$1] = $2; next } { n += $2 - b[$1] } END { printf "%d", n * t / (r > 0 ? r : 1) }' \
            <(printf '%s\n' "$store_before") <(printf '%s\n' "$store_after"))"
    fi
    local machine_us idle_pct
    read -r machine_us idle_pct < <(awk -v b="$machine_before" -v a="$machine_after" -v r="$reqs" -v t="$TICK_US" \
        'BEGIN { split(b, x, " "); split(a, y, " "); busy = y[1] - x[1]; idle = y[2] - x[2];
                 printf "%d %.0f\n", busy * t / (r > 0 ? r : 1), 100 * idle / (busy + idle > 0 ? busy + idle : 1) }')
    LAST_REQS="$reqs"
    if [ "${#perfs[@]}" -gt 0 ]; then echo "$reqs" >"$IDEM_BENCH_PERF/${store_process%%-*}.requests"; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$ROUND" "$name" "$rps" "$p99" "$cpu_us" "${non2xx:-0}" "$preempted" "$store_us" "$machine_us" "$idle_pct" >>"$WORK/rows.tsv"
    printf 'bench: %-40s %10s req/s  p99 %-8s %5s us/req  store %s us/req  machine %s us/req, %s%% idle  preempted %s/req  non-2xx %s\n' "$name" "$rps" "$p99" "$cpu_us" "$store_us" "$machine_us" "$idle_pct" "$preempted" "${non2xx:-0}" >&2
}

# gateway NAME STORE: starts `idem serve`, runs its rows, stops it.
gateway() {
    local name="$1" store="$2"
    local port admin
    port="$(free_port)"; admin="$(free_port)"
    # The benchmark's Redis runs without appendonly, which idem serve
    # refuses unless told to accept it (builds older than that check,
    # run through IDEM_BENCH_BIN, know no such flag).
    local accept=()
    case "$store" in redis*)
        if "$BIN" serve --help | grep -q -- --accept-volatile-store; then
            accept=(--accept-volatile-store)
        fi
        ;;
    esac
    "$BIN" serve --upstream "http://127.0.0.1:$UP" --store "$store" \
        --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
        --max-connections 4096 "${accept[@]}" >"$WORK/idem-$name.log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 100); do
        curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
        sleep 0.1
    done
    if [ "$name" = memory ]; then
        row "idem passthrough (GET, no key)" "http://127.0.0.1:$port/transfers" get "$pid"
    fi
    local server=""
    case "$store" in postgres*) server=postgres ;; redis*) server=redis-server ;; mysql*) server=mariadbd ;; esac
    # Redis's own account of its work (per command, scripts' inner calls
    # included) over the new-keys row, beside the profiles.
    if [ "$name" = redis ] && [ -n "${IDEM_BENCH_PERF:-}" ]; then
        redis-cli -u "$IDEM_TEST_REDIS_URL" config resetstat >/dev/null
    fi
    local counted_before=""
    if [ -n "${IDEM_BENCH_PERF:-}" ]; then counted_before="$(store_counters "$name")"; fi
    row "idem $name new keys" "http://127.0.0.1:$port/transfers" new "$pid" "$server"
    if [ "$name" = redis ] && [ -n "${IDEM_BENCH_PERF:-}" ]; then
        redis-cli -u "$IDEM_TEST_REDIS_URL" info commandstats >"$IDEM_BENCH_PERF/redis.commandstats.txt"
    fi
    if [ -n "$counted_before" ]; then
        per_request "$counted_before" "$(store_counters "$name")" "${LAST_REQS:-0}" \
            >"$IDEM_BENCH_PERF/$name.counters.txt"
        sed "s/^/bench: $name new keys, a request: /" "$IDEM_BENCH_PERF/$name.counters.txt" >&2
    fi
    row "idem $name replays" "http://127.0.0.1:$port/transfers" replay "$pid" "$server"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

# The store server's own counters (statements, transactions, log
# flushes), "name value" lines; nothing for a store without them. Read
# around the new-keys row under IDEM_BENCH_PERF: the batches' shape a
# request (how many statements and commits a key costs the server).
store_counters() {
    case "$1" in
    mysql)
        python3 - "$IDEM_TEST_MYSQL_URL" <<'PY' 2>/dev/null || true
import subprocess, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
names = ("Questions", "Com_commit", "Com_insert", "Com_update", "Com_select", "Com_delete",
         "Com_call_procedure", "Handler_commit", "Handler_update", "Handler_write",
         "Innodb_log_writes", "Innodb_data_fsyncs", "Com_stmt_execute", "Bytes_received")
out = subprocess.run(["mariadb", "-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306),
                      "-u", u.username or "root", "-N", "-e",
                      "SHOW GLOBAL STATUS WHERE Variable_name IN (%s)" %
                      ",".join("'%s'" % n for n in names)],
                     check=True, capture_output=True, text=True).stdout
print(out.replace("\t", " "), end="")
PY
        ;;
    postgres)
        psql -qAt -F' ' "$IDEM_TEST_POSTGRES_URL" -c "
            SELECT 'xact_commit', xact_commit FROM pg_stat_database WHERE datname = current_database()
            UNION ALL SELECT 'xact_rollback', xact_rollback FROM pg_stat_database WHERE datname = current_database()
            UNION ALL SELECT 'wal_records', wal_records FROM pg_stat_wal
            UNION ALL SELECT 'wal_sync', wal_sync FROM pg_stat_wal
            UNION ALL SELECT 'wal_bytes', wal_bytes::bigint FROM pg_stat_wal" 2>/dev/null || true
        ;;
    esac
}
# per_request BEFORE AFTER REQUESTS: each counter's growth over the
# requests, to two decimals.
per_request() {
    awk -v r="$3" 'NR == FNR { b[$1] = $2; next }
        ($1 in b) { printf "%s %.2f\n", $1, ($2 - b[$1]) / (r > 0 ? r : 1) }' \
        <(printf '%s\n' "$1") <(printf '%s\n' "$2")
}

drop_mysql() {
    python3 - "$IDEM_TEST_MYSQL_URL" <<'PY' 2>/dev/null || true
import subprocess, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
subprocess.run(["mariadb", "-h", u.hostname or "127.0.0.1", "-P", str(u.port or 3306),
                "-u", u.username or "root", "-e", "DROP DATABASE IF EXISTS idem"], check=False)
PY
}
drop_postgres() {
    psql -q "$IDEM_TEST_POSTGRES_URL" -c 'DROP SCHEMA IF EXISTS idem CASCADE' >/dev/null 2>&1 || true
}
# The gateway's records under the default prefix (keys hold spaces: one
# per line).
drop_redis() {
    redis-cli -u "$IDEM_TEST_REDIS_URL" --scan --pattern 'idem:*' |
        xargs -r -d '\n' -n 2000 redis-cli -u "$IDEM_TEST_REDIS_URL" unlink >/dev/null
}

: >"$WORK/rows.tsv"
for ROUND in $(seq 1 "$ROUNDS"); do
    row "upstream reached directly" "http://127.0.0.1:$UP/transfers" new "$NGINX_WORKER"
    row "nginx proxy hop" "http://127.0.0.1:$HOP/transfers" new "$NGINX_WORKER"
    row "nginx hop in a process of its own" "http://127.0.0.1:$APART/transfers" new "$APART_WORKER"
    gateway memory memory:
    rm -f "$WORK"/idem.db*
    gateway sqlite "sqlite:$WORK/idem.db"
    if [ -n "${IDEM_TEST_POSTGRES_URL:-}" ]; then
        drop_postgres
        gateway postgres "$IDEM_TEST_POSTGRES_URL"
        drop_postgres
    fi
    if [ -n "${IDEM_TEST_MYSQL_URL:-}" ]; then
        drop_mysql
        gateway mysql "$IDEM_TEST_MYSQL_URL"
        drop_mysql
    fi
    if [ -n "${IDEM_TEST_REDIS_URL:-}" ]; then
        drop_redis
        gateway redis "$IDEM_TEST_REDIS_URL"
        drop_redis
    fi
done

python3 - "$WORK/rows.tsv" "$CONNS" "$SECS" "$ROUNDS" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
hops = {r[0]: float(r[2]) for r in rows if r[1] == "nginx proxy hop"}
names, by_name = [], {}
for rnd, name, rps, p99, cpu, bad, preempted, store, machine, idle in rows:
    if name not in by_name:
        names.append(name)
        by_name[name] = []
    by_name[name].append((rnd, float(rps), p99, int(cpu), int(bad), float(preempted), store,
                          int(machine), int(idle)))

def ms(p99):
    # wrk prints us, ms or s.
    for unit, scale in (("us", 0.001), ("ms", 1.0), ("s", 1000.0)):
        if p99.endswith(unit):
            return float(p99[: -len(unit)]) * scale
    return float("nan")

rounds = int(sys.argv[4])
print(f"wrk -t2 -c{sys.argv[2]}, {sys.argv[3]} s a row, {rounds} round(s), medians\n")
print("| row | req/s | × nginx hop | p99 ms | CPU µs/request | store server CPU µs/request | machine CPU µs/request | machine idle % | preempted/request | non-2xx |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for name in names:
    runs = by_name[name]
    ratios = [rps / hops[rnd] for rnd, rps, *_ in runs if hops.get(rnd)]
    ratio = f"{statistics.median(ratios):.2f}" if ratios else "-"
    rps = statistics.median(r[1] for r in runs)
    p99 = statistics.median(ms(r[2]) for r in runs)
    cpu = statistics.median(r[3] for r in runs)
    bad = sum(r[4] for r in runs)
    preempted = statistics.median(r[5] for r in runs)
    stores = [int(r[6]) for r in runs if r[6] != "-"]
    store = f"{statistics.median(stores):.0f}" if stores else "-"
    machine = statistics.median(r[7] for r in runs)
    idle = statistics.median(r[8] for r in runs)
    print(f"| {name} | {rps:,.0f} | {ratio} | {p99:.1f} | {cpu:.0f} | {store} | {machine:.0f} | {idle:.0f} | {preempted:.3f} | {bad} |")
EOF
