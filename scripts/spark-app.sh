#!/usr/bin/env bash
# A real Spark application whose executors podalloc allocates (issue 29, item 3).
#
#   scripts/spark-app.sh OUT
#
# Starts the real control plane (scripts/controlplane.sh start OUT/cp: kube-apiserver + etcd,
# the audit log also covering every request in namespace `spark`), installs the ExecutorSet
# CRD (deploy/crd.yaml), the namespace and its RBAC: deploy/rbac.yaml's Role bound to user
# `podalloc` (its own static token, not an admin), and a Role for the driver's user
# `spark-driver`. Then the process kubelet (crates/podalloc-sim/examples/kubelet.rs
# --classpath-file: every executor pod runs as a local JVM), podalloc (`run --state-store
# executorset:spark-app`), and a Spark 4.1.1 driver in client mode (spark/app, its allocator
# spark/plugin's podalloc.spark.ExecutorSetPodsAllocator) running a two-phase job with dynamic
# allocation (0..4 executors, idle timeout 10 s, an idle gap of SPARK_APP_GAP s between the
# phases, default 30); each phase ends with a stage in a second resource profile (id 1:
# executors of 2 cores and 640m), which the plugin hands to podalloc as ExecutorSet
# spark-app-rp1.
#
# Leaves in OUT: driver.log, executors/<pod>.log (one per executor process), audit.log
# (kube-apiserver's, Metadata level; pod creates at Request level), podalloc.log, kubelet.log,
# cpu.json (CPU seconds of kube-apiserver, etcd and podalloc over the run) and summary.json
# (from scripts/spark_app_summary.py, which also decides the exit status).
# Exits non-zero unless the answer is right (the second profile's tasks included: they ran on
# executors of profile 1), every executor pod create was made by podalloc's user and none by
# the driver's, podalloc created pods labelled spark-exec-resourceprofile-id 0 and 1, at least
# two executors ran tasks, and executors were released in the idle gap and created again for
# phase two.
#
# Environment:
#   SPARK_APP_ALLOCATOR=podalloc|direct  `direct`: Spark's own allocator creates the pods
#                         (podalloc is not started; the podalloc-identity check is off)
#   SPARK_APP_GAP=S       the idle gap (default 30; must exceed the 10 s idle timeout + 5 s)
#   SPARK_APP_PROFILES=1|2  2 (default): the job's second resource profile; 1: profile 0 only
#   SPARK_APP_PODALLOC_ARGS  more flags for podalloc's `run` (e.g. --idle-interval 1s)
#   PODALLOC, KUBELET     the binaries (default: target/release/{podalloc,examples/kubelet},
#                         built with cargo --release --locked unless present)
# Needs java 17+ and mvn (under CI=true installed with apt-get if missing), kubectl, python3
# and the control plane (scripts/controlplane.sh build, cached). Maven artefacts: ~/.m2.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[ -n "${1:-}" ] || { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
allocator=${SPARK_APP_ALLOCATOR:-podalloc}
gap=${SPARK_APP_GAP:-30}
profiles=${SPARK_APP_PROFILES:-2}
case "$profiles" in
  1) second=false; profile_ids= ;;
  2) second=true; profile_ids=0,1 ;;
  *) echo "spark-app: SPARK_APP_PROFILES is 1 or 2, not $profiles" >&2; exit 2 ;;
esac
ns=spark
set_name=spark-app
app_id="spark-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
say() { echo "spark-app: $*"; }

need() { command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; }
if ! need; then
  if [ "${CI:-}" != "true" ]; then
    say "java or mvn not found; install a JDK 17 and Maven" >&2
    exit 1
  fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
fi

