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
