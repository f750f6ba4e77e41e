#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for testing profiles/slurm for real:
#   tools/slurm_cluster.sh start|stop|status
# Run as root on Debian/Ubuntu. `start` is idempotent: it installs slurm-wlm and munge when
# missing, (re)writes /etc/slurm/slurm.conf from this host's name, cores and memory, starts
# munged, slurmctld and slurmd that are not running, and waits until sinfo shows the node
# idle. The config must sit at /etc/slurm/slurm.conf: that is where the `srun` inside each
# job looks for it. No accounting database: job status comes from squeue, so finished jobs
# stay listed for MinJobAge seconds.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)
LOGDIR=/var/log/slurm
STATE=/var/lib/slurm

log() { echo "slurm_cluster: $*" >&2; }

alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
        && command -v munged >/dev/null; then
        return
    fi
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
}

start_munge() {
    # munged refuses a key that others can read, and must run as the munge user.
    install -d -o munge -g munge -m 700 /etc/munge /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 755 /run/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    if ! alive /run/munge/munged.pid; then
        runuser -u munge -- /usr/sbin/munged
    fi
    munge -n | unmunge >/dev/null
}

write_conf() {
    local cpus mem
    cpus=$(nproc)
    # Below the machine's memory, else slurmd reports less than configured and the node drains.
    mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    install -d /etc/slurm "$LOGDIR" "$STATE/slurmctld" "$STATE/slurmd"
    cat >"$CONF.new" <<EOF
# Written by tools/slurm_cluster.sh: one node, one default partition.
ClusterName=fewerpasses
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd.log
# No cgroups in a container: track processes through /proc, bind no tasks.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Finished jobs stay in squeue this long: the executor reads their state there.
MinJobAge=600
ReturnToService=2
NodeName=$HOST CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=main Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
    if cmp -s "$CONF.new" "$CONF"; then
        rm "$CONF.new"
        return 1
    fi
    mv "$CONF.new" "$CONF"
    return 0
}

node_state() {
    sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | head -1
}

start() {
    [[ $EUID -eq 0 ]] || { log "run as root"; exit 1; }
    install_packages
    start_munge
    if write_conf; then
        log "wrote $CONF"
        # A changed config needs fresh daemons.
        stop_slurm
    fi
    alive /run/slurmctld.pid || slurmctld
    alive /run/slurmd.pid || slurmd
    local state=""
    for _ in $(seq 60); do
        state=$(node_state)
        case $state in
            idle | mixed | allocated | completing) break ;;
            down* | drain* | drained*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
        esac
        sleep 1
    done
    case $state in
        idle | mixed | allocated | completing) log "node $HOST is $state" ;;
        *) log "node $HOST did not come up (state '$state'); see $LOGDIR"; exit 1 ;;
    esac
}

stop_slurm() {
    local pidfile pid
    for pidfile in /run/slurmd.pid /run/slurmctld.pid; do
        if alive "$pidfile"; then
            pid=$(cat "$pidfile")
            kill "$pid"
            while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
        fi
    done
}

stop() {
    stop_slurm
    if alive /run/munge/munged.pid; then
        kill "$(cat /run/munge/munged.pid)"
    fi
    log "stopped"
}

status() {
    local pidfile
    for pidfile in /run/munge/munged.pid /run/slurmctld.pid /run/slurmd.pid; do
        if alive "$pidfile"; then echo "$(basename "$pidfile" .pid): running ($(cat "$pidfile"))"; else echo "$(basename "$pidfile" .pid): stopped"; fi
    done
    sinfo -N -o '%N %P %T %c %m' 2>/dev/null || true
    alive /run/slurmctld.pid && alive /run/slurmd.pid && [[ $(node_state) =~ ^(idle|mixed|allocated|completing)$ ]]
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
