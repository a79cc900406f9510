#!/usr/bin/env bash
# A real single-node SLURM cluster on localhost for the tests (Debian, as root):
#   tests/slurm/cluster.sh start   install (once) and start munge, MariaDB (socket only),
#                                  slurmdbd, slurmctld and slurmd; wait until the node is idle
#   tests/slurm/cluster.sh stop    stop them by pid
# Config goes to /etc/slurm (where sbatch, sacct and submitit look); state, logs and pids
# to $STATE. Facts from this kind of machine: the packages install in ~15 s;
# proctrack/linuxproc + task/affinity need no cgroups; munged must run as munge;
# slurmdbd.conf must be 0600; cred_expire=10 lets a requeued job restart in ~16 s.
set -euo pipefail
STATE=${ORCH_SLURM_STATE:-/var/lib/orchestrator-slurm}
PACKAGES="munge slurm-client slurmctld slurmd slurmdbd mariadb-server"

install() {
  command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null
}

write_config() {
  mkdir -p /etc/slurm "$STATE"/{ctld,spool} /run/mysqld
  local cpus sockets cores threads mem
  read -r cpus sockets cores threads mem < <(slurmd -C | head -1 | sed -E \
    's/.*CPUs=([0-9]+).*SocketsPerBoard=([0-9]+).*CoresPerSocket=([0-9]+).*ThreadsPerCore=([0-9]+).*RealMemory=([0-9]+).*/\1 \2 \3 \4 \5/')
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=orchestrator
SlurmctldHost=localhost
AuthType=auth/munge
AuthInfo=cred_expire=10
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobRequeue=1
KillWait=5
MinJobAge=5
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus Sockets=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$((mem * 95 / 100)) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
  cat > /etc/slurm/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=local-test-db
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/slurmdbd.log
CONF
  chmod 0600 /etc/slurm/slurmdbd.conf
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "cluster.sh: $what did not come up" >&2; tail -20 "$STATE"/*.log >&2 || true; exit 1; }
    sleep 0.5
  done
}

start() {
  install
  write_config
  [ -s /etc/munge/munge.key ] || { mungekey --create --force 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
  wait_for 10 munge munge -n

  chown mysql:mysql /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  if ! pgrep -x mariadbd >/dev/null; then
    (mariadbd --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock --pid-file=/run/mysqld/mariadb.pid \
      >"$STATE/mariadb.log" 2>&1 &)
  fi
  wait_for 30 MariaDB mariadb -e "select 1"
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
              CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'local-test-db';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"

  pgrep -x slurmdbd >/dev/null || slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  pgrep -x slurmctld >/dev/null || slurmctld
  wait_for 30 slurmctld scontrol ping
  pgrep -x slurmd >/dev/null || slurmd -N localhost
  scontrol update nodename=localhost state=resume >/dev/null 2>&1 || true
  wait_for 60 "the node" bash -c '[ "$(sinfo -h -N -o %T | head -1)" = idle ]'
  echo "cluster.sh: SLURM is up on localhost (state in $STATE)"
}

stop() {
  for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/slurmdbd.pid" /run/mysqld/mariadb.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  pkill -x munged 2>/dev/null || true
  sleep 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
