#!/usr/bin/env bash
# A real single-node SLURM on localhost, for tests and for trying the cluster path on a workstation.
#
#   bash slurm/local-cluster.sh start    # install (Debian packages, as root), configure, start; idempotent
#   bash slurm/local-cluster.sh status   # sinfo / squeue
#   bash slurm/local-cluster.sh stop     # stop the daemons (the packages stay)
#
# State, spool and logs live in $VITSINKS_SLURM_DIR (default /tmp/vitsinks-slurm). Without slurmdbd, `sacct` fails;
# a stand-in answering from squeue is put in $VITSINKS_SLURM_DIR/bin: prepend it to PATH (the tests do) so that
# submitit can read job states. Every wait below is bounded.
set -euo pipefail

DIR=${VITSINKS_SLURM_DIR:-/tmp/vitsinks-slurm}
CONF_DIR=/etc/slurm
HOST=$(hostname -s)

log() { echo "[local-cluster] $*"; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  for _ in $(seq 1 "$limit"); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  log "timed out after ${limit}s waiting for: $what"
  return 1
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
     && command -v munged >/dev/null; then
    return
  fi
  log "installing munge and SLURM (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  timeout 300 apt-get update -qq
  timeout 600 apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client >/dev/null
}

write_config() {
  mkdir -p "$DIR"/{state,spool,log,bin} "$CONF_DIR"
  local node cpus mem
  node=$(slurmd -C | head -n 1)
  cpus=$(echo "$node" | grep -o 'CPUs=[0-9]*' | cut -d= -f2)
  mem=$(echo "$node" | grep -o 'RealMemory=[0-9]*' | cut -d= -f2)
  mem=$((mem * 9 / 10))
  cat >"$CONF_DIR/slurm.conf" <<EOF
ClusterName=vitsinks-local
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
MinJobAge=300
KillWait=5
MpiDefault=none
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  # sacct stand-in: submitit asks `sacct -o JobID,State,NodeList --parsable2 -j IDS`; answer from squeue.
  cat >"$DIR/bin/sacct" <<'EOF'
#!/usr/bin/env bash
ids=""
while [ $# -gt 0 ]; do
  case "$1" in
    -j) ids="$2"; shift 2 ;;
    -j*) ids="${1#-j}"; shift ;;
    *) shift ;;
  esac
done
echo "JobID|State|NodeList"
[ -n "$ids" ] && squeue -h -t all -j "$ids" -o '%i|%T|%N' 2>/dev/null || true
EOF
  chmod +x "$DIR/bin/sacct"
}

start_munge() {
  if pgrep -x munged >/dev/null; then return; fi
  mkdir -p /etc/munge /var/lib/munge /var/log/munge /run/munge
  [ -s /etc/munge/munge.key ] || mungekey -c -k /etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
  chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
  if id munge >/dev/null 2>&1; then
    su -s /bin/sh munge -c "munged" || munged --force
  else
    munged --force
  fi
  wait_for 20 "munged" sh -c 'munge -n | unmunge'
}

node_idle() { sinfo -h -N -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'; }

start() {
  install_packages
  write_config
  start_munge
  if ! pgrep -x slurmctld >/dev/null; then
    slurmctld -c
  fi
  wait_for 30 "slurmctld" scontrol ping
  if ! pgrep -x slurmd >/dev/null; then
    slurmd
  fi
  if ! wait_for 30 "node idle" node_idle; then
    scontrol update nodename="$HOST" state=resume >/dev/null 2>&1 || true
    wait_for 30 "node idle after resume" node_idle
  fi
  log "up: $(sinfo -h -o '%P %a %D %t' | head -n 1); export PATH=$DIR/bin:\$PATH for sacct"
}

stop() {
  for daemon in slurmd slurmctld; do
    pkill -x "$daemon" 2>/dev/null || true
  done
  for _ in $(seq 1 20); do
    pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null || break
    sleep 0.5
  done
  pkill -9 -x slurmd 2>/dev/null || true
  pkill -9 -x slurmctld 2>/dev/null || true
  pkill -x munged 2>/dev/null || true
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo; squeue ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
