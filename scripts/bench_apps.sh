#!/usr/bin/env bash
# Many apps, one process: 100 apps × 20 executors kept by one `podalloc apps --file` against
# 100 separate cron-style `podalloc reconcile` runs (one process per app and pass), on the
# built-in simulator. Measures wall time and API requests to converge and per steady pass,
# the list bytes per pass, and peak RSS (GNU time). About 1–2 minutes after the build.
#
#   scripts/bench_apps.sh             # prints the table (Markdown) and keeps raw logs
#   APPS=20 EXECUTORS=10 scripts/bench_apps.sh   # a smaller run
#
# Needs: cargo, python3 (standard library), GNU time (/usr/bin/time). Loopback only.
# Raw results: <target dir>/bench-apps/.
set -euo pipefail

apps=${APPS:-100}
execs=${EXECUTORS:-20}
cd "$(dirname "$0")/.."
[ -x /usr/bin/time ] || { echo "bench_apps.sh: GNU time (/usr/bin/time) is needed" >&2; exit 2; }

cargo build --release --quiet
target_dir=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin="$target_dir/release/podalloc"
out="$target_dir/bench-apps"
rm -rf "$out"
mkdir -p "$out/one" "$out/cron"

# The simulator: plain HTTP on loopback, no auth, quick pods.
"$bin" sim --http --no-auth --write-kubeconfig "$out/kubeconfig" \
    --schedule-latency 50ms --startup-latency 200ms --nodes 50 >"$out/sim.log" 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q 'serving' "$out/sim.log" 2>/dev/null && break; sleep 0.1; done
