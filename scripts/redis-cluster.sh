#!/usr/bin/env bash
# A local Redis Cluster for the tests: 3 masters and 3 replicas of the machine's redis-server on
# loopback ports BASE..BASE+5 (RETRYSAFE_REDIS_CLUSTER_PORT, default 7100), no persistence, each
# node in its own directory under RETRYSAFE_REDIS_CLUSTER_DIR.
#
#   scripts/redis-cluster.sh start   start the nodes that are down, create the cluster if it has no
#                                    slots yet, wait until every node says cluster_state:ok
#   scripts/redis-cluster.sh stop    stop every node and delete the directories
#
# `start` is safe to run again: a node killed by a test (its directory and nodes.conf kept) comes
# back and rejoins, as a replica of the master that replaced it.
set -euo pipefail

base=${RETRYSAFE_REDIS_CLUSTER_PORT:-7100}
root=${RETRYSAFE_REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/retrysafe-redis-cluster}
ports=$(seq "$base" $((base + 5)))
# A master that stops answering is failed over after this long; short, so the failover test is quick.
node_timeout_ms=1000

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }
up() { cli "$1" ping 2>/dev/null | grep -q PONG; }
state_ok() { cli "$1" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }
# A master, or a replica that has synced with its master (only that one can take over from it).
synced() { cli "$1" info replication 2>/dev/null | grep -q 'role:master\|master_link_status:up'; }
all_ok() {
  for port in $ports; do state_ok "$port" && synced "$port" || return 1; done
  # Six nodes, none failed or still handshaking: a restarted node has rejoined.
  local nodes
  nodes=$(cli "$base" cluster nodes) || return 1
  [ "$(grep -c ' connected' <<<"$nodes")" -eq 6 ] && ! grep -q 'fail\|handshake' <<<"$nodes"
}

start() {
  for port in $ports; do
    up "$port" && continue
    mkdir -p "$root/$port"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$root/$port" \
      --pidfile "$root/$port/redis.pid" --logfile "$root/$port/redis.log" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout "$node_timeout_ms" \
      --save "" --appendonly no
  done
  for port in $ports; do
    for _ in $(seq 1 100); do up "$port" && break; sleep 0.1; done
    up "$port" || { echo "redis-cluster: node $port did not start (see $root/$port/redis.log)" >&2; exit 1; }
  done
  if cli "$base" cluster info | grep -q 'cluster_slots_assigned:0'; then
    local nodes=()
    for port in $ports; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  fi
  for _ in $(seq 1 150); do all_ok && return 0; sleep 0.2; done
  echo "redis-cluster: the cluster on ports $base-$((base + 5)) is not ok after 30 s" >&2
  exit 1
}

stop() {
  for port in $ports; do
    cli "$port" shutdown nosave >/dev/null 2>&1 || true
  done
  rm -rf "$root"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
