#!/usr/bin/env bash
# The Slurm array recipe of docs/fuzz.md (the CPU script between the slurm-cpu-recipe markers), run
# as written on a one-node Slurm cluster on localhost that this script starts and stops:
#   1. installs slurmctld, slurmd, the Slurm client commands and munge (Debian packages);
#   2. starts munged (private key and socket), slurmctld and slurmd from a slurm.conf in a temp folder
#      (no cgroups, no accounting), waits until the node is idle;
#   3. submits the recipe with CASES=200 (ROPEKV_SLURM_CASES), merges the shard reports with
#      `ropekv report merge`, runs the same campaign unsharded and checks that both reports agree
#      (config, counts, kernel families, skip reasons, non-passed cases);
#   4. submits it again and cancels one array task while it runs: `report merge` of the reports that
#      exist must fail.
# Always stops the daemons and removes the temp folder on exit. Needs root (apt, daemons).
# Usage: bash scripts/slurm_test.sh [path/to/ropekv]   (default build/ropekv)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$(realpath -m "${1:-$root/build/ropekv}")
cd "$root"
source scripts/lib.sh
cases="${ROPEKV_SLURM_CASES:-200}"
job_timeout="${ROPEKV_SLURM_JOB_TIMEOUT:-300}"   # seconds per array job
[ -x "$bin" ] || { echo "slurm: no ropekv binary at $bin (build it first)" >&2; exit 1; }
if [ "$(id -u)" -ne 0 ]; then echo "slurm: run as root (slurmd runs the jobs as root)" >&2; exit 1; fi

install_missing slurm slurmctld slurmd slurm-client munge

# The recipe: the fenced block between the markers, without the fences.
recipe=$(awk '/<!-- slurm-cpu-recipe:begin -->/{f=1; next} /<!-- slurm-cpu-recipe:end -->/{f=0} f && !/^```/' docs/fuzz.md)
[[ "$recipe" == '#!/bin/bash'* ]] ||
  { echo "slurm: docs/fuzz.md has no CPU array script between the slurm-cpu-recipe markers" >&2; exit 1; }
array=$(sed -n 's/^#SBATCH --array=\([0-9]*\)-\([0-9]*\)$/\1 \2/p' <<<"$recipe")
[ -n "$array" ] || { echo "slurm: the recipe has no '#SBATCH --array=A-B' line" >&2; exit 1; }
read -r task_min task_max <<<"$array"
nshards=$((task_max - task_min + 1))

# A Slurm environment around this script (a CI runner that is itself a Slurm job) must not leak in.
for v in $(compgen -e); do case $v in SLURM_* | JOB_COMPLETION_INDEX) unset "$v" ;; esac; done

tmp=$(mktemp -d /tmp/ropekv-slurm.XXXXXX)
chmod 755 "$tmp"   # munged wants its socket folder searchable by everyone
node=$(uname -n | cut -d. -f1)
munged_pid="" ctld_pid="" slurmd_pid="" checked=0

