#!/usr/bin/env bash
# A real SLURM cluster on this machine for the tests (Debian, as root):
#   tests/slurm/cluster.sh start   one node, "localhost": install (once) and start munge,
#                                  MariaDB (socket only), slurmdbd, slurmctld and slurmd
#   tests/slurm/cluster.sh start --nodes N [--cpus-per-node C] [--link-mbit R]
#                                  N nodes orch-node1..N, each its own network and UTS
#                                  namespace with its own hostname and address on a bridge
#                                  (10.213.0.0/24, which exists only between these
#                                  namespaces; the nodes have no route anywhere else) and
#                                  its own slurmd; slurmctld in a UTS namespace of its own
#                                  as orch-ctl (10.213.0.1, on the bridge); munge and
#                                  slurmdbd shared. --link-mbit shapes each node's link
#                                  both ways with tc tbf (netem is not in this kernel).
#   tests/slurm/cluster.sh stop    stop every daemon it started (by the pids it recorded,
#                                  never by name: a host's own SLURM, munge or MariaDB
#                                  stays); remove the namespaces, the bridge and the host
#                                  names it added
# Both wait until every node is idle. Config goes to /etc/slurm (where sbatch, sacct and
# submitit look); state, logs and pids to $STATE. Facts from this kind of machine: the
# packages install in ~15 s; proctrack/linuxproc + task/affinity need no cgroups; munged
# must run as munge; slurmdbd.conf must be 0600; cred_expire=10 lets a requeued job
# restart in ~16 s; `ip netns exec` remounts /sys, after which slurmd finds no cgroup
# filesystem, so nodes are entered with nsenter --net; slurmctld starts only where its
# hostname is SlurmctldHost.
set -euo pipefail
STATE=${ORCH_SLURM_STATE:-/var/lib/orchestrator-slurm}
# One start or stop at a time: pytest's workers each ask for the cluster when their first
# SLURM test begins, and only the first may build it. -o: the daemons started below must
# not inherit the lock.
if [ -z "${ORCH_CLUSTER_LOCKED:-}" ]; then
  mkdir -p "$STATE"
  ORCH_CLUSTER_LOCKED=1 exec flock -o "$STATE/lock" bash "$0" "$@"
fi
PACKAGES="munge slurm-client slurmctld slurmd slurmdbd mariadb-server iproute2"
SUBNET=10.213.0  # .1 the controller on the bridge, .1N node N
BRIDGE=orchbr0
HOSTS_MARK="# orchestrator-slurm test cluster"
NODES=0          # 0: the single-node cluster on localhost
CPUS=""
LINK_MBIT=""

install() {
  command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null \
    && command -v tc >/dev/null && return
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
}

