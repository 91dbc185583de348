#!/usr/bin/env bash
# hack/cluster.sh — a real, local Kubernetes control plane (etcd + kube-apiserver + kube-controller-manager
# + kube-scheduler + kwok fake nodes), plus kubectl, helm and actionlint, built from Go modules and cached outside the repo.
#
#   hack/cluster.sh build   build (or reuse) every binary; pinned versions live in hack/cluster/versions.env
#   hack/cluster.sh up      start a fresh cluster on free 127.0.0.1 ports; stdout: `export ...` lines only
#   hack/cluster.sh down    stop exactly the processes `up` recorded and remove its work dir
#   hack/cluster.sh env     print the exports (PATH always, KUBECONFIG if a cluster is up) without starting anything
#   hack/cluster.sh status  show the state dir, the recorded PIDs and whether they are alive (stderr)
#
# Environment:
#   SPECTUNE_CACHE         cache root (default ~/.cache/spectune); binaries go to $SPECTUNE_CACHE/<versions>/bin
#   SPECTUNE_CLUSTER_DIR   work dir for `up` (default: a fresh mktemp dir, recorded in the state file)
#   SPECTUNE_CLUSTER_STATE file recording the running cluster's work dir (default $SPECTUNE_CACHE/cluster.state)
#   SPECTUNE_KWOK_NODES    number of fake nodes (default 2)
#   SPECTUNE_UP_TIMEOUT    seconds to wait for readiness (default 180)
# All diagnostics go to stderr; logs of the running components are in <work dir>/logs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/cluster/versions.env
source "$HERE/cluster/versions.env"

CACHE_ROOT=${SPECTUNE_CACHE:-$HOME/.cache/spectune}
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
CACHE=$CACHE_ROOT/$KEY
BIN=$CACHE/bin
STAMPS=$CACHE/stamps
LOGS=$CACHE_ROOT/logs
STATE=${SPECTUNE_CLUSTER_STATE:-$CACHE_ROOT/cluster.state}

if command -v go >/dev/null 2>&1; then GO=$(command -v go); else GO=/usr/local/go/bin/go; fi

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------------------------
# build
# ---------------------------------------------------------------------------------------------------------------
goenv() {  # run go quietly niced, 2 parallel jobs, static binaries
  CGO_ENABLED=0 GOFLAGS="-buildvcs=false -p=${SPECTUNE_GO_JOBS:-2}" GOTOOLCHAIN=local nice -n 10 "$GO" "$@"
}

# A version check is `BINARY --version | grep PATTERN >/dev/null`, never `grep -q`: under
# pipefail, grep -q exits at its first match, and a binary still printing its next line
# (kubectl's Kustomize version, etcd's Git SHA) dies of SIGPIPE, failing a good build.

