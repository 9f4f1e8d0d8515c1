#!/usr/bin/env bash
# A real Kubernetes control plane for podalloc's tests: an unmodified kube-apiserver and etcd,
# built from their published Go modules (tools/controlplane/), cached outside the work tree,
# and started on loopback like a real cluster (TLS with a test CA, static tokens, RBAC).
#
#   scripts/controlplane.sh build          build both binaries unless the cache has them
#   scripts/controlplane.sh start DIR      start etcd + kube-apiserver with their files in DIR
#                                          (prints the admin and podalloc kubeconfigs' paths)
#   scripts/controlplane.sh env            print the cache directory and the binaries' paths
#   scripts/controlplane.sh stop DIR       stop what `start DIR` started
#   scripts/controlplane.sh test [ARGS]    build, then run the real-server suite
#                                          (the tests named on_real, apiserver:: and differential::;
#                                          ARGS go to the test binary)
#   scripts/controlplane.sh gomod VERSION  rewrite tools/controlplane/*/go.mod for Kubernetes
#                                          VERSION (e.g. v1.37.2): every staging module that
#                                          tag's own go.mod replaces with ./staging/... gets
#                                          a replace to its published v0.X.Y, and etcd is
#                                          pinned at the version that go.mod requires
#
# The cache is $PODALLOC_CONTROLPLANE_CACHE or ~/.cache/podalloc/controlplane, one folder per
# version pair (for example v1.37.2-etcd-v3.7.0/bin/{kube-apiserver,etcd}); nothing built is
# ever written into the repository. `start` options, as environment variables:
#   PODALLOC_CP_WATCH_PID=PID   stop the control plane once process PID has gone, and remove
#                               DIR (the test harness passes its own pid and a DIR in the
#                               temporary directory, so no server and no file outlives a test
#                               run; PODALLOC_CP_KEEP=1 keeps DIR, its logs and audit log)
#   PODALLOC_CP_COMPACTION=DUR  --etcd-compaction-interval (default 5m, as the real default)
#   PODALLOC_CP_EXTRA="FLAGS"   more kube-apiserver flags
#   PODALLOC_CP_USERS="NAME..."  more users like `podalloc` (group podalloc:users, no
#                               rights until a RoleBinding grants some), each with its token in
#                               DIR/NAME.token (scripts/spark-app.sh: its Spark driver)
#   PODALLOC_CP_AUDIT_NAMESPACES="NS..."  also audit, at Metadata level, every request in
#                               these namespaces, by any user, pod creates at Request level
#                               (scripts/spark-app.sh: who created and deleted each executor
#                               pod, with which resource profile label; requests by verb)
# The audit log, DIR/audit.log (JSON lines, audit.k8s.io/v1 Events at ResponseComplete,
# written before each response is sent: --audit-log-mode=blocking), records at Metadata
# level what the candidate users podalloc-a, -b and -c do to pods, configmaps, leases and
# executorsets (and their subresources), and the admin's writes to leases; nothing else (DIR/audit-policy.yaml), so the rest of
# the suite pays for none of it. The leader-election tests attribute requests with it.
# What a cluster without kube-controller-manager, scheduler and kubelet does not do:
# tests/real/README.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/tools/controlplane"

# The versions come from the wrapper modules themselves, so the cache key can never drift
# from what is built.
kube_version() { sed -n 's#^require k8s.io/kubernetes \(v[^ ]*\)$#\1#p; s#^\tk8s.io/kubernetes \(v[^ ]*\)$#\1#p' "$tools/kube-apiserver/go.mod" | head -n 1; }
etcd_version() { sed -n 's#^require go.etcd.io/etcd/server/v3 \(v[^ ]*\)$#\1#p; s#^\tgo.etcd.io/etcd/server/v3 \(v[^ ]*\)$#\1#p' "$tools/etcd/go.mod" | head -n 1; }

cache_dir() {
  local base=${PODALLOC_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podalloc/controlplane}
  echo "$base/$(kube_version)-etcd-$(etcd_version)"
}

need_go() {
  if ! command -v go >/dev/null 2>&1; then
    echo "controlplane: Go is not installed; the real control plane is built from Go modules (Go 1.26 or newer)" >&2
    exit 2
  fi
}

