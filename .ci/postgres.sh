#!/usr/bin/env bash
# Start a throwaway local PostgreSQL server for the Optuna RDB test and print its URL.
# Installs the Debian package if missing; runs initdb + pg_ctl as the postgres user on a free
# port under a temporary folder. Prints nothing (and exits non-zero) if any step fails.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >/dev/null
fi
BIN=$(dirname "$(ls -d /usr/lib/postgresql/*/bin/pg_ctl | sort -V | tail -1)")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
DIR=$(mktemp -d /tmp/trainmem-pg.XXXXXX)
chown postgres "$DIR"
RUN=(runuser -u postgres --)
[ "$(id -u)" = "$(id -u postgres)" ] && RUN=()
"${RUN[@]}" "$BIN/initdb" -D "$DIR/data" -U postgres --auth=trust >/dev/null
"${RUN[@]}" "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -t 30 \
  -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1" start >/dev/null
"${RUN[@]}" "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres trainmem_test
echo "postgresql://postgres@127.0.0.1:$PORT/trainmem_test"
