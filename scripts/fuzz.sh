#!/usr/bin/env bash
# Long fuzzing run of the untrusted-input parsers (PodList, state, template, kubeconfig, Status,
# and the JSON reader under the PodList decoder):
# proptest with arbitrary bytes and mutations of fixtures/fuzz/*. Usage: scripts/fuzz.sh [CASES]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-100000}
echo "fuzzing with $cases cases per parser (kubeconfig: $((cases / 10 + 1)))"
PROPTEST_CASES=$cases cargo test --release --test integration -- fuzz:: --test-threads 2
# The JSON reader under the list decoder against serde_json and its own byte-loop reference.
PROPTEST_CASES=$cases cargo test --release --lib -- snapshot::json snapshot::stream --test-threads 2