# Binaries and jars.
started=$(date +%s)
podalloc=${PODALLOC:-target/release/podalloc}
kubelet=${KUBELET:-target/release/examples/kubelet}
[ -x "$podalloc" ] || cargo build --release --locked --quiet --bin podalloc
[ -x "$kubelet" ] || cargo build --release --locked --quiet -p podalloc-sim --example kubelet
(cd spark/app && mvn -B -q package)
(cd spark/plugin && mvn -B -q package)
classpath=$(cat spark/app/target/classpath.txt)
app_jar=$root/spark/app/target/spark-app.jar
plugin_jar=$root/spark/plugin/target/4.1.1/podalloc-spark-plugin.jar
bash scripts/controlplane.sh build >/dev/null
say "built in $(( $(date +%s) - started )) s"

# The control plane, with the driver's user and the namespace's audit.
cp_dir=$out/cp
pids=()
# CPU seconds (user + system) a live process has used so far, from /proc/PID/stat.
cpu_seconds() {
  [ -r "/proc/$1/stat" ] || { echo null; return; }
  awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f\n", ($12 + $13) / hz }' "/proc/$1/stat"
}
podalloc_pid=
cleanup() {
  local p
  # What the run cost in CPU, read before anything stops: the server's (kube-apiserver +
  # etcd, the whole run: setup, kubelet and driver included) and podalloc's.
  if [ -f "$cp_dir/kube-apiserver.pid" ] && [ ! -f "$out/cpu.json" ]; then
    printf '{"kube_apiserver_s": %s, "etcd_s": %s, "podalloc_s": %s}\n' \
      "$(cpu_seconds "$(cat "$cp_dir/kube-apiserver.pid")")" \
      "$(cpu_seconds "$(cat "$cp_dir/etcd.pid" 2>/dev/null)")" \
      "$( [ -n "$podalloc_pid" ] && cpu_seconds "$podalloc_pid" || echo null)" >"$out/cpu.json"
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  [ -f "$cp_dir/audit.log" ] && cp "$cp_dir/audit.log" "$out/audit.log"
  bash scripts/controlplane.sh stop "$cp_dir" >/dev/null 2>&1 || true
}
trap cleanup EXIT
rm -rf "$cp_dir" "$out/executors" "$out/pods" "$out/cpu.json"
PODALLOC_CP_USERS=spark-driver PODALLOC_CP_AUDIT_NAMESPACES=$ns PODALLOC_CP_WATCH_PID=$$ \
  bash scripts/controlplane.sh start "$cp_dir"
url=$(cat "$cp_dir/url")
k() { kubectl --kubeconfig "$cp_dir/admin.kubeconfig" "$@"; }
k create namespace "$ns" >/dev/null
if [ "$allocator" = podalloc ]; then
  k apply -f deploy/crd.yaml >/dev/null
  k wait --for condition=established --timeout=60s crd/executorsets.podalloc.io >/dev/null
fi
sed "s/namespace: batch/namespace: $ns/" deploy/rbac.yaml | k apply -f - >/dev/null
k apply -f - >/dev/null <<EOF
# podalloc runs as the static-token user podalloc (scripts/controlplane.sh), with exactly
# deploy/rbac.yaml's Role.
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: podalloc-user, namespace: $ns}
subjects: [{kind: User, name: podalloc, apiGroup: rbac.authorization.k8s.io}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: podalloc}
---
# What a Spark driver with the plugin needs in client mode (spark/README.md, "Your own Spark
# job"): it watches its executor pods, deletes the ones it kills and the ended ones, and the
# rest at stop; it never creates one with allocator podalloc (direct: Spark creates them).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: spark-driver, namespace: $ns}
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete, deletecollection$( [ "$allocator" = direct ] && echo ", create")]
- apiGroups: [""]
  resources: [configmaps, services, persistentvolumeclaims]
  verbs: [get, list, create, delete, deletecollection]
- apiGroups: [podalloc.io]
  resources: [executorsets]
  verbs: [get, create, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: spark-driver, namespace: $ns}
subjects: [{kind: User, name: spark-driver, apiGroup: rbac.authorization.k8s.io}]
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: spark-driver}
EOF

# The process kubelet.
"$kubelet" --server "$url" --ca "$cp_dir/pki/ca.crt" --token-file "$cp_dir/admin.token" \
  --namespace "$ns" --schedule-ms 20 --startup-ms 20 \
  --classpath-file spark/app/target/classpath.txt --work-dir "$out/pods" \
  --log-dir "$out/executors" >"$out/kubelet.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do grep -q emulating "$out/kubelet.log" && break; sleep 0.1; done
