# Shared by the bench scripts (sourced, not run): which idem binary to
# measure, and a free local port.

# Sets BIN: IDEM_BENCH_BIN (an older build, for before/after) or this
# tree's release build, built first.
idem_binary() {
    if [ -z "${IDEM_BENCH_BIN:-}" ]; then
        cargo build -q --release -p idem-cli
        BIN="$PWD/target/release/idem"
    else
        BIN="$IDEM_BENCH_BIN"
    fi
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
