#!/usr/bin/env bash
# The protocol model (crates/idem-model) at its deep bounds: every
# scenario of `idem_model::scenarios` with three gateways, three requests
# each, ticks 0 to 12, a lease of three ticks and two crashes. The safe
# scenarios are explored exhaustively (the default policy's is about 12
# million distinct states: a minute and 2 GiB on one core); each unsafe
# one stops at its shortest counterexample, which is printed. Exits
# non-zero if a verdict is not the expected one. The counts are in
# docs/decisions.md, "The protocol model (issue 36)"; CI runs the same
# scenarios at smaller bounds (`cargo test -p idem-model`).
#
#   IDEM_MODEL_THREADS  checker threads (default 1: the counts are the
#                       same with more, the paths may differ)
#   IDEM_MODEL_ARGS     overrides of the bounds, e.g.
#                       "gateways=2 horizon=16 crashes=3"
set -euo pipefail
cd "$(dirname "$0")/.."

threads="${IDEM_MODEL_THREADS:-1}"
cargo build -q --release -p idem-model --example check
# shellcheck disable=SC2086 # IDEM_MODEL_ARGS is a list of words
./target/release/examples/check deep "threads=$threads" ${IDEM_MODEL_ARGS:-}
