#!/usr/bin/env bash
# Spark's own ExecutorPodsAllocator beside podalloc, decision by decision (peers/).
#
# Builds the harness in peers/spark with Maven (dependencies from Maven Central) into a cache
# outside the work tree, reused while peers/spark is unchanged:
#   ${PODALLOC_CACHE:-~/.cache/podalloc}/spark-peer/m2          Maven's local repository
#   ${PODALLOC_CACHE:-~/.cache/podalloc}/spark-peer/<version>/  the harness jar + classpath
# then runs peers/compare.py for each Spark line in SPARK_PEER_LINES (default "3.5 4.0"):
# every scenario on simulators (and, with 3.5, again at both allocators' defaults:
# compare.py --defaults), then the scenarios marked "real" on a real control plane (as they
# are and at the defaults)
# (compare.py --real: kube-apiserver + etcd from scripts/controlplane.sh, the kubelet emulator
# crates/podalloc-sim/examples/kubelet.rs, a namespace per side), and exits non-zero on a
# difference no scenario explains (see docs/semantics.md).
#
# Without java or mvn it prints one line saying it was skipped and exits 0 -- except under
# CI (CI=true), where it installs them with apt-get if it can and fails otherwise. The real
# leg needs Go (or the control plane's cache: scripts/controlplane.sh build) and kubectl;
# without them it is skipped with one line, except under CI, where that is a failure.
# Environment: PODALLOC (the binary; default target/release/podalloc, else target/debug,
# else built), SPARK_PEER_LINES, SPARK_PEER_ONLY (scenario name prefixes), SPARK_PEER_OUT,
# SPARK_PEER_REAL=0 (no real leg; refused under CI).
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; }
if ! need; then
  if [ "${CI:-}" != "true" ]; then
    echo "spark-peer: skipped (java or mvn not found); install a JDK 17 and Maven, then run scripts/spark-peer.sh"
    exit 0
  fi
  echo "spark-peer: java or mvn missing under CI: installing openjdk-17-jdk-headless and maven" >&2
  if ! { command -v apt-get >/dev/null && apt-get update -qq && \
         DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null; } || ! need; then
    echo "spark-peer: FAILED: java and mvn are required under CI and could not be installed" >&2
    exit 1
  fi
fi

cache="${PODALLOC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podalloc}/spark-peer"
mkdir -p "$cache/m2"
stamp_src=$( (cat peers/spark/pom.xml; find peers/spark/src -type f | sort | xargs cat) | sha256sum | cut -c1-16)

pod="${PODALLOC:-}"
if [ -z "$pod" ]; then
  if [ -x target/release/podalloc ]; then pod=target/release/podalloc
  elif [ -x target/debug/podalloc ]; then pod=target/debug/podalloc
  else cargo build --release --quiet; pod=target/release/podalloc; fi
fi

# The comparison's own logic first (no Java, no simulator; a second).
(cd peers && python3 -m unittest -q test_compare.py)

# The real leg: the control plane (built once, cached) and the kubelet emulator.
real=1
why=""
if [ "${SPARK_PEER_REAL:-1}" = "0" ]; then
  why="SPARK_PEER_REAL=0"
elif ! command -v kubectl >/dev/null 2>&1; then
  why="kubectl not found"
elif ! cp_out=$(bash scripts/controlplane.sh build 2>&1); then
  why="scripts/controlplane.sh build failed: $(printf '%s\n' "$cp_out" | tail -n 3)"
else
  printf '%s\n' "$cp_out" | tail -n 1
  cargo build --release --locked --quiet -p podalloc-sim --example kubelet
fi
if [ -n "$why" ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "spark-peer: FAILED: the real control plane leg is part of CI: $why" >&2
    exit 1
  fi
  real=0
  echo "spark-peer: the real control plane leg: skipped ($why)"
fi

status=0
for line in ${SPARK_PEER_LINES:-3.5 4.0}; do
  out="$cache/$line"
  if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp_src" ] && [ -f "$out/build/spark-peer.jar" ]; then
    echo "spark-peer: Spark $line harness: cached ($out)"
  else
    start=$(date +%s)
    rm -rf "$out"; mkdir -p "$out"
    if ! mvn -B -q -f peers/spark/pom.xml -Dmaven.repo.local="$cache/m2" -P"spark-$line" \
         -Dpeer.build.dir="$out/build" package >"$out/mvn.log" 2>&1; then
      echo "spark-peer: FAILED: the Spark $line harness did not build:"; tail -40 "$out/mvn.log"
      exit 1
    fi
    echo "$stamp_src" > "$out/stamp"
    echo "spark-peer: Spark $line harness built in $(( $(date +%s) - start ))s"
  fi
  args=(--jar-dir "$out/build" --podalloc "$pod")
  [ -n "${SPARK_PEER_ONLY:-}" ] && args+=(--only $SPARK_PEER_ONLY)
  [ -n "${SPARK_PEER_OUT:-}" ] && args+=(--out "$SPARK_PEER_OUT/$line")
  python3 peers/compare.py "${args[@]}" || status=1
  # At both allocators' defaults (Spark's watch source on): on simulators with Spark 3.5 only,
  # since Spark 4.0's watch source (fabric8 on Vert.x) never starts against the simulator's
  # pod watch; on the real control plane (below) with both lines.
  if [ "$line" = "3.5" ]; then
    dargs=(--jar-dir "$out/build" --podalloc "$pod" --defaults)
    [ -n "${SPARK_PEER_ONLY:-}" ] && dargs+=(--only $SPARK_PEER_ONLY)
    [ -n "${SPARK_PEER_OUT:-}" ] && dargs+=(--out "$SPARK_PEER_OUT/$line-defaults")
    python3 peers/compare.py "${dargs[@]}" || status=1
  fi
  if [ "$real" = 1 ]; then
    rargs=(--jar-dir "$out/build" --podalloc "$pod" --real)
    [ -n "${SPARK_PEER_ONLY:-}" ] && rargs+=(--only $SPARK_PEER_ONLY)
    [ -n "${SPARK_PEER_OUT:-}" ] && rargs+=(--out "$SPARK_PEER_OUT/$line-real")
    start=$(date +%s)
    python3 peers/compare.py "${rargs[@]}" || status=1
    rdargs=(--jar-dir "$out/build" --podalloc "$pod" --real --defaults)
    [ -n "${SPARK_PEER_ONLY:-}" ] && rdargs+=(--only $SPARK_PEER_ONLY)
    [ -n "${SPARK_PEER_OUT:-}" ] && rdargs+=(--out "$SPARK_PEER_OUT/$line-real-defaults")
    python3 peers/compare.py "${rdargs[@]}" || status=1
    echo "spark-peer: Spark $line on the real control plane (and at the defaults) took $(( $(date +%s) - start ))s"
  fi
done
exit $status
