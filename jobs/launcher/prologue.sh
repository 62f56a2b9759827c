# The platform's prologue, run by /bin/sh in every task container before the
# user's command ($1). It must work in any image with a POSIX shell (busybox
# included), change nothing the command relies on, and never fail the task.
mkdir -p /pai/output 2>/dev/null

# Interactive shells (ssh, the browser terminal) see the task's variables.
if [ -d /etc/profile.d ] && [ -w /etc/profile.d ]; then
  export -p > /etc/profile.d/pai-env.sh 2>/dev/null
fi

# SSH: start sshd on the allocated port when the image has it.
if [ -n "$PAI_CONTAINER_SSH_PORT" ] && [ -x /usr/sbin/sshd ]; then
  mkdir -p /root/.ssh /run/sshd && chmod 700 /root/.ssh
  printf '%s\n' "$PAI_SSH_AUTHORIZED_KEYS" > /root/.ssh/authorized_keys
  chmod 600 /root/.ssh/authorized_keys
  if ! ls /etc/ssh/ssh_host_*_key >/dev/null 2>&1; then ssh-keygen -A >/dev/null 2>&1; fi
  /usr/sbin/sshd -p "$PAI_CONTAINER_SSH_PORT" -o PermitRootLogin=prohibit-password \
    -o PasswordAuthentication=no -o PidFile=/run/sshd-pai.pid -o UsePAM=no \
    </dev/null >/dev/null 2>&1 || true
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