build() {
  local dir kv ev started
  dir=$(cache_dir)
  kv=$(kube_version)
  ev=$(etcd_version)
  mkdir -p "$dir/bin"
  if [ -x "$dir/bin/kube-apiserver" ] && [ -x "$dir/bin/etcd" ]; then
    echo "controlplane: kube-apiserver $kv and etcd $ev are cached in $dir/bin"
    return 0
  fi
  need_go
  local minor=${kv#v1.}
  minor=${minor%%.*}
  if [ ! -x "$dir/bin/kube-apiserver" ]; then
    echo "controlplane: building kube-apiserver $kv (a cold build takes about 5 minutes on 2 idle cores, module downloads included)"
    started=$(date +%s)
    # The flags of upstream's hack/lib/golang.sh: static, trimmed, the version in ldflags.
    (cd "$tools/kube-apiserver" && CGO_ENABLED=0 go build -trimpath -tags=selinux,notest,grpcnotrace \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$kv -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/client-go/pkg/version.gitVersion=$kv" \
      -o "$dir/bin/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
    mv "$dir/bin/kube-apiserver.tmp" "$dir/bin/kube-apiserver"
    echo "controlplane: kube-apiserver built in $(( $(date +%s) - started )) s"
  fi
  if [ ! -x "$dir/bin/etcd" ]; then
    echo "controlplane: building etcd $ev"
    started=$(date +%s)
    (cd "$tools/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
      -o "$dir/bin/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$dir/bin/etcd.tmp" "$dir/bin/etcd"
    echo "controlplane: etcd built in $(( $(date +%s) - started )) s"
  fi
}

# A free TCP port on loopback (bind to port 0, read the port, close).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

pki() {
  local d=$1
  mkdir -p "$d/pki"
  (
    cd "$d/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
      -subj "/CN=podalloc-test-ca" >/dev/null 2>&1
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
      -subj "/CN=kube-apiserver" >/dev/null 2>&1
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >ext.cnf
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial \
      -out apiserver.crt -days 2 -extfile ext.cnf >/dev/null 2>&1
    openssl genrsa -out sa.key 2048 >/dev/null 2>&1
  )
}

kubeconfig() { # FILE SERVER CA USER TOKEN
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: podalloc-test
  cluster:
    server: $2
    certificate-authority: $3
users:
- name: $4
  user:
    token: $5
contexts:
- name: $4@podalloc-test
  context:
    cluster: podalloc-test
    user: $4
    namespace: default
current-context: $4@podalloc-test
EOF
  chmod 600 "$1"
}

start() {
  local d=$1
  local dir
  dir=$(cache_dir)
  if [ ! -x "$dir/bin/kube-apiserver" ] || [ ! -x "$dir/bin/etcd" ]; then
    echo "controlplane: not built; run scripts/controlplane.sh build" >&2
    exit 2
  fi
  mkdir -p "$d"
  d=$(cd "$d" && pwd)
  pki "$d"
  local admin podalloc throttled ec ep port who tok
  admin=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  podalloc=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  throttled=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  # Users: an admin for set-up and the kubelet emulator; `podalloc`, not in system:masters,
  # which only what each test namespace's RoleBinding grants lets through (and which API
  # Priority and Fairness does not exempt); and `podalloc-throttled`, the same but for the
  # test that gives it a FlowSchema of its own with almost no concurrency.
  {
    printf '%s,admin,admin-uid,"system:masters"\n' "$admin"
    printf '%s,podalloc,podalloc-uid,"podalloc:users"\n' "$podalloc"
    printf '%s,podalloc-throttled,podalloc-throttled-uid,"podalloc:users"\n' "$throttled"
    # The leader-election candidates: one user each, so the audit log names the process
    # behind every request (tokens in DIR/podalloc-WHO.token).
    for who in a b c; do
      tok=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
      printf '%s\n' "$tok" >"$d/podalloc-$who.token"
      chmod 600 "$d/podalloc-$who.token"
      printf '%s,podalloc-%s,podalloc-%s-uid,"podalloc:users"\n' "$tok" "$who" "$who"
    done
    for who in ${PODALLOC_CP_USERS:-}; do
      tok=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
      printf '%s\n' "$tok" >"$d/$who.token"
      chmod 600 "$d/$who.token"
      printf '%s,%s,%s-uid,"podalloc:users"\n' "$tok" "$who" "$who"
    done
  } >"$d/tokens.csv"
  chmod 600 "$d/tokens.csv"
  cat >"$d/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: [podalloc-a, podalloc-b, podalloc-c]
  verbs: [get, list, create, update, patch, delete, deletecollection]
  resources:
  - group: ""
    resources: [pods, configmaps]
  - group: coordination.k8s.io
    resources: [leases]
  - group: podalloc.io
    resources: [executorsets, "executorsets/*"]
- level: Metadata
  users: [admin]
  verbs: [create, update, patch, delete]
  resources:
  - group: coordination.k8s.io
    resources: [leases]
EOF
  if [ -n "${PODALLOC_CP_AUDIT_NAMESPACES:-}" ]; then
    # Pod creates there at Request level: the pod sent, so its labels (its resource profile).
    # shellcheck disable=SC2086
    printf -- '- level: Request\n  namespaces: [%s]\n  verbs: [create]\n  resources: [{group: "", resources: [pods]}]\n- level: Metadata\n  namespaces: [%s]\n' \
      "$(printf '%s\n' $PODALLOC_CP_AUDIT_NAMESPACES | paste -sd, -)" \
      "$(printf '%s\n' $PODALLOC_CP_AUDIT_NAMESPACES | paste -sd, -)" >>"$d/audit-policy.yaml"
  fi
  printf -- '- level: None\n' >>"$d/audit-policy.yaml"
  ec=$(free_port); ep=$(free_port); port=$(free_port)
  local started
  started=$(date +%s.%N)
  "$dir/bin/etcd" --name=node0 --data-dir="$d/etcd" \
    --listen-client-urls="http://127.0.0.1:$ec" --advertise-client-urls="http://127.0.0.1:$ec" \
    --listen-peer-urls="http://127.0.0.1:$ep" --initial-advertise-peer-urls="http://127.0.0.1:$ep" \
    --initial-cluster="node0=http://127.0.0.1:$ep" --unsafe-no-fsync=true --log-level=warn \
    >"$d/etcd.log" 2>&1 &
  echo $! >"$d/etcd.pid"
  # shellcheck disable=SC2086
  "$dir/bin/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ec" \
    --etcd-compaction-interval="${PODALLOC_CP_COMPACTION:-5m}" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
    --tls-cert-file="$d/pki/apiserver.crt" --tls-private-key-file="$d/pki/apiserver.key" \
    --cert-dir="$d/pki" \
    --token-auth-file="$d/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer="https://127.0.0.1:$port" \
    --service-account-key-file="$d/pki/sa.key" --service-account-signing-key-file="$d/pki/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --disable-admission-plugins=ServiceAccount \
    --allow-privileged=true \
    --endpoint-reconciler-type=none \
    --audit-policy-file="$d/audit-policy.yaml" --audit-log-path="$d/audit.log" \
    --audit-log-format=json --audit-log-mode=blocking --audit-log-maxbackup=0 \
    ${PODALLOC_CP_EXTRA:-} \
    >"$d/kube-apiserver.log" 2>&1 &
  echo $! >"$d/kube-apiserver.pid"
  local url="https://127.0.0.1:$port"
  kubeconfig "$d/admin.kubeconfig" "$url" "$d/pki/ca.crt" admin "$admin"
  kubeconfig "$d/podalloc.kubeconfig" "$url" "$d/pki/ca.crt" podalloc "$podalloc"
  printf '%s\n' "$url" >"$d/url"
  printf '%s\n' "$admin" >"$d/admin.token"
  printf '%s\n' "$podalloc" >"$d/podalloc.token"
  printf '%s\n' "$throttled" >"$d/throttled.token"
  chmod 600 "$d/admin.token" "$d/podalloc.token" "$d/throttled.token"
  if [ -n "${PODALLOC_CP_WATCH_PID:-}" ]; then
    # Stops the control plane once the process that asked for it has gone, and removes its
    # files unless asked to keep them.
    (
      while kill -0 "$PODALLOC_CP_WATCH_PID" 2>/dev/null; do sleep 1; done
      stop "$d"
      if [ -z "${PODALLOC_CP_KEEP:-}" ]; then rm -rf "$d"; fi
    ) >/dev/null 2>&1 </dev/null &
    disown
  fi
  # Ready: /readyz with a token (anonymous /readyz is 403 until RBAC's roles exist), then the
  # namespace `default`, which the apiserver creates itself; 60 s at most.
  local i
  for i in $(seq 1 600); do
    if curl -fsS --cacert "$d/pki/ca.crt" -H "Authorization: Bearer $admin" \
      "$url/readyz" >/dev/null 2>&1 &&
      curl -fsS --cacert "$d/pki/ca.crt" -H "Authorization: Bearer $admin" \
        "$url/api/v1/namespaces/default" >/dev/null 2>&1; then
      local ms
      ms=$(python3 -c "import time; print(int((time.time()-$started)*1000))")
      echo "controlplane: ready at $url in $ms ms (files in $d)"
      echo "controlplane: kubeconfigs: $d/admin.kubeconfig (system:masters), $d/podalloc.kubeconfig (user podalloc: no rights until a RoleBinding grants deploy/rbac.yaml's Role)"
      echo "controlplane: no kubelet runs here; for pods that get Running: cargo run --release -p podalloc-sim --example kubelet -- --server $url --ca $d/pki/ca.crt --token-file $d/admin.token --namespace NS"
      return 0
    fi
    if ! kill -0 "$(cat "$d/kube-apiserver.pid")" 2>/dev/null; then
      echo "controlplane: kube-apiserver exited; the end of $d/kube-apiserver.log:" >&2
      tail -n 20 "$d/kube-apiserver.log" >&2
      stop "$d"
      exit 1
    fi
    sleep 0.1
  done
  echo "controlplane: not ready after 60 s; the end of $d/kube-apiserver.log:" >&2
  tail -n 20 "$d/kube-apiserver.log" >&2
  stop "$d"
  exit 1
}

stop() {
  local d=$1 f pid
  for f in kube-apiserver etcd; do
    if [ -f "$d/$f.pid" ]; then
      pid=$(cat "$d/$f.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
      rm -f "$d/$f.pid"
    fi
  done
}

# The wrapper modules for Kubernetes $1, derived from that tag's own go.mod (not by hand).
gomod() {
  need_go
  local kv=$1 sv gomod ev m
  sv="v0.${kv#v1.}"
  gomod=$(go mod download -json "k8s.io/kubernetes@$kv" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$gomod" ] || { echo "controlplane: k8s.io/kubernetes@$kv is not served" >&2; exit 1; }
  (
    cd "$tools/kube-apiserver"
    printf 'module podalloc.invalid/controlplane/kube-apiserver\n\ngo 1.26.0\n' >go.mod
    rm -f go.sum
    go mod edit -require="k8s.io/kubernetes@$kv"
    for m in $(sed -n 's#^\t\(k8s.io/[^ ]*\) => ./staging/.*#\1#p' "$gomod"); do
      go mod edit -replace="$m=$m@$sv"
    done
    go mod tidy
  )
  ev=$(sed -n 's#^\tgo.etcd.io/etcd/server/v3 \(v[^ ]*\).*#\1#p' "$gomod" | head -n 1)
  (
    cd "$tools/etcd"
    printf 'module podalloc.invalid/controlplane/etcd\n\ngo 1.26.0\n' >go.mod
    rm -f go.sum
    go mod edit -require="go.etcd.io/etcd/server/v3@$ev"
    go mod tidy
  )
  echo "controlplane: tools/controlplane now builds kube-apiserver $kv and etcd $ev"
}

case "${1:-}" in
  build) build ;;
  gomod) [ -n "${2:-}" ] || { echo "usage: $0 gomod VERSION" >&2; exit 2; }; gomod "$2" ;;
  start) [ -n "${2:-}" ] || { echo "usage: $0 start DIR" >&2; exit 2; }; start "$2" ;;
  stop) [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  env)
    dir=$(cache_dir)
    echo "PODALLOC_CONTROLPLANE_BIN=$dir/bin"
    echo "KUBE_APISERVER=$dir/bin/kube-apiserver"
    echo "ETCD=$dir/bin/etcd"
    ;;
  test)
    shift
    build
    cd "$root"
    PODALLOC_REAL_SERVER=required cargo test --locked --test integration -- on_real apiserver:: differential:: "$@"
    ;;
  *)
    sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