server=$(python3 -c 'import sys,json
print(json.load(open(sys.argv[1]))["clusters"][0]["cluster"]["server"])' "$out/kubeconfig")

stats() { # requests lists creates live_pods
    python3 -c 'import json,sys,urllib.request
s=json.load(urllib.request.urlopen(sys.argv[1]+"/sim/stats"))
print(s["requests"], s["lists"], s["creates"], s["live_pods"])' "$server"
}
list_bytes() { # NS SELECTOR → bytes of the paginated list (limit 500)
    python3 -c 'import json,sys,urllib.request,urllib.parse
srv,ns,sel=sys.argv[1:4]; total=0; cont=""
while True:
    q=urllib.parse.urlencode({"labelSelector":sel,"limit":"500","continue":cont})
    b=urllib.request.urlopen(f"{srv}/api/v1/namespaces/{ns}/pods?{q}").read()
    total+=len(b); cont=json.loads(b)["metadata"].get("continue","")
    if not cont: break
print(total)' "$server" "$1" "$2"
}
now() { date +%s.%N; }
pa=("$bin" --kubeconfig "$out/kubeconfig" --batch-size "$execs")

# 1. One process for every app (namespace "one").
{
    echo "apps:"
    for i in $(seq "$apps"); do
        printf -- '- app-id: app-%s\n  namespace: one\n  image: spark:3.5\n  target: %s\n' "$i" "$execs"
    done
} >"$out/apps.yaml"
read -r r0 _ _ _ < <(stats)
t0=$(now)
/usr/bin/time -v "${pa[@]}" --log-level info --batch-delay 200ms apps --file "$out/apps.yaml" \
    --state-dir "$out/one" --until-converged --timeout 150s 2>"$out/one.log"
t1=$(now)
read -r r1 _ _ live1 < <(stats)
passes=$(grep -o 'after [0-9]* pass' "$out/one.log" | grep -o '[0-9]*' || echo '?')
rss_one=$(grep 'Maximum resident' "$out/one.log" | grep -o '[0-9]*$')
t2=$(now)
/usr/bin/time -v "${pa[@]}" --log-level warn apps --file "$out/apps.yaml" --state-dir "$out/one" --once \
    2>"$out/one-pass.log"
t3=$(now)
read -r r2 _ _ _ < <(stats)
rss_pass=$(grep 'Maximum resident' "$out/one-pass.log" | grep -o '[0-9]*$')
bytes_one=$(list_bytes one spark-role=executor)

# 2. One cron-style process per app and pass (namespace "cron").
cron_pass() { # → max RSS in KB of the pass's processes
    local max=0 i rss
    for i in $(seq "$apps"); do
        /usr/bin/time -f '%M' -o "$out/cron/rss" "${pa[@]}" --log-level warn -n cron --app-id "app-$i" \
            --image spark:3.5 --state-file "$out/cron/app-$i.json" reconcile --target "$execs" \
            2>>"$out/cron.log" || true
        rss=$(tail -1 "$out/cron/rss")
        [ "$rss" -gt "$max" ] && max=$rss
    done
    echo "$max"
}
read -r c0 _ _ _ < <(stats)
t4=$(now)
cron_passes=0
rss_cron=0
while :; do
    cron_passes=$((cron_passes + 1))
    m=$(cron_pass)
    [ "$m" -gt "$rss_cron" ] && rss_cron=$m
    read -r _ _ _ live < <(stats)
    # Converged: every executor live in both namespaces, and a pass that created nothing.
    if [ "$live" -ge $((2 * apps * execs)) ]; then
        read -r ca _ _ _ < <(stats)
        m=$(cron_pass)
        read -r cb _ _ _ < <(stats)
        [ $((cb - ca)) -le $((2 * apps)) ] && break
    fi
    [ "$cron_passes" -ge 30 ] && { echo "bench_apps.sh: cron runs did not converge" >&2; exit 1; }
done
t5=$(now)
read -r c1 _ _ _ < <(stats)
t6=$(now)
cron_pass >/dev/null
t7=$(now)
read -r c2 _ _ _ < <(stats)
bytes_cron=0
for i in $(seq "$apps"); do
    b=$(list_bytes cron "spark-app-selector=app-$i,spark-role=executor")
    bytes_cron=$((bytes_cron + b))
done

python3 - "$apps" "$execs" "$t0" "$t1" "$t2" "$t3" "$t4" "$t5" "$t6" "$t7" "$r0" "$r1" "$r2" \
    "$c0" "$c1" "$c2" "$passes" "$cron_passes" "$rss_one" "$rss_pass" "$rss_cron" \
    "$bytes_one" "$bytes_cron" "$live1" <<'EOF'
import sys
a = sys.argv[1:]
apps, execs = int(a[0]), int(a[1])
t = [float(x) for x in a[2:10]]
r0, r1, r2, c0, c1, c2 = (int(x) for x in a[10:16])
passes, cron_passes = a[16], a[17]
rss_one, rss_pass, rss_cron = (int(x) // 1024 for x in a[18:21])
bytes_one, bytes_cron = int(a[21]), int(a[22])
print(f"{apps} apps × {execs} executors ({apps*execs} pods), release build, simulator on loopback:\n")
print("| | one `podalloc apps` process | one `podalloc reconcile` per app |")
print("|---|---|---|")
print(f"| converge: wall time | {t[1]-t[0]:.1f} s ({passes} passes) | {t[5]-t[4]:.1f} s ({cron_passes} pass(es) of {apps} runs, then 1 idle pass to confirm) |")
print(f"| converge: API requests | {r1-r0} | {c1-c0} |")
print(f"| one steady pass: wall time | {t[3]-t[2]:.2f} s | {t[7]-t[6]:.2f} s |")
print(f"| one steady pass: API requests | {r2-r1} | {c2-c1} |")
print(f"| one steady pass: executor list bytes | {bytes_one:,} (1 list, {-(-apps*execs//500)} pages) | {bytes_cron:,} ({apps} lists) |")
print(f"| peak RSS | {rss_one} MiB (converging), {rss_pass} MiB (one pass) | {rss_cron} MiB per process, {apps} processes a pass |")
EOF
