# Sourced by the other scripts. install_missing TAG PACKAGE...: installs the Debian packages that
# are not installed yet (quietly; apt's output is shown only when it fails). Needs root then.
install_missing() {
  local tag=$1; shift
  local missing=() p log
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "$tag: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then echo "$tag: run as root (apt-get install needed)" >&2; exit 1; fi
  log=$(mktemp)
  { apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1 ||
    { cat "$log"; rm -f "$log"; echo "$tag: apt-get install failed" >&2; exit 1; }
  rm -f "$log"
}

# run_with_progress TAG LOG COMMAND...: runs COMMAND with its output in LOG (returns its exit
# status); meanwhile a line on stderr every $ROPEKV_PROGRESS_INTERVAL seconds (default 10, the
# interval of ropekv's own progress lines, harness/progress.h) with the time so far and the last
# "[k/n]" (ninja) or "[ k%]" (make) line of LOG: "setup: building, 40s: [57/69] Building CXX ...".
run_with_progress() {
  local tag=$1 log=$2; shift 2
  local interval="${ROPEKV_PROGRESS_INTERVAL:-10}" start=$SECONDS rc=0 pid ticker
  "$@" >"$log" 2>&1 &
  pid=$!
  (
    while sleep "$interval"; do
      step=$(tr '\r' '\n' <"$log" 2>/dev/null | grep -E '^\[ *[0-9]+(/[0-9]+|%)\]' | tail -n 1 | cut -c 1-120)
      echo "$tag, $((SECONDS - start))s${step:+: $step}" >&2
    done
  ) &
  ticker=$!
  wait "$pid" || rc=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  return "$rc"
}
