# Shared set-up for scripts/run and scripts/test. Sourced, not run.
# Everything it starts is recorded in var/run/*.pid and stopped by PID.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VAR="${PORTAL_VAR_DIR:-$ROOT/var}"
# scripts/test keeps its records apart (PORTAL_RUN_SET=test), so running the
# tests beside a running portal never loses what scripts/run started.
RUN="$VAR/run${PORTAL_RUN_SET:+/$PORTAL_RUN_SET}"
LOGDIR="$VAR/log"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
# var/ holds the database, secrets, logs and users' files: ours alone (0700),
# and what is made in it here too. With the group postgres it stays 0710: the
# local PostgreSQL's user passes through to its data folder and can list or
# read nothing else (SECURITY.md, finding 12).
# Every process started from here makes its files private too (Redis' dump,
# logs, the SQLite file, stored files): 0640 files, 0750 folders, nothing for
# others, not even below var/. Group access stays for the modes the portal
# sets itself (users' files 0640 in 0750 folders). Staged code is opened for
# containers explicitly (jobs/node/staging.py), PostgreSQL sets its own
# umask, dockerd its own (022), and build_images goes back to 022 for images.
umask 027
mkdir -p "$VAR"
if [ "$(stat -c %G "$VAR")" = postgres ]; then chmod 710 "$VAR"; else chmod 700 "$VAR"; fi
mkdir -p -m 700 "$VAR/run" "$RUN" "$LOGDIR"
chmod 700 "$VAR/run" "$RUN" "$LOGDIR"
find "$LOGDIR" -maxdepth 1 -type f -name '*.log' -exec chmod 600 {} + 2>/dev/null || true
# A dump an older run left world-readable (Redis writes the next one anew, under the umask).
[ -f "$VAR/redis.rdb" ] && chmod 600 "$VAR/redis.rdb"

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
  # stop_pidfile FILE [SECONDS] [SIGNAL]: SIGNAL (TERM), wait, then SIGKILL;
  # only that PID. Fails (and keeps FILE) when the process outlives even SIGKILL.
  local file=$1 wait=${2:-20} signal=${3:-TERM} pid
  pid_alive "$file" || { rm -f "$file"; return 0; }
  pid=$(cat "$file")
  kill -"$signal" "$pid" 2>/dev/null || true
  for _ in $(seq $((wait * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  kill -0 "$pid" 2>/dev/null && return 1
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
  install_packages python3 python3-venv docker.io iproute2 redis-server busybox-static mmdebstrap openssh-client curl ca-certificates
}

hadoop_packages() {
  # Java and Maven, for the HDFS minicluster (tests, scripts/hdfs-minicluster).
  install_packages openjdk-17-jdk-headless maven
}

build_minicluster() {
  # Compile hadoop/minicluster; Maven resolves Hadoop into its local cache
  # (~/.m2) the first time and writes target/classpath.txt, so starting it
  # later needs only java. Again only when its pom or sources change.
  local dir="$ROOT/hadoop/minicluster" stamp="$ROOT/hadoop/minicluster/target/classpath.txt"
  if [ -f "$stamp" ] && [ -z "$(find "$dir/pom.xml" "$dir/src" -newer "$stamp" -print -quit)" ]; then return 0; fi
  say "building the HDFS minicluster (hadoop/minicluster; Maven fetches Hadoop once)"
  mvn -B -q -f "$dir/pom.xml" compile || die "mvn compile in hadoop/minicluster failed"
  touch "$stamp"
}

# The virtualenv's interpreter: Debian's own python3 (base_packages installs
# it), not whichever python3 comes first on PATH (pyenv's, say), so that the
# tests run on the interpreter a fresh Debian machine runs the portal with:
# a newer build first on PATH once hid that Debian 12's 3.11.2 has no tar
# extraction filters. PORTAL_PYTHON picks another.
BASE_PYTHON="${PORTAL_PYTHON:-/usr/bin/python3}"

make_venv() {
  local stamp="$VENV/.requirements.sha256" want
  want=$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)
  [ -x "$BASE_PYTHON" ] || die "no Python at $BASE_PYTHON (PORTAL_PYTHON)"
  # pyvenv.cfg's home: the folder of the interpreter .venv was made from,
  # which venv writes as `base` is worked out here.
  local base made
  base=$("$BASE_PYTHON" -c 'import os, sys; print(os.path.dirname(os.path.abspath(sys._base_executable)))')
  # (a fresh checkout has no pyvenv.cfg: sed's failure must not end the
  # script under set -e)
  made=$(sed -n 's/^home = //p' "$VENV/pyvenv.cfg" 2>/dev/null || true)
  if [ -x "$PY" ] && [ "$made" != "$base" ]; then
    say "making .venv again from $BASE_PYTHON (it was made from $made/)"
    rm -rf "$VENV"
  fi
  if [ -x "$PY" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  say "creating the virtualenv (.venv) from requirements.txt"
  [ -x "$PY" ] || "$BASE_PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
  echo "$want" > "$stamp"
}

docker_reachable() { timeout 10 docker info >/dev/null 2>&1; }

# The default bridge of a dockerd we start: named so the node's firewall
# matches it (jobs/node/launcher/firewall.py), with traffic between its
# containers off, so one-task jobs run on it (SINGLE_TASK_NETWORK). Docker
# sets up no embedded DNS there, which saves 50-80 ms of every task's start.
TASK_BRIDGE=pai-default

ensure_docker() {
  # Use a reachable engine; start dockerd only when there is none.
  if docker_reachable; then return 0; fi
  if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
    die "DOCKER_HOST=$DOCKER_HOST does not answer"
  fi
  say "starting dockerd (log: $LOGDIR/dockerd.log)"
  # dockerd --bridge takes a bridge that exists; it gives it a free subnet.
  ip link show "$TASK_BRIDGE" >/dev/null 2>&1 || ip link add "$TASK_BRIDGE" type bridge \
    || die "could not create the bridge $TASK_BRIDGE (ip link add)"
  dockerd --pidfile "$RUN/dockerd.pid" --bridge "$TASK_BRIDGE" --icc=false >>"$LOGDIR/dockerd.log" 2>&1 &
  # Listed at once: one that runs but never answers here (DOCKER_HOST names
  # another socket) is stopped with the rest when the script gives up.
  echo dockerd >> "$RUN/started"
  for _ in $(seq 300); do
    docker_reachable && { DOCKERD_STARTED=1; return 0; }; sleep 0.1
  done
  die "dockerd did not come up; see $LOGDIR/dockerd.log"
}

build_images() {
  # Files put into images (a rootfs, its /etc/passwd) must stay readable
  # there for any user an image runs as: the default umask, for this only.
  (umask 022; "$ROOT/scripts/build-images")
}

secret() {
  # secret NAME [BYTES]: a random value made once and kept in var/ (mode 600),
  # made again when the kept one is shorter than BYTES random bytes give
  # (a secret key from an older checkout was too short for Django's checks).
  local file="$VAR/$1" bytes=${2:-32} want
  want=$(( bytes * 4 / 3 - 4 ))  # base64 length less what tr may strip, roughly
  if [ ! -s "$file" ] || [ "$(wc -c < "$file")" -lt "$want" ]; then
    (umask 077; head -c $((bytes * 2)) /dev/urandom | base64 | tr -d '/+=\n' | head -c $((bytes * 4 / 3)) > "$file")
    chmod 600 "$file"
  fi
  cat "$file"
}

PG_BIN=/usr/lib/postgresql/15/bin

postgres_packages() { install_packages postgresql; }

as_postgres() {
  # as_postgres COMMAND...: run as the postgres system user (PostgreSQL
  # refuses root).
  setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
}

start_postgres() {
  # start_postgres PORT: scripts/run's own PostgreSQL 15: data folder
  # var/postgres (postgres's, 0700), superuser portal whose password is kept
  # in var/postgres_password (secret), listening on 127.0.0.1:PORT and a unix
  # socket in var/postgres/socket, recorded as "postgres" (stop_started stops
  # it by PID); a database "portal". Sets POSTGRES_URL to its DATABASE_URL.
  local port=$1 data="$VAR/postgres" password pwfile
  password=$(secret postgres_password)
  if ! pid_alive "$RUN/postgres.pid"; then
    # The postgres user passes through var/ (0710, group postgres) to its
    # folder and can list or read nothing else there (SECURITY.md, finding 12).
    chgrp postgres "$VAR" && chmod 710 "$VAR"
    mkdir -p "$data" && chown postgres:postgres "$data" && chmod 700 "$data"
    if [ ! -f "$data/PG_VERSION" ]; then
      say "making the PostgreSQL cluster in $data"
      pwfile=$(mktemp) && printf '%s\n' "$password" > "$pwfile" && chown postgres "$pwfile"
      as_postgres "$PG_BIN/initdb" -D "$data" -U portal --pwfile="$pwfile" --auth=scram-sha-256 \
        --encoding=UTF8 --no-locale >>"$LOGDIR/postgres.log" 2>&1 || { rm -f "$pwfile"; die "initdb failed; see $LOGDIR/postgres.log"; }
      rm -f "$pwfile"
    fi
    mkdir -p "$data/socket" && chown postgres:postgres "$data/socket" && chmod 700 "$data/socket"
    say "starting PostgreSQL on 127.0.0.1:$port (log: $LOGDIR/postgres.log)"
    # setpriv itself, not as_postgres: a backgrounded function runs in a
    # subshell, whose PID $! would be.
    setpriv --reuid=postgres --regid=postgres --init-groups -- "$PG_BIN/postgres" -D "$data" -h 127.0.0.1 \
      -p "$port" -k "$data/socket" </dev/null >>"$LOGDIR/postgres.log" 2>&1 &
    echo $! > "$RUN/postgres.pid"; echo postgres >> "$RUN/started"
    for _ in $(seq 300); do
      "$PG_BIN/pg_isready" -q -h "$data/socket" -p "$port" && break
      pid_alive "$RUN/postgres.pid" || die "PostgreSQL exited; see $LOGDIR/postgres.log"
      sleep 0.1
    done
    "$PG_BIN/pg_isready" -q -h "$data/socket" -p "$port" || die "PostgreSQL did not answer; see $LOGDIR/postgres.log"
  fi
  if ! PGPASSWORD=$password "$PG_BIN/psql" -h "$data/socket" -p "$port" -U portal -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = 'portal'" | grep -q 1; then
    PGPASSWORD=$password "$PG_BIN/createdb" -h "$data/socket" -p "$port" -U portal portal \
      || die "could not create the database portal"
  fi
  POSTGRES_URL="postgres://portal:$password@127.0.0.1:$port/portal"
}

stop_started() {
  # Stop, newest first, everything this script started. Says what it could
  # not stop, keeps those in the record, and then fails.
  [ -f "$RUN/started" ] || return 0
  local name left=()
  while read -r name; do
    [ -n "$name" ] || continue
    # PostgreSQL: SIGINT is its fast shutdown (SIGTERM would wait for every client).
    if ! stop_pidfile "$RUN/$name.pid" "$([ "$name" = dockerd ] || [ "$name" = postgres ] && echo 30 || echo 20)" \
        "$([ "$name" = postgres ] && echo INT || echo TERM)"; then
      printf 'could not stop %s (pid %s)\n' "$name" "$(cat "$RUN/$name.pid" 2>/dev/null)" >&2
      left+=("$name")
    fi
    # Its bridge goes with the dockerd we started (a leftover would only be idle).
    if [ "$name" = dockerd ] && ! pid_alive "$RUN/dockerd.pid"; then
      ip link delete "$TASK_BRIDGE" 2>/dev/null || true
    fi
  done < <(tac "$RUN/started")
  if [ ${#left[@]} -gt 0 ]; then printf '%s\n' "${left[@]}" > "$RUN/started"; return 1; fi
  rm -f "$RUN/started"
}