stop_pid() {   # PID NAME: SIGTERM, up to 15 s, then SIGKILL
  local pid=$1 i
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "slurm: $2 did not stop on SIGTERM, killing it" >&2; kill -KILL "$pid" 2>/dev/null || true; fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$? i ids
  set +e
  if [ -n "$ctld_pid" ] && kill -0 "$ctld_pid" 2>/dev/null; then
    ids=$(squeue -h -o %A 2>/dev/null | sort -u)
    if [ -n "$ids" ]; then
      # shellcheck disable=SC2086
      scancel $ids
      for i in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
    fi
  fi
  if [ $rc -ne 0 ] && [ $checked -eq 0 ]; then   # not a failed check but the cluster or the script: its logs
    for f in slurmctld.log slurmd.log munged.log; do
      [ -s "$tmp/$f" ] && { echo "--- $f (last 15 lines)"; tail -n 15 "$tmp/$f"; }
    done
  fi
  stop_pid "$slurmd_pid" slurmd
  stop_pid "$ctld_pid" slurmctld
  stop_pid "$munged_pid" munged
  rm -rf "$tmp"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { echo "slurm: $*" >&2; exit 1; }

# munge: a fresh key and a private socket, so a munged of the host (if any) is left alone.
mungekey --create --keyfile="$tmp/munge.key" >/dev/null 2>&1 ||
  { dd if=/dev/urandom of="$tmp/munge.key" bs=1 count=1024 2>/dev/null; chmod 600 "$tmp/munge.key"; }
munged --foreground --socket="$tmp/munge.socket" --key-file="$tmp/munge.key" --log-file="$tmp/munged.log" \
  --pid-file="$tmp/munged.pid" --seed-file="$tmp/munged.seed" >"$tmp/munged.out" 2>&1 &
munged_pid=$!
for i in $(seq 100); do
  munge -S "$tmp/munge.socket" -n 2>/dev/null | unmunge -S "$tmp/munge.socket" >/dev/null 2>&1 && break
  kill -0 "$munged_pid" 2>/dev/null || { cat "$tmp/munged.out" >&2; die "munged exited"; }
  sleep 0.1
done
munge -S "$tmp/munge.socket" -n | unmunge -S "$tmp/munge.socket" >/dev/null || die "munge credentials do not decode"

mkdir -p "$tmp/state" "$tmp/spool"
cat >"$tmp/slurm.conf" <<EOF
ClusterName=ropekvci
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=${ROPEKV_SLURMCTLD_PORT:-16817}
SlurmdPort=${ROPEKV_SLURMD_PORT:-16818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$tmp/slurm.conf"
slurmctld -D -i >"$tmp/slurmctld.out" 2>&1 &
ctld_pid=$!
slurmd -D -N "$node" >"$tmp/slurmd.out" 2>&1 &
slurmd_pid=$!

# The node must come up idle; one that registers down or drained is resumed once.
state="" resumed=0
for i in $(seq 60); do
  kill -0 "$ctld_pid" 2>/dev/null || { tail -n 20 "$tmp/slurmctld.out" >&2; die "slurmctld exited"; }
  kill -0 "$slurmd_pid" 2>/dev/null || { tail -n 20 "$tmp/slurmd.out" >&2; die "slurmd exited"; }
  state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  if [ $resumed -eq 0 ] && [ "$i" -ge 10 ] && [[ "$state" == down* || "$state" == drain* ]]; then
    scontrol update nodename="$node" state=resume || true
    resumed=1
  fi
  sleep 0.5
done
[ "$state" = idle ] || { sinfo -R >&2 || true; die "node $node not idle after 30 s (state: ${state:-none})"; }
echo "slurm: one-node cluster up (node $node, $(nproc) CPUs, slurm $(sinfo -V | cut -d' ' -f2))"

bindir="$tmp/bin"   # the recipe calls `ropekv`: this binary, whatever its file name
mkdir -p "$bindir" && ln -s "$bin" "$bindir/ropekv"
submit() {   # DIR: the recipe as DIR/fuzz-cpu.sh, submitted from DIR; prints the job id
  mkdir -p "$1"
  printf '%s\n' "$recipe" >"$1/fuzz-cpu.sh"
  (cd "$1" && PATH="$bindir:$PATH" CASES="$cases" sbatch --parsable fuzz-cpu.sh) | cut -d';' -f1
}
wait_job() {   # JOBID: until no task of it is pending or running
  local t0=$SECONDS
  while [ -n "$(squeue -h -j "$1" -o %i 2>/dev/null)" ]; do
    [ $((SECONDS - t0)) -lt "$job_timeout" ] || die "job $1 still queued or running after ${job_timeout} s"
    sleep 0.5
  done
}
task_state() {   # JOBID TASK: JobState of one array task
  scontrol -o show job "$1" | awk -v t="ArrayTaskId=$2" '$0 ~ "(^| )" t " " {
    for (i = 1; i <= NF; i++) if ($i ~ /^JobState=/) { sub(/^JobState=/, "", $i); print $i } }'
}
show_logs() {   # DIR
  local f
  for f in "$1"/fuzz-*.log; do [ -e "$f" ] && { echo "--- $f"; tail -n 5 "$f"; }; done
}

failed=()

# 1. The recipe as written: the merged report of the shards equals the unsharded run.
t1=$SECONDS
run1="$tmp/run1"
job=$(submit "$run1")
wait_job "$job"
bad=""
for t in $(seq "$task_min" "$task_max"); do
  s=$(task_state "$job" "$t"); [ "$s" = COMPLETED ] || bad+=" task $t: ${s:-unknown}"
done
if [ -n "$bad" ]; then
  show_logs "$run1"; echo "slurm: FAILED: array job $job did not complete:$bad"; failed+=(array)
else
  merge_rc=0
  (cd "$run1" && "$bin" report merge reports/shard-*.json --json merged.json) >"$run1/merge.log" 2>&1 || merge_rc=$?
  if [ $merge_rc -gt 1 ] || [ ! -f "$run1/merged.json" ]; then
    cat "$run1/merge.log"; echo "slurm: FAILED: report merge of the $nshards shards (exit $merge_rc)"; failed+=(merge)
  else
    # The unsharded run of the campaign the reports name (their config): same options, no --shard.
    python3 - "$run1/merged.json" >"$run1/argv" <<'EOF' || die "cannot read the campaign config of the merged report"
import json, sys
c = json.load(open(sys.argv[1]))["config"]
if c.get("repro") is not None or c.get("time_limit_s", 0) != 0 or c.get("cases") is None:
    sys.exit("the recipe must be a --cases campaign (no --time, no --repro)")
a = ["--backends", ",".join(c["backends"]), "--cases", str(c["cases"]), "--seed", str(c["seed"]),
     "--max-tokens", str(c["max_tokens"]), "--profile", c["profile"], "--max-ulp", str(c["max_ulp"]),
     "--numerics", c["numerics"], "--variant", c["variant"]]
a += [f for f, on in (("--strict", c["strict"]), ("--bitwise", c["bitwise"]), ("--identify", c["identify"])) if on]
if c.get("pins"):
    a += ["--pin", c["pins"]]
print("\n".join(a))
EOF
    mapfile -t argv <"$run1/argv"
    full_rc=0
    "$bin" fuzz "${argv[@]}" --json "$run1/unsharded.json" >"$run1/unsharded.log" 2>&1 || full_rc=$?
    if [ $full_rc -gt 1 ] || [ ! -f "$run1/unsharded.json" ]; then
      tail -n 20 "$run1/unsharded.log"; echo "slurm: FAILED: the unsharded run (exit $full_rc)"; failed+=(unsharded)
    elif ! python3 - "$run1/merged.json" "$run1/unsharded.json" "$nshards" "$merge_rc" "$full_rc" <<'EOF'
import json, sys
m, u = (json.load(open(p)) for p in sys.argv[1:3])
n, merge_rc, full_rc = (int(x) for x in sys.argv[3:6])
diffs = []
# Everything but the shard records and per-case host timings / dump paths must be identical.
for k in ("format", "schema_version", "contract_version", "config", "counts", "skip_reasons", "variants",
          "numerics", "summary"):
    if m.get(k) != u.get(k):
        diffs.append(f"{k}: merged {json.dumps(m.get(k))} != unsharded {json.dumps(u.get(k))}")
def outcomes(r):
    return {(c["index"], c["outcome"], c["repro"]) for c in r["cases"]}
c = u["counts"]
if len(u["cases"]) == c["total"] - c["passed"]:   # the unsharded list is complete (not capped)
    if outcomes(m) != outcomes(u):
        diffs.append(f"non-passed cases: merged {sorted(outcomes(m))} != unsharded {sorted(outcomes(u))}")
elif not outcomes(u) <= outcomes(m):
    diffs.append("non-passed cases: the unsharded run's are not all in the merged report")
shards = sorted((s["index"], s["count"]) for s in m["shards"])
if shards != [(k, n) for k in range(n)]:
    diffs.append(f"shards: {shards}, expected 0..{n - 1} of {n}")
if sum(s["cases_run"] for s in m["shards"]) != u["config"]["cases"]:
    diffs.append("the shards' cases_run do not add up to the campaign's cases")
if merge_rc != full_rc:
    diffs.append(f"exit codes: report merge {merge_rc}, unsharded fuzz {full_rc}")
if diffs:
    print("slurm: FAILED: merged report != unsharded run:\n  " + "\n  ".join(diffs))
    sys.exit(1)
print(f"slurm: {n} shards merged = unsharded run ({c['total']} cases, {c['passed']} passed"
      + "".join(f", {c[k]} {k}" for k in ("failed", "errored", "skipped", "mistrusted") if c[k]) + ")")
EOF
    then
      failed+=(merged-vs-unsharded)
    fi
  fi
fi
echo "slurm: sharded + unsharded campaign $((SECONDS - t1))s"

# 2. A shard cancelled mid-run (as a preemption or time limit would): merging what exists must fail.
t2=$SECONDS
run2="$tmp/run2"
victim=$((task_min + 1))
job=$(submit "$run2")
# Cancel the task once its ropekv process has been computing for a second (scontrol listpids: the
# processes of the job on this node).
t0=$SECONDS fuzz_pid=""
while [ -z "$fuzz_pid" ]; do
  s=$(task_state "$job" "$victim")
  [ -z "$s" ] || [ "$s" = PENDING ] || [ "$s" = RUNNING ] || die "task $victim ended ($s) before it could be cancelled"
  [ $((SECONDS - t0)) -lt "$job_timeout" ] || die "task $victim did not start ropekv within ${job_timeout} s"
  jid=$(squeue -h -j "${job}_$victim" -t RUNNING -o %A 2>/dev/null || true)
  if [ -n "$jid" ]; then
    for p in $(scontrol listpids "$jid" 2>/dev/null | awk 'NR > 1 {print $1}'); do
      case "$(cat "/proc/$p/comm" 2>/dev/null)" in ropekv*) fuzz_pid=$p ;; esac
    done
  fi
  sleep 0.1
