# Shared by setup.sh and build-server.sh (sourced; each defines its own log/die first).

# Whether this CPU has every /proc/cpuinfo flag given.
cpu_has() {
  local have f
  have=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  for f in "$@"; do
    case "$have" in *" $f "*) ;; *) return 1 ;; esac
  done
}

# apt-get installs Debian packages, through sudo when not root.
apt_install() {
  local SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
    SUDO="sudo"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >&2
}
