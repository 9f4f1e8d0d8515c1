#!/usr/bin/env bash
# podalloc benchmarks: tick cost against curl and kubectl, and convergence of the allocation
# policies on the simulator. Writes the results into docs/benchmarks.md.
#
#   scripts/bench.sh            # the full run (about 5 minutes plus the release build, 2 CPUs)
#   scripts/bench.sh --quick    # a smoke run (about 3 minutes): 10,000 pods, a 300-executor
#                               # convergence; results go to target/bench/ only
#   scripts/bench.sh --no-docs  # full run, leave docs/benchmarks.md alone
#
# BENCH_COMPARE=NAME=PATH adds another podalloc binary (e.g. an older commit's) to the tick
# benchmark, run in the same interleaved rounds.
#
# Needs: cargo, python3 (standard library only), curl, GNU time (/usr/bin/time; installed
# with apt-get when missing and running as root), kubectl (optional: the kubectl columns are
# left empty without it). Set KUBECTL=/path/to/kubectl to choose one. Loopback only.
# Honours CARGO_TARGET_DIR. Raw results: <target dir>/bench/{tick,converge}.json and logs.
set -euo pipefail

quick=0
docs=1
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1; docs=0 ;;
        --no-docs) docs=0 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
start=$(date +%s)

need() { command -v "$1" >/dev/null 2>&1 || { echo "bench.sh: $1 is needed${2:+: $2}" >&2; exit 2; }; }
need cargo
need python3
need curl
if [ ! -x /usr/bin/time ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bench.sh: installing GNU time (apt-get install time)" >&2
        apt-get update -qq && apt-get install -y -qq time >/dev/null
    else
        echo "bench.sh: GNU time (/usr/bin/time) is needed: apt-get install time" >&2
        exit 2
    fi
fi

echo "bench.sh: cargo build --release" >&2
cargo build --release --quiet
cargo build --release --quiet -p podalloc-sim --example pageserver
built=$(date +%s)
target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin="$target_dir/release/podalloc"
out="$target_dir/bench"
rm -rf "$out"
mkdir -p "$out"

kubectl_args=()
if [ -n "${KUBECTL:-}" ]; then kubectl_args=(--kubectl "$KUBECTL"); fi
if [ -n "${BENCH_COMPARE:-}" ]; then kubectl_args+=(--compare "$BENCH_COMPARE"); fi

if [ "$quick" = 1 ]; then
    tick_args=(--sizes 10000 --repeats 3 --kubectl-runs 0 --single-page-runs 2)
    conv_args=(--target 300 --seed-window 60 --max-time 150)
else
    tick_args=(--sizes 10000,50000 --repeats 7,3 --kubectl-runs 1,0 --single-page-runs 3)
    conv_args=(--target 1000 --seed-window 180 --max-time 420)
fi

echo "bench.sh: benchmark 1, tick cost" >&2
python3 scripts/bench_tick.py --podalloc "$bin" --pageserver "$target_dir/release/examples/pageserver" \
    "${kubectl_args[@]}" "${tick_args[@]}" \
    --out "$out/tick.json" --workdir "$out/tick"
echo "bench.sh: benchmark 2, convergence" >&2
python3 scripts/bench_converge.py --podalloc "$bin" "${conv_args[@]}" \
    --out "$out/converge.json" --workdir "$out/converge"

end=$(date +%s)
cmd="scripts/bench.sh${*:+ $*}"
report=(python3 scripts/bench_report.py --tick "$out/tick.json" --converge "$out/converge.json"
    --command "$cmd" --build-seconds $((built - start)) --total-seconds $((end - start)))
"${report[@]}" > "$out/results.md"
if [ "$docs" = 1 ]; then
    "${report[@]}" --update docs/benchmarks.md
fi
echo "bench.sh: done in $(( (end - start) / 60 ))m$(( (end - start) % 60 ))s; results in $out/results.md" >&2
