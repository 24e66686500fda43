#!/usr/bin/env bash
# A Redis Cluster (or one standalone server) on loopback, for kvslice's
# tier tests and `kvslice tier`. Uses Debian's redis-server and redis-cli.
#
#   .ci/redis-cluster.sh start   [--port 7100] [--nodes 3] [--dir target/redis-cluster]
#                                [--standalone | --bare] [--requirepass P]
#     (--bare: cluster-mode nodes never joined into a cluster, for tests of
#      a cluster that is not ok)
#   .ci/redis-cluster.sh stop    [--dir D]      # stops the pids it started
#   .ci/redis-cluster.sh kill N  [--dir D]      # SIGKILL node N (0-based) by its pid
#   .ci/redis-cluster.sh pause N [--dir D]      # SIGSTOP node N: up, but never answers
#   .ci/redis-cluster.sh resume N [--dir D]     # SIGCONT node N
#   .ci/redis-cluster.sh restart N [--dir D]    # starts node N again, same ports and slots
#   .ci/redis-cluster.sh urls    [--dir D]      # prints the comma-separated redis:// URLs
#
# Each node keeps its data, config and log under D/<port>/. D/nodes lists
# "index port pid" per node. Every wait is bounded.
set -euo pipefail
cd "$(dirname "$0")/.."

cmd=${1:-}
shift || true
node=""
if [[ "$cmd" == kill || "$cmd" == restart || "$cmd" == pause || "$cmd" == resume ]]; then
  node=${1:?"$cmd needs a node index"}
  shift
fi
port=7100 nodes=3 dir=target/redis-cluster standalone=0 bare=0 pass=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --port) port=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --standalone) standalone=1; nodes=1; shift ;;
    --bare) bare=1; shift ;;
    --requirepass) pass=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
list="$dir/nodes"

die() { echo "redis-cluster: $*" >&2; exit 1; }

# Starts node $1 on port $2 in cluster mode unless standalone; records its pid.
launch() {
  local i=$1 p=$2 mode
  mode=$(cat "$dir/mode")
  mkdir -p "$dir/$p"
  local args=(--port "$p" --bind 127.0.0.1 --protected-mode yes --dir "$dir/$p"
    --logfile "$dir/$p/redis.log" --save "" --appendonly no --daemonize no)
  if [[ "$mode" == cluster ]]; then
    # A master that is down stops only its own slots: the tier keeps using
    # the others (full coverage would stop the whole cluster).
    args+=(--cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf"
      --cluster-node-timeout 2000 --cluster-require-full-coverage no)
  fi
  [[ -n "$pass" ]] && args+=(--requirepass "$pass")
  redis-server "${args[@]}" >/dev/null 2>&1 &
  local pid=$!
  local tmp
  tmp=$(mktemp)
  { grep -v "^$i " "$list" 2>/dev/null || true; echo "$i $p $pid"; } | sort -n >"$tmp"
  mv "$tmp" "$list"
  for _ in $(seq 100); do
    if redis-cli -p "$p" ping 2>&1 | grep -q "PONG\|NOAUTH"; then return 0; fi
    kill -0 "$pid" 2>/dev/null || die "redis-server on port $p exited; see $dir/$p/redis.log"
    sleep 0.1
  done
  die "redis-server on port $p did not answer in 10 s"
}

wait_ok() {
  for _ in $(seq 150); do
    local ok=1
    while read -r _ p _; do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok" || ok=0
    done <"$list"
    [[ $ok == 1 ]] && return 0
    sleep 0.2
  done
  die "the cluster did not reach cluster_state:ok in 30 s"
}

urls() {
  awk '{printf "%sredis://127.0.0.1:%s", (NR>1?",":""), $2} END {print ""}' "$list"
}

case "$cmd" in
  start)
    command -v redis-server >/dev/null || die "redis-server not found (apt-get install redis-server)"
    if [[ -s "$list" ]]; then
      while read -r _ _ pid; do
        kill -0 "$pid" 2>/dev/null && die "$dir has nodes running (pid $pid); stop them first"
      done <"$list"
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    if [[ $standalone == 1 ]]; then echo standalone >"$dir/mode"; else echo cluster >"$dir/mode"; fi
    for ((i = 0; i < nodes; i++)); do launch "$i" $((port + i)); done
    if [[ $standalone == 0 && $bare == 0 ]]; then
      addrs=()
      for ((i = 0; i < nodes; i++)); do addrs+=("127.0.0.1:$((port + i))"); done
      redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 \
        || die "cluster create failed; see $dir/create.log"
      wait_ok
    fi
    urls
    ;;
  stop)
    [[ -s "$list" ]] || exit 0
    # A paused node takes its SIGTERM once continued.
    while read -r _ _ pid; do kill "$pid" 2>/dev/null && kill -CONT "$pid" 2>/dev/null || true; done <"$list"
    for _ in $(seq 50); do
      alive=0
      while read -r _ _ pid; do kill -0 "$pid" 2>/dev/null && alive=1; done <"$list"
      [[ $alive == 0 ]] && break
      sleep 0.1
    done
    while read -r _ _ pid; do kill -9 "$pid" 2>/dev/null || true; done <"$list"
    : >"$list"
    ;;
  kill)
    read -r _ p pid < <(awk -v n="$node" '$1 == n' "$list")
    [[ -n "${pid:-}" ]] || die "no node $node in $list"
    kill -9 "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.1; done
    die "node $node (pid $pid) did not die"
    ;;
  pause | resume)
    read -r _ p pid < <(awk -v n="$node" '$1 == n' "$list")
    [[ -n "${pid:-}" ]] || die "no node $node in $list"
    if [[ "$cmd" == pause ]]; then kill -STOP "$pid"; else kill -CONT "$pid"; fi
    ;;
  restart)
    read -r _ p _ < <(awk -v n="$node" '$1 == n' "$list")
    [[ -n "${p:-}" ]] || die "no node $node in $list"
    launch "$node" "$p"
    [[ $(cat "$dir/mode") == cluster ]] && wait_ok
    ;;
  urls)
    urls
    ;;
  *)
    sed -n 2,17p "$0" >&2
    exit 2
    ;;
esac
