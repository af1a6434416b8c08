# shellcheck shell=bash
# Shared by setup.sh and build-server.sh (sourced; each defines its own log/die first).

# Whether this CPU has every /proc/cpuinfo flag given.
cpu_has() {
  local have f
  have=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  for f in "$@"; do
    case "$have" in *" $f "*) ;; *) return 1 ;; esac
  done
}

# apt-get installs Debian packages, through sudo when not root. The package lists are
# refreshed first (a fresh machine has none, an old one stale ones), and an apt run of
# another process (an overlapping run installing too) is waited for, up to 10 minutes.
_apt() {
  local SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
    SUDO="sudo"
  fi
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >&2
}
apt_install() { _apt --no-install-recommends "$@"; }
apt_install_recommends() { _apt "$@"; }
