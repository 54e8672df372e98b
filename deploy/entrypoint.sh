#!/bin/sh
# The image's entrypoint: runs one berth service, chosen by the first argument or BERTH_SERVICE.
#   sessions | budget   that service alone (node services/<name>/dist/main.js)
#   up                  both in one process (berth up)
#   berth ...           the berth command itself (e.g. `docker run --rm --network host IMAGE berth budget state`)
# Any further arguments are the service's flags (`--help` lists them); settings are better given as
# BERTH_* variables, which the healthcheck reads too.
# `exec`: node replaces this shell, so SIGTERM from `docker stop` reaches the service directly.
set -eu
case "${1:-}" in
  sessions | budget | up | berth)
    BERTH_SERVICE=$1
    shift
    ;;
esac
service=${BERTH_SERVICE:-sessions}
# The healthcheck runs as a separate process with the container's original environment: tell it
# which service this container runs when an argument chose it (best effort: /tmp may be read-only).
printf '%s\n' "$service" >/tmp/berth-service 2>/dev/null || true
case "$service" in
  sessions) exec node /app/services/sessions/dist/main.js "$@" ;;
  budget) exec node /app/services/budget/dist/main.js "$@" ;;
  up) exec node /app/packages/cli/dist/main.js up "$@" ;;
  berth) exec node /app/packages/cli/dist/main.js "$@" ;;
  *)
    echo "berth image: unknown service '$service' (BERTH_SERVICE or the first argument): use sessions, budget, up or berth" >&2
    exit 2
    ;;
esac
