#!/usr/bin/env bash
# Long fuzzing run of the untrusted-input parsers (PodList, state, template, kubeconfig, Status):
# proptest with arbitrary bytes and mutations of fixtures/fuzz/*. Usage: scripts/fuzz.sh [CASES]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-100000}
echo "fuzzing with $cases cases per parser (kubeconfig: $((cases / 10 + 1)))"
PROPTEST_CASES=$cases cargo test --release --test integration -- fuzz:: --test-threads 2