write_config() {
  mkdir -p /etc/slurm "$STATE"/{ctld,spool} /run/mysqld
  local cpus sockets cores threads mem
  read -r cpus sockets cores threads mem < <(slurmd -C | head -1 | sed -E \
    's/.*CPUs=([0-9]+).*SocketsPerBoard=([0-9]+).*CoresPerSocket=([0-9]+).*ThreadsPerCore=([0-9]+).*RealMemory=([0-9]+).*/\1 \2 \3 \4 \5/')
  local ctl=localhost nodes="NodeName=localhost NodeAddr=127.0.0.1" names=localhost extra="" tasks=task/affinity
  local node_mem=$((mem * 95 / 100))
  if [ "$NODES" -gt 0 ]; then
    ctl="orch-ctl($SUBNET.1)"
    names="orch-node[1-$NODES]"
    nodes=""
    for i in $(seq 1 "$NODES"); do nodes+="NodeName=orch-node$i NodeAddr=$SUBNET.1$i "; done
    node_mem=$((mem * 95 / 100 / NODES))
    if [ -n "$CPUS" ] && [ "$CPUS" != "$cpus" ]; then
      [ "$CPUS" -le "$cpus" ] || tasks=task/none  # binding to CPUs the machine does not have would fail
      cpus=$CPUS sockets=1 cores=$CPUS threads=1
    fi
    extra="SlurmdParameters=config_overrides"  # N slurmds share one machine's CPUs and memory
  fi
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=orchestrator
SlurmctldHost=$ctl
AuthType=auth/munge
AuthInfo=cred_expire=10
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=$tasks
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A test cluster answers in seconds: a requeued job may start cred_expire + 1 s after its
# requeue, and only a periodic pass (60 s main, 30 s backfill by default) starts it then.
SchedulerParameters=sched_interval=2,bf_interval=1
MpiDefault=none
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobRequeue=1
KillWait=5
MinJobAge=5
$extra
CONF
  for node in $nodes; do
    case $node in NodeName=*) name=${node#NodeName=}; printf 'NodeName=%s ' "$name" >> /etc/slurm/slurm.conf ;;
                  NodeAddr=*) printf '%s CPUs=%s Sockets=%s CoresPerSocket=%s ThreadsPerCore=%s RealMemory=%s State=UNKNOWN\n' \
                                "$node" "$cpus" "$sockets" "$cores" "$threads" "$node_mem" >> /etc/slurm/slurm.conf ;;
    esac
  done
  echo "PartitionName=debug Nodes=$names Default=YES MaxTime=INFINITE State=UP" >> /etc/slurm/slurm.conf
  cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=orchestrator_test_acct_db
