#!/usr/bin/env bash
# Make sure Redis is usable for dflash-tasks. Idempotent.
#
#  (a) the `redis-server` binary exists (tests start private servers on free ports); if it is
#      missing, Debian's `redis-server` package is installed with apt-get;
#  (b) a Redis answers at $DFLASH_BROKER_URL (default redis://127.0.0.1:6379/0); if none does and
#      the URL's host is this machine, a local redis-server is started with its data and log in
#      .run/redis/ (append-only file, fsync every second).
#
# The password of the URL, if any, is never printed and never put on a command line.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$(pwd)
URL=${DFLASH_BROKER_URL:-redis://127.0.0.1:6379/0}
VENV_PY="$ROOT/.venv/bin/python"

sudo_cmd() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        echo "ensure_redis: need root (or sudo) to run: $*" >&2
        return 1
    fi
}

# --- (a) the redis-server binary --------------------------------------------------------------
installed=""
if ! command -v redis-server >/dev/null 2>&1; then
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "ensure_redis: redis-server is missing and apt-get is not available; install Redis >= 6" >&2
        exit 1
    fi
    echo "ensure_redis: installing Debian's redis-server package ..."
    sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        redis-server >/dev/null
    installed=" (installed now)"
fi

# --- (b) a Redis at the broker URL ------------------------------------------------------------
# Split the URL with Python (handles [::1], %-escapes); fields are separated by newlines.
parsed=$(DFLASH_URL="$URL" python3 - <<'EOF'
import os
from urllib.parse import unquote, urlsplit

u = urlsplit(os.environ["DFLASH_URL"])
db = (u.path or "/0").lstrip("/") or "0"
print(u.scheme)
print(u.hostname or "")
print(u.port or 6379)
print(db if db.isdigit() else "0")
print(unquote(u.username or ""))
print(unquote(u.password or ""))
netloc = u.netloc
if u.password is not None:
    netloc = (u.username or "") + ":***@" + netloc.rpartition("@")[2]
print(u._replace(netloc=netloc).geturl())
EOF
)
{
    read -r SCHEME
    read -r HOST
    read -r PORT
    read -r DB
    read -r USERNAME
    read -r PASSWORD
    read -r SHOWN
} <<<"$parsed"

ping_redis() {
    local out
    if [ "$SCHEME" != unix ] && command -v redis-cli >/dev/null 2>&1; then
        local args=(-h "$HOST" -p "$PORT" -n "$DB" --no-auth-warning)
        [ "$SCHEME" = rediss ] && args+=(--tls)
        [ -n "$USERNAME" ] && args+=(--user "$USERNAME")
        out=$(REDISCLI_AUTH="$PASSWORD" timeout 5 redis-cli "${args[@]}" ping 2>/dev/null) || return 1
        [ "$out" = PONG ]
    elif [ -x "$VENV_PY" ]; then
        DFLASH_URL="$URL" timeout 10 "$VENV_PY" -c '
import os, redis
redis.Redis.from_url(os.environ["DFLASH_URL"], socket_connect_timeout=3, socket_timeout=3).ping()
' >/dev/null 2>&1
    else
        echo "ensure_redis: neither redis-cli nor .venv/bin/python can ping $SHOWN" >&2
        return 1
    fi
}

if ping_redis; then
    echo "ensure_redis: redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')$installed; Redis is up at $SHOWN"
    exit 0
fi

case "$HOST" in
    127.0.0.1 | localhost | ::1 | 0.0.0.0 | "$(hostname)") ;;
    *)
        echo "ensure_redis: no Redis answers at $SHOWN, and $HOST is not this machine: start it there" >&2
        exit 1
        ;;
esac
if [ "$SCHEME" != redis ]; then
    echo "ensure_redis: no Redis answers at $SHOWN; only redis:// URLs can be started locally" >&2
    exit 1
fi

# The default port keeps its files in .run/redis/; another port gets its own folder.
RUN_DIR="$ROOT/.run/redis"
[ "$PORT" = 6379 ] || RUN_DIR="$ROOT/.run/redis-$PORT"
mkdir -p "$RUN_DIR"
# Config on stdin ("-"): keeps a password off the command line.
{
    if [ -n "$PASSWORD" ] && { [ -z "$USERNAME" ] || [ "$USERNAME" = default ]; }; then
        printf 'requirepass "%s"\n' "$PASSWORD"
    fi
} | redis-server - --daemonize yes --bind "127.0.0.1 -::1" --port "$PORT" \
    --appendonly yes --appendfsync everysec --dir "$RUN_DIR" --logfile "$RUN_DIR/redis.log" \
    --pidfile "$RUN_DIR/redis.pid" >/dev/null

for _ in $(seq 1 100); do
    if ping_redis; then
        echo "ensure_redis: started redis-server$installed on 127.0.0.1:$PORT (data and log in ${RUN_DIR#"$ROOT"/}/); up at $SHOWN"
        exit 0
    fi
    sleep 0.1
done
echo "ensure_redis: started redis-server on port $PORT but it does not answer at $SHOWN; last log lines:" >&2
tail -n 20 "$RUN_DIR/redis.log" >&2 || true
exit 1