grep -q emulating "$out/kubelet.log" || { say "the kubelet did not start:"; cat "$out/kubelet.log"; exit 1; }

# podalloc, as user podalloc, following the ExecutorSet (Spark 3.1+'s rules, the app's idle
# timeout; ticks every second while something is in flight, as Spark's batch delay; at rest
# it reads the ExecutorSet every second and lists the pods every --idle-interval, 30 s by
# default; SPARK_APP_PODALLOC_ARGS adds flags, e.g. --idle-interval 1s). The executor template is the one the
# driver's plugin writes into the ExecutorSet (it wins over flags); `run` still insists on a
# template of its own at start, so --image gives a stand-in that is never used. --target 0
# seeds the ExecutorSet podalloc creates when the driver has not yet (a seed never
# overwrites a spec.replicas that is there).
allocator_conf=()
if [ "$allocator" = podalloc ]; then
  "$podalloc" run --kubeconfig "$cp_dir/podalloc.kubeconfig" --namespace "$ns" \
    --app-id "$app_id" --state-store "executorset:$set_name" --image spark-executor \
    --target 0 --policy spark-3.x \
    --executor-idle-timeout 10s --batch-delay 1s --interval 1s ${SPARK_APP_PODALLOC_ARGS:-} \
    >"$out/podalloc.log" 2>&1 &
  podalloc_pid=$!
  pids+=($!)
  allocator_conf=(spark.kubernetes.allocation.pods.allocator=podalloc.spark.ExecutorSetPodsAllocator
    spark.podalloc.executorSet=$set_name)
fi

# The driver (client mode), as spark-submit would start it.
java_opts=$(java -cp "$app_jar:$classpath" podalloc.sparkapp.ModuleOptions)
say "driver of $app_id with allocator $allocator (gap ${gap} s)"
driver_started=$(date +%s%3N)
set +e
# shellcheck disable=SC2086
java -Xmx1g $java_opts -cp "$app_jar:$plugin_jar:$classpath" podalloc.sparkapp.Job \
  spark.master="k8s://$url" spark.submit.deployMode=client spark.app.name=podalloc-spark-app \
  spark.app.id="$app_id" spark.driver.host=127.0.0.1 spark.driver.bindAddress=127.0.0.1 \
  spark.kubernetes.namespace=$ns spark.kubernetes.container.image=spark-executor \
  spark.kubernetes.authenticate.caCertFile="$cp_dir/pki/ca.crt" \
  spark.kubernetes.authenticate.oauthToken="$(tr -d '\n' <"$cp_dir/spark-driver.token")" \
  spark.executor.memory=512m spark.executor.cores=1 spark.ui.enabled=false \
  spark.jars="$app_jar" \
  spark.dynamicAllocation.enabled=true spark.dynamicAllocation.shuffleTracking.enabled=true \
  spark.dynamicAllocation.shuffleTracking.timeout=5s spark.dynamicAllocation.minExecutors=0 \
  spark.dynamicAllocation.maxExecutors=4 spark.dynamicAllocation.executorIdleTimeout=10s \
  spark.dynamicAllocation.schedulerBacklogTimeout=1s podalloc.app.gapSeconds="$gap" \
  podalloc.app.secondProfile="$second" \
  "${allocator_conf[@]}" >"$out/driver.log" 2>&1
driver_status=$?
set -e
driver_ended=$(date +%s%3N)
say "driver exited $driver_status after $(( (driver_ended - driver_started) / 1000 )) s"
grep 'podalloc-spark-app: result=' "$out/driver.log" || true
sleep 3
cleanup
trap - EXIT
python3 scripts/spark_app_summary.py "$out" --allocator "$allocator" --app-id "$app_id" \
  --driver-status "$driver_status" --driver-started "$driver_started" --driver-ended "$driver_ended" \
  --profiles "$profile_ids"
