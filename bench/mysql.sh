#!/usr/bin/env bash
# MySQL/MariaDB store: claim+complete pairs per second through MysqlStore
# (pool of 16) at 1, 16 and 256 tasks, against mysqlslap running the same
# two statements (the store's idem_claim procedure and its completion
# UPDATE) at 1, 16 and 64 clients, at read committed as the store's
# sessions. mysqlslap cannot carry the claim's fence over: the key goes in
# a session variable (one more statement) and its UPDATE matches on the
# key alone. The backend's limit is mysqlslap's best. Needs mysqlslap
# (Debian's mariadb-client) and IDEM_TEST_MYSQL_URL.
set -euo pipefail
cd "$(dirname "$0")/.."
url="${IDEM_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
secs="${IDEM_BENCH_SECS:-5}"
export IDEM_TEST_MYSQL_URL="$url" IDEM_BENCH_SECS="$secs"
# mysql://USER[:PASSWORD]@HOST[:PORT]/DB, for the command-line clients.
rest="${url#mysql://}"; userinfo="${rest%%@*}"; hostport="${rest#*@}"; hostport="${hostport%%/*}"
user="${userinfo%%:*}"; password=""; [ "$userinfo" != "$user" ] && password="${userinfo#*:}"
host="${hostport%%:*}"; port=3306; [ "$hostport" != "$host" ] && port="${hostport#*:}"
client=(-u "$user" -h "$host" -P "$port"); [ -n "$password" ] && client+=("-p$password")

mysql "${client[@]}" -e "DROP DATABASE IF EXISTS idem_bench"
cargo bench -q -p idem-mysql --bench mysql_claim_complete > target/mysql-store.txt
query=$(mktemp)
cat > "$query" <<'SQL'
SET @k = UUID();
CALL idem_bench.idem_claim('bench', 'POST /bench', @k, 0x0102, CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), 30000, 3600000);
UPDATE idem_bench.idem_records SET status = 1, resource_id = NULL, response_status = 201, response_headers = 0x00, response_body = 0x7b7d, lease_until = NULL WHERE scope = 'bench' AND operation = 'POST /bench' AND record_key = @k AND status = 0
SQL
: > target/mysql-bench.txt
for c in 1 16 64; do
    mysql "${client[@]}" -e "TRUNCATE idem_bench.idem_records"
    # mysqlslap limits each client to about this many statements (three
    # per pair); the pairs done are counted in the table afterwards.
    # The store's sessions run at read committed (no gap locks between
    # claims of new keys); so do mysqlslap's.
    seconds=$(mysqlslap "${client[@]}" --create-schema=idem_bench --query="$query" \
        --init-command="SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED" \
        --delimiter=";" --concurrency="$c" --iterations=1 --number-of-queries=$((3 * 2000)) \
        | awk '/Average number of seconds to run all queries/ {print $(NF-1)}')
    pairs=$(mysql "${client[@]}" -N -e "SELECT COUNT(*) FROM idem_bench.idem_records WHERE status = 1")
    echo "mysqlslap/$c $(python3 -c "print(round($pairs / $seconds))")" >> target/mysql-bench.txt
done
rm -f "$query"
python3 bench/ratio-table.py mysqlslap/ target/mysql-bench.txt target/mysql-store.txt
mysql "${client[@]}" -e "DROP DATABASE IF EXISTS idem_bench"