StorageUser=orchestrator_test
StoragePass=local-test-db
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/slurmdbd.log
CONF
  chmod 0600 /etc/slurm/slurmdbd.conf
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "cluster.sh: $what did not come up" >&2; tail -n 5 "$STATE"/*.log >&2 || true; exit 1; }
    sleep 0.5
  done
}

network_up() {  # one namespace per node, each with a veth on the bridge; shaped if asked
  touch "$STATE/network"  # this state's: stop takes it down (and ends what runs in it)
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$SUBNET.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  sed -i "/$HOSTS_MARK/d" /etc/hosts
  echo "$SUBNET.1 orch-ctl $HOSTS_MARK" >> /etc/hosts
  local i ns burst
  for i in $(seq 1 "$NODES"); do
    ns=orch-node$i
    ip netns del "$ns" 2>/dev/null || true  # left by a start that failed half way
    ip netns add "$ns"
    ip link add "orch-v$i" type veth peer name eth0 netns "$ns"
    ip link set "orch-v$i" master "$BRIDGE" up
    nsenter --net="/run/netns/$ns" sh -c "ip link set lo up && ip addr replace $SUBNET.1$i/24 dev eth0 && ip link set eth0 up"
    echo "$SUBNET.1$i $ns $HOSTS_MARK" >> /etc/hosts
    if [ -n "$LINK_MBIT" ]; then
      # tbf: the rate, a bucket of 4 ms at that rate (HZ=250's tick) but at least 32 KiB,
      # and a queue of 100 ms; on the bridge side (traffic into the node) and in the node.
      burst=$(( LINK_MBIT * 125000 / 250 )); [ "$burst" -ge 32768 ] || burst=32768
      tc qdisc replace dev "orch-v$i" root tbf rate "${LINK_MBIT}mbit" burst "$burst" latency 100ms
      nsenter --net="/run/netns/$ns" tc qdisc replace dev eth0 root tbf rate "${LINK_MBIT}mbit" burst "$burst" latency 100ms
    fi
  done
}

network_down() {  # a namespace can outlive its name here, so its link is deleted by name too
  [ -f "$STATE/network" ] || return 0  # another state's network (or none): not ours to take down
  local ns link
  for link in $(ip -o link show 2>/dev/null | awk -F'[:@ ]+' '$2 ~ /^orch-v[0-9]+$/ {print $2}'); do ip link del "$link" || true; done
  for ns in $(ip netns list 2>/dev/null | awk '/^orch-node[0-9]+/ {print $1}'); do ip netns del "$ns" || true; done
  ip link del "$BRIDGE" 2>/dev/null || true
  sed -i "/$HOSTS_MARK/d" /etc/hosts
  rm -f "$STATE/network"
}

shape() { echo "nodes=$NODES cpus=$CPUS link_mbit=$LINK_MBIT"; }

nodes_idle() {  # every configured node is idle
  local want=$(( NODES > 0 ? NODES : 1 ))
  [ "$(sinfo -h -N -o '%N %T' | awk '$2 == "idle"' | sort -u | wc -l)" -eq "$want" ]
}

start() {
  # The same shape with its daemons alive is up, however busy: a controller slow to answer
  # a ping under load must not be restarted under other tests' running jobs.
  if [ "$(cat "$STATE/shape" 2>/dev/null)" = "$(shape)" ] && ours_alive slurmctld && ours_alive slurmd; then
    wait_for 120 slurmctld scontrol ping
    echo "cluster.sh: already up ($(shape))"; return
  fi
  stop  # whatever else runs (another shape, or a crashed start): start from nothing
  install
  write_config
  [ -s /etc/munge/munge.key ] || { mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  alive munged || { runuser -u munge -- /usr/sbin/munged && touch "$STATE/munged.ours"; }
  wait_for 10 munge munge -n
  [ -f "$STATE/munged.ours" ] && { record munged /run/munge/munged.pid; rm -f "$STATE/munged.ours"; }

  chown mysql:mysql /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  if ! alive mariadbd; then
    touch "$STATE/mariadbd.ours"
    (mariadbd --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mariadb.pid \
      >"$STATE/mariadb.log" 2>&1 &)
  fi
  wait_for 30 MariaDB mariadb -e "select 1"
  [ -f "$STATE/mariadbd.ours" ] && { record mariadbd /run/mysqld/mariadb.pid; rm -f "$STATE/mariadbd.ours"; }
  # A user and database of our own: a host that already runs SLURM accounting has a 'slurm'
  # user with its own password, which CREATE USER IF NOT EXISTS would keep (and must not change).
  mariadb -e "CREATE DATABASE IF NOT EXISTS orchestrator_test_acct_db;
              CREATE USER IF NOT EXISTS 'orchestrator_test'@'localhost' IDENTIFIED BY 'local-test-db';
              ALTER USER 'orchestrator_test'@'localhost' IDENTIFIED BY 'local-test-db';
              GRANT ALL ON orchestrator_test_acct_db.* TO 'orchestrator_test'@'localhost';"

  ours_alive slurmdbd || slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  shape > "$STATE/shape"
  if [ "$NODES" -eq 0 ]; then
    slurmctld -c  # -c: no jobs of an earlier cluster
    wait_for 30 slurmctld scontrol ping
    slurmd -N localhost
    scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
  else
    network_up
    unshare --uts sh -c 'hostname orch-ctl && exec slurmctld -c'
    wait_for 30 slurmctld scontrol ping
    local i
    for i in $(seq 1 "$NODES"); do
      mkdir -p "$STATE/spool/orch-node$i"
      nsenter --net="/run/netns/orch-node$i" unshare --uts sh -c "hostname orch-node$i && exec slurmd -N orch-node$i"
    done
    scontrol update nodename="orch-node[1-$NODES]" state=resume >/dev/null 2>&1 || true
  fi
  wait_for 60 "the nodes" nodes_idle
  echo "cluster.sh: SLURM is up ($(shape); state in $STATE)"
}

alive() {  # a process of this name that is not a zombie (anyone's: munge and MariaDB may be the host's)
  ps -C "$1" -o stat= 2>/dev/null | grep -qv '^Z'
}

# What stop may end: only what this script started. SLURM's own daemons write their pids into
# $STATE (slurm.conf and slurmdbd.conf say so: nobody else's are there); munged and MariaDB,
# which the host may run already, are recorded in $STARTED ("name pid start-ticks") only
# where this script started them; and every process in a node's network namespace (slurmd,
# its slurmstepd and the jobs' tasks) is ours. A pid is ours only while its process is
# still the one recorded: the same name, or the same start time.
STARTED=$STATE/started

stat_field() {  # PID N: field N of /proc/PID/stat after the name (1: the state, 20: the start)
  awk -v n="$2" '{sub(/.*\) /, ""); print $n}' "/proc/$1/stat" 2>/dev/null
}

living() {  # PID...: those still alive (not zombies)
  local pid
  for pid in "$@"; do
    [ -r "/proc/$pid/stat" ] && [ "$(stat_field "$pid" 1)" != Z ] && echo "$pid"
  done
}

running_as() {  # PID NAME: the process is alive and named NAME
  [ -n "$(living "$1")" ] && [ "$(cat "/proc/$1/comm" 2>/dev/null)" = "$2" ]
}

start_ticks() { stat_field "$1" 20; }

record() {  # NAME PIDFILE: a daemon this script just started
  local pid
  pid=$(cat "$2" 2>/dev/null) && [ -n "$pid" ] && echo "$1 $pid $(start_ticks "$pid")" >> "$STARTED"
}

ours() {  # the pids of every live process this script started
  local pidfile pid name start
  for pidfile in "$STATE"/slurmctld.pid "$STATE"/slurmdbd.pid "$STATE"/slurmd-*.pid; do
    [ -f "$pidfile" ] || continue
    name=$(basename "$pidfile" .pid); name=${name%%-*}
    pid=$(cat "$pidfile" 2>/dev/null) && running_as "$pid" "$name" && echo "$pid"
  done
  if [ -f "$STARTED" ]; then
    while read -r name pid start; do
      running_as "$pid" "$name" && [ "$(start_ticks "$pid")" = "$start" ] && echo "$pid"
    done < "$STARTED"
  fi
  [ -f "$STATE/network" ] || return 0
  for ns in $(ip netns list 2>/dev/null | awk '/^orch-node[0-9]+/ {print $1}'); do
    living $(ip netns pids "$ns" 2>/dev/null)
  done
}

ours_alive() {  # NAME: a process of that name among ours
  local pid
  for pid in $(ours); do [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && return 0; done
  return 1
}

stop() {
  local pids signal deadline
  # Our controller's jobs are ours: cancelled first, so that their step daemons end with them.
  ours_alive slurmctld && { squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true; }
  pids=$(ours | sort -u)  # taken once: a daemon removes its pid file as it ends, before it is gone
  for signal in TERM KILL; do  # a slurmd whose node namespace is gone can ignore SIGTERM: then SIGKILL
    [ -n "$(living $pids)" ] || break
    kill -"$signal" $(living $pids) 2>/dev/null || true
    deadline=$((SECONDS + 10))
    while [ -n "$(living $pids)" ] && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
  done
  network_down
  rm -f "$STATE/shape" "$STATE"/slurmd*.pid "$STARTED"
}

usage() { echo "usage: $0 start [--nodes N] [--cpus-per-node C] [--link-mbit R] | stop" >&2; exit 2; }

command=${1:-}; shift || true
while [ $# -gt 0 ]; do
  case $1 in
    --nodes) NODES=${2:?}; shift 2 ;;
    --cpus-per-node) CPUS=${2:?}; shift 2 ;;
    --link-mbit) LINK_MBIT=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
[[ $NODES =~ ^[0-9]+$ && ( -z $CPUS || $CPUS =~ ^[1-9][0-9]*$ ) && ( -z $LINK_MBIT || $LINK_MBIT =~ ^[1-9][0-9]*$ ) ]] || usage
[ "$NODES" -gt 0 ] || [ -z "$CPUS$LINK_MBIT" ] || { echo "cluster.sh: --cpus-per-node and --link-mbit need --nodes" >&2; exit 2; }
case $command in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
