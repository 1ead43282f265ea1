#!/usr/bin/env bash
# The local Redis the Celery demo and its e2e cells use as broker (CI runs as root on bare Debian):
#   bash scripts/redis.sh start    install Debian's redis-server if missing, start it daemonized on
#                                  127.0.0.1:$HBFIX_REDIS_PORT (default 6389), wait for PING; prints
#                                  the broker URL redis://127.0.0.1:PORT/0. Idempotent.
#   bash scripts/redis.sh stop     shut that server down (it keeps no data: no RDB, no AOF)
set -euo pipefail

log() { echo "redis.sh: $*" >&2; }
PORT="${HBFIX_REDIS_PORT:-6389}"
DIR=/tmp/hbfix-redis-$PORT
ping() { redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -qx PONG; }

start() {
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        [[ "$(id -u)" == 0 ]] || { log "no redis-server and not root: apt-get install redis-server"; exit 1; }
        log "installing Debian's redis-server"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2 9>&- && apt-get install -y -qq --no-install-recommends redis-server >&2 9>&-
    fi
    if ! ping; then
        mkdir -p "$DIR"
        # Debian's package may start its own server on 6379; this one is ours, on its own port.
        # 9>&-: the daemon must not inherit (and hold forever) the provisioning lock.
        redis-server --bind 127.0.0.1 --port "$PORT" --daemonize yes --dir "$DIR" \
            --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" --save '' --appendonly no >&2 9>&-
        for _ in $(seq 60); do ping && break; sleep 0.5; done
        ping || { log "Redis not answering PING on 127.0.0.1:$PORT; see $DIR/redis.log"; exit 1; }
    fi
    echo "redis://127.0.0.1:$PORT/0"
}

# One provisioning at a time: e2e cells and demos share the machine's server.
exec 9>/tmp/hbfix-redis.lock
flock -w 300 9 || { log "waited 300 s for /tmp/hbfix-redis.lock; another provisioning is stuck"; exit 1; }
case "${1:-}" in
    start) start ;;
    stop) ! ping || redis-cli -h 127.0.0.1 -p "$PORT" shutdown nosave >/dev/null 2>&1 || true ;;
    *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
