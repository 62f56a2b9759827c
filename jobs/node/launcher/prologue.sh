# The platform's prologue, run by /bin/sh in every task container before the
# user's command ($1). It must work in any image with a POSIX shell (busybox
# included), change nothing the command relies on, and never fail the task.
mkdir -p /pai/output 2>/dev/null

# Interactive shells (ssh logins, the browser terminal) see the task's
# variables; the shell's own bookkeeping variables are left to each shell.
if [ -d /etc/profile.d ] && [ -w /etc/profile.d ]; then
  export -p 2>/dev/null | grep -v -E '^(export|declare -x) (PWD|OLDPWD|SHLVL|TERM|HOME|_)=' \
    > /etc/profile.d/pai-env.sh 2>/dev/null
fi

# SSH: start sshd on the allocated port when the image has one. The keys go
# to a file of our own, so the image's ~/.ssh/authorized_keys stays as it is
# (and keeps working). sshd forks into the background; the command below
# runs exactly as it would without it.
if [ -n "$PAI_CONTAINER_SSH_PORT" ] && [ -x /usr/sbin/sshd ] && [ "$(id -u 2>/dev/null)" = 0 ]; then
  mkdir -p /run/sshd /etc/ssh 2>/dev/null && chmod 755 /run/sshd
  printf '%s\n' "$PAI_SSH_AUTHORIZED_KEYS" > /etc/ssh/pai_authorized_keys && chmod 644 /etc/ssh/pai_authorized_keys
  # Only ed25519 if the image has no host key: RSA key generation takes seconds.
  ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1 || ssh-keygen -q -t ed25519 -N '' -f /etc/ssh/ssh_host_ed25519_key >/dev/null 2>&1
  /usr/sbin/sshd -p "$PAI_CONTAINER_SSH_PORT" -E /var/log/pai-sshd.log \
    -o PermitRootLogin=prohibit-password -o PasswordAuthentication=no \
    -o AuthorizedKeysFile=".ssh/authorized_keys /etc/ssh/pai_authorized_keys" \
    -o PidFile=/run/sshd-pai.pid -o UsePAM=no </dev/null >/dev/null 2>&1 || true
fi

# Multi-task jobs: the platform put the job's key and its tasks' names in
# /pai/ssh; root's ssh config gets them once (kept if it has its own).
if [ -f /pai/ssh/peers.conf ] && [ "$(id -u 2>/dev/null)" = 0 ]; then
  mkdir -p /root/.ssh && chmod 700 /root/.ssh
  grep -q '# pai peers' /root/.ssh/config 2>/dev/null ||
    { echo '# pai peers'; cat /pai/ssh/peers.conf; } >> /root/.ssh/config 2>/dev/null
  chmod 600 /root/.ssh/config 2>/dev/null
fi

# codeDir: a read-only copy is mounted at /pai/code; the command starts in a
# writable working folder holding a copy of it (and `code` pointing at it,
# so both `python x.py` and `python code/x.py` work, as in the reference).
if [ -d /pai/code ]; then
  mkdir -p /pai/work && cp -a /pai/code/. /pai/work/ 2>/dev/null
  [ -e /pai/work/code ] || ln -s /pai/code /pai/work/code
  cd /pai/work || true
fi

exec /bin/sh -c "$1"