# step NAME FUNC BINARY...: run FUNC unless the stamp for NAME matches and every BINARY exists;
# print what is built and how long it took.
step() {
  local name=$1 fn=$2 stamp="$STAMPS/$1" t0 t1 b have=1
  shift 2
  for b in "$@"; do [ -x "$BIN/$b" ] || have=0; done
  if [ "$have" = 1 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$KEY" ]; then
    log "$name: cached ($*)"
    return 0
  fi
  mkdir -p "$LOGS" "$BIN" "$STAMPS"
  local logf="$LOGS/build-$name.log"
  log "$name: building (log: $logf) ..."
  t0=$(date +%s)
  # run in an async subshell: `set -e` is ignored in functions called from an `if` condition
  ( set -euo pipefail; "$fn" ) >"$logf" 2>&1 &
  if ! wait $!; then
    tail -n 40 "$logf" >&2 || true
    die "$name: build FAILED after $(( $(date +%s) - t0 ))s; full log: $logf"
  fi
  t1=$(date +%s)
  echo "$KEY" >"$stamp"
  log "$name: built in $(( t1 - t0 ))s"
}

build_etcd() {
  local src=$CACHE/src/etcd
  rm -rf "$src"; mkdir -p "$src"; cd "$src"
  goenv mod init local/etcd-bin
  goenv get -tool "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
  goenv mod tidy
  goenv build -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3
  "$BIN/etcd" --version
  "$BIN/etcd" --version | grep "etcd Version: ${ETCD_VERSION#v}" >/dev/null
}

gen_k8s_wrapper() {
  local src=$1 staging=v0.${K8S_VERSION#v1.} upstream
  rm -rf "$src"; mkdir -p "$src"; cd "$src"
  goenv mod init local/k8s-bins
  # upstream go.mod through the proxy; derive the staging replace block from it (never hand-maintained)
  upstream=$(GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@${K8S_VERSION}" \
             | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  local mods
  mods=$(sed -n 's|^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*|\1|p' "$upstream" | sort -u)
  [ -n "$mods" ] || { echo "no staging replaces found in $upstream"; return 1; }
  local m
  for m in $mods; do goenv mod edit -replace="${m}=${m}@${staging}"; done
  # keep upstream's GODEBUG defaults
  grep -E '^godebug[[:space:]]+[^(]' "$upstream" | while read -r _ kv; do goenv mod edit -godebug="$kv"; done || true
  goenv get "k8s.io/kubernetes@${K8S_VERSION}"
  # the @version matters: without it `go get` upgrades k8s.io/kubernetes to the newest release
  goenv get -tool "k8s.io/kubernetes/cmd/kube-apiserver@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-controller-manager@${K8S_VERSION}" \
    "k8s.io/kubernetes/cmd/kube-scheduler@${K8S_VERSION}" "k8s.io/kubernetes/cmd/kubectl@${K8S_VERSION}"
  [ "$(goenv list -m -f '{{.Version}}' k8s.io/kubernetes)" = "$K8S_VERSION" ]
  goenv mod tidy
  cat go.mod
}

k8s_ldflags() {
  local minor date p ldf="-s -w"
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldf+=" -X $p.gitTreeState=clean -X $p.buildDate=$date"
  done
  echo "$ldf"
}

build_k8s() {
  local src=$CACHE/src/k8s
  gen_k8s_wrapper "$src"
  cd "$src"
  goenv build -trimpath -tags=selinux,notest -ldflags "$(k8s_ldflags)" -o "$BIN/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  local b
  for b in kube-apiserver kube-controller-manager kube-scheduler; do
    "$BIN/$b" --version
    "$BIN/$b" --version | grep "Kubernetes ${K8S_VERSION}\$" >/dev/null
  done
  "$BIN/kubectl" version --client
  "$BIN/kubectl" version --client | grep "Client Version: ${K8S_VERSION}\$" >/dev/null
}

build_kwok() {
  local modsrc
  GOBIN=$BIN goenv install "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  "$BIN/kwok" --version || true
  # kwok's standalone controller needs Stage objects; take the defaults kwokctl uses from the module source
  modsrc=$("$GO" env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION}/kustomize/stage
  mkdir -p "$CACHE/share"
  local f
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    cat "$modsrc/$f"; printf '\n---\n'
  done >"$CACHE/share/kwok-stages.yaml"
  grep -c '^kind: Stage' "$CACHE/share/kwok-stages.yaml"
}

build_helm() {
  local minor
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  GOBIN=$BIN goenv install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION} \
    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${minor} \
    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=${minor}" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
  "$BIN/helm" version
  "$BIN/helm" version | grep "${HELM_VERSION}" >/dev/null
}

build_actionlint() {
  GOBIN=$BIN goenv install -trimpath -ldflags "-s -w -X github.com/rhysd/actionlint.version=${ACTIONLINT_VERSION}" \
    "github.com/rhysd/actionlint/cmd/actionlint@${ACTIONLINT_VERSION}"
  "$BIN/actionlint" -version
  "$BIN/actionlint" -version | grep "${ACTIONLINT_VERSION#v}" >/dev/null
}

cmd_build() {
  local t0; t0=$(date +%s)
  local t
  for t in openssl python3 flock; do command -v "$t" >/dev/null || die "$t is required to build"; done
  "$GO" version >/dev/null 2>&1 || die "Go toolchain not found (looked for 'go' on PATH and /usr/local/go/bin/go)"
  log "versions: $KEY; cache: $CACHE"
  mkdir -p "$CACHE_ROOT"
  # one build at a time per cache root (the test fixture and the CI script may both call `build`)
  exec 9>"$CACHE_ROOT/build.lock"
  flock 9
  local only=${1:-all}
  case $only in all|etcd) step etcd build_etcd etcd ;; esac
  case $only in all|k8s) step k8s build_k8s kube-apiserver kube-controller-manager kube-scheduler kubectl ;; esac
  case $only in all|kwok) step kwok build_kwok kwok ;; esac
  case $only in all|helm) step helm build_helm helm ;; esac
  # the stamp is named by the version: a bump rebuilds it without invalidating the cluster's cache
  case $only in all|actionlint) step "actionlint-${ACTIONLINT_VERSION}" build_actionlint actionlint ;; esac
  log "build done in $(( $(date +%s) - t0 ))s; binaries in $BIN"
}

