# Shared set-up for scripts/run and scripts/test. Sourced, not run.
# Everything it starts is recorded in var/run/*.pid and stopped by PID.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VAR="${PORTAL_VAR_DIR:-$ROOT/var}"
RUN="$VAR/run"
LOGDIR="$VAR/log"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
mkdir -p "$RUN" "$LOGDIR"

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
  # Re-run the calling script as root (apt-get and dockerd need it).
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || die "run this as root (or install sudo)"
    exec sudo -E "$0" "$@"
  fi
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {
  # stop_pidfile FILE [SECONDS]: SIGTERM, wait, then SIGKILL; only that PID.
  local file=$1 wait=${2:-20} pid
  pid_alive "$file" || { rm -f "$file"; return 0; }
  pid=$(cat "$file")
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq $((wait * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$file"
}

install_packages() {
  # install_packages PKG...: apt-get only what is missing.
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Debian starts a package's service on install; we start our own Redis and
  # dockerd, by PID, so keep invoke-rc.d from starting any (policy-rc.d 101).
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod +x "$policy"; made_policy=1; fi
  local ok=0
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || ok=$?
  [ "$made_policy" = 1 ] && rm -f "$policy"
  [ "$ok" = 0 ] || die "apt-get install ${missing[*]} failed"
}

base_packages() {
  install_packages python3 python3-venv docker.io redis-server busybox-static mmdebstrap openssh-client curl ca-certificates
}

make_venv() {
  local stamp="$VENV/.requirements.sha256" want
  want=$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)
  if [ -x "$PY" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "creating the virtualenv (.venv) from requirements.txt"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
  echo "$want" > "$stamp"
}

docker_reachable() { timeout 10 docker info >/dev/null 2>&1; }

ensure_docker() {
  # Use a reachable engine; start dockerd only when there is none.
  if docker_reachable; then return 0; fi
  if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
    die "DOCKER_HOST=$DOCKER_HOST does not answer"
  fi
  say "starting dockerd (log: $LOGDIR/dockerd.log)"
  dockerd --pidfile "$RUN/dockerd.pid" >>"$LOGDIR/dockerd.log" 2>&1 &
  for _ in $(seq 300); do docker_reachable && { echo dockerd >> "$RUN/started"; return 0; }; sleep 0.1; done
  die "dockerd did not come up; see $LOGDIR/dockerd.log"
}

build_images() {
  "$ROOT/scripts/build-images"
}

secret() {
  # secret NAME: a random value made once and kept in var/ (mode 600).
  local file="$VAR/$1"
  if [ ! -s "$file" ]; then (umask 077; head -c 32 /dev/urandom | base64 | tr -d '/+=\n' > "$file"); fi
  cat "$file"
}

stop_started() {
  # Stop, newest first, everything this script started.
  [ -f "$RUN/started" ] || return 0
  tac "$RUN/started" | while read -r name; do
    case "$name" in
      dockerd) stop_pidfile "$RUN/dockerd.pid" 30 ;;
      *) stop_pidfile "$RUN/$name.pid" 20 ;;
    esac
  done
  rm -f "$RUN/started"
}