done
sleep 1
kill -0 "$fuzz_pid" 2>/dev/null || die "task $victim's ropekv (pid $fuzz_pid) ended within 1 s, before it could be cancelled"
scancel "${job}_$victim"
wait_job "$job"
s=$(task_state "$job" "$victim")
if [ "$s" != CANCELLED ]; then
  show_logs "$run2"; echo "slurm: FAILED: task $victim ended $s, not CANCELLED (it finished before scancel?)"; failed+=(cancel)
else
  others=""
  for t in $(seq "$task_min" "$task_max"); do
    [ "$t" = "$victim" ] && continue
    s=$(task_state "$job" "$t"); [ "$s" = COMPLETED ] || others+=" task $t: ${s:-unknown}"
  done
  [ -z "$others" ] || { show_logs "$run2"; echo "slurm: FAILED: the other tasks did not complete:$others"; failed+=(array-2); }
  shard=$((victim - task_min))
  present=$(find "$run2/reports" -name "shard-*.json" | wc -l)
  # What the cancelled shard left: no report, or one of the cases it ran before it stopped.
  left="no report"
  if [ -f "$run2/reports/shard-$victim.json" ]; then
    left=$(python3 - "$run2/reports/shard-$victim.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
s, c = r["shards"][0], r["config"]["cases"]
due = (c - s["index"] + s["count"] - 1) // s["count"]
print(f"a report of {s['cases_run']} of its {due} cases" + (", marked interrupted" if r.get("interrupted") or s.get("interrupted") else ""))
EOF
    ) || left="an unreadable report"
  fi
  merge_rc=0
  msg=$(cd "$run2" && "$bin" report merge reports/shard-*.json --json merged.json 2>&1) || merge_rc=$?
  if [ $merge_rc -eq 0 ]; then
    echo "$msg"
    echo "slurm: FAILED: shard $shard was cancelled mid-run ($left), yet report merge of the $present report(s) that exist exited 0"
    failed+=(merge-missing-shard)
  else
    echo "slurm: shard $shard cancelled mid-run ($left): report merge of the $present report(s) exits $merge_rc: $(tail -n 1 <<<"$msg")"
  fi
fi
echo "slurm: cancelled-shard check $((SECONDS - t2))s"

checked=1
if [ ${#failed[@]} -gt 0 ]; then echo "slurm: FAILED: ${failed[*]}"; exit 1; fi
echo "slurm: all passed (${SECONDS}s)"