# ---------------------------------------------------------------------------------------------------------------
# up / down / env / status
# ---------------------------------------------------------------------------------------------------------------
need_bins() {
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is missing: run 'hack/cluster.sh build' first"
  done
  [ -f "$CACHE/share/kwok-stages.yaml" ] || die "$CACHE/share/kwok-stages.yaml is missing: run 'hack/cluster.sh build'"
}

free_ports() {  # N distinct free TCP ports on 127.0.0.1, space separated (held open together so none repeats)
  python3 -c '
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}

# start NAME CMD...: run detached from our stdout (so `$(hack/cluster.sh up)` returns), record "pid name"
start() {
  local name=$1; shift
  "$@" </dev/null >"$WORK/logs/$name.log" 2>&1 &
  echo "$! $name" >>"$WORK/pids"
  log "started $name (pid $!)"
}

alive() {  # alive PID NAME: true if PID runs and is the binary we started (guards against PID reuse)
  local pid=$1 name=$2 exe
  [ -d "/proc/$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  exe=${exe% (deleted)}
  [ "$(basename "$exe")" = "$name" ] || return 1
  # a zombie (exited, not yet reaped) is not alive
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

starting() {  # starting PID: a fork of this script that has not exec'd its binary yet
  # (`start` forks, then the child execs; on a loaded machine a check can land between the
  # two, while /proc/PID is still a copy of this shell, with this script's command line).
  local pid=$1
  [ -d "/proc/$pid" ] || return 1
  [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ] || return 1
  cmp -s "/proc/$pid/cmdline" "/proc/$$/cmdline"
}

check_alive() {  # fail loudly with the component's log if it died
  local pid name
  while read -r pid name; do
    alive "$pid" "$name" && continue
    starting "$pid" && continue
    tail -n 30 "$WORK/logs/$name.log" >&2 || true
    die "$name (pid $pid) exited during startup; log: $WORK/logs/$name.log"
  done <"$WORK/pids"
}

wait_for() {  # wait_for DESCRIPTION SECONDS CMD...
  local what=$1 secs=$2 deadline; shift 2
  deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    check_alive
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what (logs in $WORK/logs)"
    sleep 0.5
  done
  log "$what: ok"
}

mk_pki() {
  local pki=$WORK/pki; mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=spectune-test-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cat >"$pki/server.ext" <<'EXT'
subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1
extendedKeyUsage=serverAuth
keyUsage=critical,digitalSignature,keyEncipherment
EXT
  printf 'extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n' >"$pki/client.ext"
  mkcert() {  # name subject extfile
    openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -days 30 -extfile "$3" -out "$pki/$1.crt" 2>/dev/null
  }
  mkcert apiserver "/CN=kube-apiserver" "$pki/server.ext"
  mkcert admin "/O=system:masters/CN=spectune-admin" "$pki/client.ext"
  mkcert kube-controller-manager "/CN=system:kube-controller-manager" "$pki/client.ext"
  mkcert kube-scheduler "/CN=system:kube-scheduler" "$pki/client.ext"
  mkcert kwok "/O=system:masters/CN=kwok" "$pki/client.ext"
  # aggregation layer (front proxy): its own CA, as kubeadm does, so no admin-CA cert can assert X-Remote-* headers
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=spectune-front-proxy-ca" \
    -keyout "$pki/front-proxy-ca.key" -out "$pki/front-proxy-ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=front-proxy-client" -keyout "$pki/front-proxy-client.key" \
    -out "$pki/front-proxy-client.csr" 2>/dev/null
  openssl x509 -req -in "$pki/front-proxy-client.csr" -CA "$pki/front-proxy-ca.crt" -CAkey "$pki/front-proxy-ca.key" \
    -CAcreateserial -days 30 -extfile "$pki/client.ext" -out "$pki/front-proxy-client.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
}

mk_kubeconfig() {  # mk_kubeconfig FILE CERTNAME
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: spectune
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $WORK/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $WORK/pki/$2.crt
    client-key: $WORK/pki/$2.key
contexts:
- name: spectune
  context: {cluster: spectune, user: $2, namespace: default}
current-context: spectune
KC
}

running_workdir() {  # print the work dir of a live cluster recorded in $STATE, else nothing
  [ -f "$STATE" ] || return 0
  local w; w=$(cat "$STATE")
  [ -f "$w/pids" ] || return 0
  local pid name
  while read -r pid name; do
    if alive "$pid" "$name"; then echo "$w"; return 0; fi
  done <"$w/pids"
}

print_exports() {  # print_exports [KUBECONFIG]
  if [ -n "${1:-}" ]; then printf 'export KUBECONFIG=%q\n' "$1"; fi
  # shellcheck disable=SC2016  # $PATH is expanded by the shell that evals our output
  printf 'export PATH=%q:"$PATH"\n' "$BIN"
}

cmd_up() {
  local t0 t; t0=$(date +%s)
  for t in openssl curl python3; do command -v "$t" >/dev/null || die "$t is required by 'up'"; done
  need_bins
  local w; w=$(running_workdir)
  [ -z "$w" ] || die "a cluster is already up (work dir $w, state $STATE); run 'hack/cluster.sh down' first"
  if [ -f "$STATE" ]; then  # a recorded cluster whose processes are all gone (crash, reboot): clean it up
    w=$(cat "$STATE")
    log "removing the stale state of a dead cluster ($w)"
    if [ -f "$w/pids" ]; then rm -rf "$w"; fi
    rm -f "$STATE"
  fi
  if [ -n "${SPECTUNE_CLUSTER_DIR:-}" ]; then
    WORK=$SPECTUNE_CLUSTER_DIR
    [ ! -e "$WORK" ] || [ -z "$(ls -A "$WORK")" ] || die "SPECTUNE_CLUSTER_DIR=$WORK exists and is not empty"
    mkdir -p "$WORK"
  else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/spectune-cluster.XXXXXX")
  fi
  WORK=$(cd "$WORK" && pwd)
  mkdir -p "$WORK/logs" "$WORK/etcd" "$(dirname "$STATE")"
  : >"$WORK/pids"
  echo "$WORK" >"$STATE"
  log "work dir: $WORK"
  # on any failure: stop what we started, keep the work dir (logs) for diagnosis
  # shellcheck disable=SC2154  # rc is assigned inside the trap
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed; stopping the processes it started (logs kept in $WORK/logs)"; stop_pids; rm -f "$STATE"; fi' EXIT

  read -r ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT SCHED_PORT KWOK_PORT <<<"$(free_ports 6)"
  printf 'ETCD_PORT=%s\nETCD_PEER_PORT=%s\nAPI_PORT=%s\nKCM_PORT=%s\nSCHED_PORT=%s\nKWOK_PORT=%s\n' \
    "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" "$KCM_PORT" "$SCHED_PORT" "$KWOK_PORT" >"$WORK/ports.env"
  mk_pki
  local pki=$WORK/pki kc=$WORK/admin.kubeconfig
  mk_kubeconfig "$kc" admin
  mk_kubeconfig "$WORK/kube-controller-manager.kubeconfig" kube-controller-manager
  mk_kubeconfig "$WORK/kube-scheduler.kubeconfig" kube-scheduler
  mk_kubeconfig "$WORK/kwok.kubeconfig" kwok
  local timeout=${SPECTUNE_UP_TIMEOUT:-180}

  start etcd "$BIN/etcd" --name=spectune --data-dir="$WORK/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="spectune=http://127.0.0.1:$ETCD_PEER_PORT" \
    --auto-compaction-retention=1 --unsafe-no-fsync=true --log-level=warn
  wait_for etcd 60 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"

  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --cert-dir="$WORK/apiserver-certs" \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --requestheader-client-ca-file="$pki/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$pki/front-proxy-client.crt" --proxy-client-key-file="$pki/front-proxy-client.key" \
    --authorization-mode=RBAC --allow-privileged=true --endpoint-reconciler-type=none \
    --profiling=false
  wait_for "kube-apiserver /readyz" "$timeout" curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" \
    --key "$pki/admin.key" "https://127.0.0.1:$API_PORT/readyz"

  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig="$WORK/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig="$WORK/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig="$WORK/kube-controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$KCM_PORT" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/sa.key" \
    --use-service-account-credentials=true \
    --leader-elect=false --kube-api-qps=200 --kube-api-burst=400 --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig="$WORK/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig="$WORK/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig="$WORK/kube-scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" \
    --authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics \
    --leader-elect=false --profiling=false
  start kwok "$BIN/kwok" --kubeconfig="$WORK/kwok.kubeconfig" --config="$CACHE/share/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --cidr=10.0.1.0/24 --node-ip=127.0.0.1 --node-lease-duration-seconds=40 \
    --server-address="127.0.0.1:$KWOK_PORT"
  wait_for "kube-controller-manager /healthz" 60 curl -fsSk "https://127.0.0.1:$KCM_PORT/healthz"
  wait_for "kube-scheduler /healthz" 60 curl -fsSk "https://127.0.0.1:$SCHED_PORT/healthz"

  # fake nodes, untainted so ordinary pods schedule on them
  local n i; n=${SPECTUNE_KWOK_NODES:-2}
  for i in $(seq 0 $(( n - 1 ))); do
    cat <<NODE
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {node.alpha.kubernetes.io/ttl: "0", kwok.x-k8s.io/node: fake}
  labels: {kubernetes.io/hostname: kwok-node-$i, kubernetes.io/os: linux, kubernetes.io/arch: amd64, type: kwok}
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "250"}
  capacity: {cpu: "64", memory: 256Gi, pods: "250"}
---
NODE
  done >"$WORK/nodes.yaml"
  "$BIN/kubectl" --kubeconfig="$kc" apply -f "$WORK/nodes.yaml" >&2
  wait_for "$n kwok node(s) Ready" "$timeout" "$BIN/kubectl" --kubeconfig="$kc" wait --for=condition=Ready node -l type=kwok --timeout=5s
  wait_for "default ServiceAccount" "$timeout" "$BIN/kubectl" --kubeconfig="$kc" -n default get serviceaccount default
  check_alive
  trap - EXIT
  log "cluster up in $(( $(date +%s) - t0 ))s: https://127.0.0.1:$API_PORT, server $("$BIN/kubectl" --kubeconfig="$kc" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
  print_exports "$kc"
}

stop_pids() {  # stop exactly the processes recorded in $WORK/pids: first the clients, then etcd last
  [ -f "$WORK/pids" ] || return 0
  local pid name lines=() clients=() servers=() t0 i
  mapfile -t lines <"$WORK/pids"
  for (( i=${#lines[@]}-1; i>=0; i-- )); do
    read -r pid name <<<"${lines[$i]}"
    if [ "$name" = etcd ]; then servers+=("$pid $name"); else clients+=("$pid $name"); fi
  done
  t0=$(date +%s)
  stop_group "${clients[@]}"
  stop_group "${servers[@]}"
  log "stopped ${#lines[@]} process(es) in $(( $(date +%s) - t0 ))s"
}

stop_group() {  # SIGTERM every "pid name" given, wait up to 15 s, then SIGKILL what is left
  local entry pid name deadline
  for entry in "$@"; do
    read -r pid name <<<"$entry"
    if alive "$pid" "$name"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  deadline=$(( $(date +%s) + 15 ))
  for entry in "$@"; do
    read -r pid name <<<"$entry"
    while alive "$pid" "$name" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.1; done
    if alive "$pid" "$name"; then
      log "$name (pid $pid) still running 15s after SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
}

cmd_down() {
  [ -f "$STATE" ] || { log "no cluster recorded in $STATE; nothing to do"; return 0; }
  WORK=$(cat "$STATE")
  log "stopping cluster in $WORK"
  stop_pids
  case $WORK in
    /|"$HOME"|"") die "refusing to remove work dir '$WORK'" ;;
  esac
  if [ -f "$WORK/pids" ]; then rm -rf "$WORK"; fi
  rm -f "$STATE"
  log "cluster down"
}

cmd_env() {
  local w; w=$(running_workdir)
  if [ -n "$w" ]; then print_exports "$w/admin.kubeconfig"; else print_exports; fi
}

cmd_status() {
  local w; w=$(running_workdir)
  [ -n "$w" ] || { log "no cluster up (state $STATE)"; return 1; }
  log "work dir: $w"
  local pid name
  while read -r pid name; do
    if alive "$pid" "$name"; then log "  $name pid $pid: running"; else log "  $name pid $pid: DEAD"; fi
  done <"$w/pids"
}

# ---------------------------------------------------------------------------------------------------------------
main() {
  local cmd=${1:-}
  shift || true
  case $cmd in
    build) cmd_build "$@" ;;
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    env) cmd_env "$@" ;;
    status) cmd_status "$@" ;;
    bin-dir) echo "$BIN" ;;
    *) die "usage: $0 build|up|down|env|status|bin-dir" ;;
  esac
}
main "$@"
