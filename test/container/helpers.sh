# The container test's helpers (sourced by run.sh, which sets what they read: $work, $repo,
# $project, $token, $seed_child, $live_dir, $project_dir, $lock_file, and the step functions and
# compose): the teardown at exit, then the small helpers.

# Ends everything this run started, whatever step it stopped at, and says how the run ended.
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  if [ "$status" -ne 0 ] && [ "$stack_up" -eq 1 ]; then
    echo "--- last service logs ---" >&2
    compose logs --no-color --tail=30 >&2 2>&1
  fi
  [ -n "$sleeper_pid" ] && kill "$sleeper_pid" 2>/dev/null
  for pid in "${seed_pids[@]}"; do kill "$pid" 2>/dev/null; done
  if [ "$etcd_stack_up" -eq 1 ]; then
    if [ "$status" -ne 0 ]; then
      echo "--- last etcd stack logs ---" >&2
      etcd_compose logs --no-color --tail=20 >&2 2>&1
    fi
    step "teardown: the etcd stack, down -v"
    etcd_compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || echo "  (down -v of the etcd stack failed)" >&2
    done_step
  fi
  [ -n "$etcd_image" ] && docker image rm -f "$etcd_image" >/dev/null 2>&1
  [ -n "$fresh_container" ] && docker rm -f "$fresh_container" >/dev/null 2>&1
  [ -n "$limited_container" ] && docker rm -f -v "$limited_container" >/dev/null 2>&1
  [ -n "$fresh_image" ] && docker image rm -f "$fresh_image" >/dev/null 2>&1
  if [ "$stack_up" -eq 1 ]; then
    step "teardown: down -v (containers, network, state volume)"
    compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || echo "  (down -v failed)" >&2
    done_step
  fi
  if [ -n "${engine_pid:-}" ] || docker info >/dev/null 2>&1; then
    docker image rm -f "$image" >/dev/null 2>&1
    # Stage images a rebuild left behind (untagged, marked by the Dockerfile's label).
    docker image prune -f --filter label=berth.build-stage >/dev/null 2>&1
    if [ "${BERTH_CONTAINER_TEST_KEEP_CACHE:-1}" = 0 ]; then
      docker image rm -f "$cache_build" "$cache_deps" >/dev/null 2>&1
      docker image prune -f --filter label=berth.build-stage >/dev/null 2>&1
    fi
  fi
  if [ -n "$engine_pid" ]; then
    step "stopping the Docker engine this test started (pid $engine_pid)"
    kill -TERM "$engine_pid" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$engine_pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$engine_pid" 2>/dev/null; then
      echo "  dockerd did not stop within 30 s: SIGKILL" >&2
      kill -KILL "$engine_pid" 2>/dev/null
    fi
    wait "$engine_pid" 2>/dev/null
    done_step
  fi
  [ -n "$project_dir" ] && rm -rf "$project_dir"
  rm -rf "$work"
  if [ "$status" -eq 0 ]; then
    printf '[container %6ss] passed\n' "$(elapsed "$started_at")"
  else
    printf '[container %6ss] failed (exit %s)\n' "$(elapsed "$started_at")" "$status" >&2
  fi
  exit "$status"
}

# json EXPR: evaluates a property path (".a.b[0].c") on the JSON read from stdin; prints it (objects
# as JSON), or nothing when it is absent.
json() {
  node -e '
    let text = "";
    process.stdin.on("data", (d) => (text += d)).on("end", () => {
      let value;
      try { value = JSON.parse(text); } catch { process.exit(3); }
      for (const part of process.argv[1].match(/[^.[\]]+/g) ?? []) value = value == null ? undefined : value[part];
      if (value === undefined || value === null) return;
      process.stdout.write(typeof value === "object" ? JSON.stringify(value) : String(value));
    });' "$1"
}

# rpc PORT METHOD JSON [TOKEN]: a Connect unary call with JSON over HTTP/1.1. Sets $http_status
# and $body (not printed: a command substitution would lose the status).
http_status=""
body=""
rpc() {
  http_status=$(curl -sS --max-time 15 -o "$work/body" -w '%{http_code}' -X POST \
    -H 'content-type: application/json' -H 'connect-protocol-version: 1' \
    ${4:+-H "authorization: Bearer $4"} -d "$3" "http://127.0.0.1:$1/$2") || fail "curl could not reach 127.0.0.1:$1/$2"
  body=$(cat "$work/body")
}

# rpc_ok PORT METHOD JSON: rpc with the token; fails unless HTTP 200.
rpc_ok() {
  rpc "$1" "$2" "$3" "$token"
  [ "$http_status" = 200 ] || fail "$2 answered HTTP $http_status: $body"
}

free_port() {
  node -e 'const s = require("net").createServer().listen(0, "127.0.0.1", () => { console.log(s.address().port); s.close(); });'
}

container_of() { compose ps -q "$1"; }

# The etcd stack (docker-compose.etcd.yml) under a project name of its own.
etcd_compose() { docker-compose -p "${project}etcd" -f "$repo/docker-compose.etcd.yml" "$@"; }

wait_healthy() {
  local deadline=$(($(date +%s) + ${1:-90})) service id health state
  for service in sessions budget; do
    id=$(container_of "$service")
    [ -n "$id" ] || fail "no $service container"
    while :; do
      state=$(docker inspect --format '{{.State.Status}}' "$id")
      health=$(docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}}' "$id")
      [ "$health" = healthy ] && break
      [ "$health" = none ] && fail "$service has no healthcheck"
      [ "$state" = running ] || [ "$state" = restarting ] || fail "$service is $state (health $health)"
      [ "$(date +%s)" -lt "$deadline" ] || fail "$service not healthy in time (state $state, health $health): $(docker inspect --format '{{range .State.Health.Log}}{{.Output}}{{end}}' "$id" | tail -3)"
      sleep 0.5
    done
  done
}

now_ms() { date +%s%3N; }

# ms_of RFC3339: milliseconds since the epoch (host and containers share one kernel clock).
ms_of() { node -e 'const t = Date.parse(process.argv[1]); if (Number.isNaN(t)) process.exit(3); console.log(t)' "$1"; }

# seed_start NAME WAIT_MS [UMASK]: a host process that takes $lock_file's lock with the seed's
# lock-file protocol (services/sessions/dist/locks/testing/seed-holder-child.js, the seed's
# withSourceLockSync step by step), waiting up to WAIT_MS, and holds it until seed_release NAME.
# It prints JSON lines to $work/NAME.out: started {at} as it begins trying, then acquired
# {lockPath, pid, at} and released {at}, or locked {at} (exit 3) when the wait ran out. Sets
# NAME_pid and NAME_fd. It runs as this script's user (root in CI) with the usual umask, 022, unless
# UMASK says otherwise: the seed creates its lock file with open(..., "wx"), so the umask decides
# whether the containers' uid can read it.
seed_start() {
  local name=$1 wait_ms=$2 mask=${3:-022} pid fd
  mkfifo "$work/$name.in"
  (
    umask "$mask"
    exec node "$seed_child" "{\"liveDir\":\"$live_dir\",\"cwd\":\"$project_dir\",\"file\":\"$lock_file\",\"owner\":\"host-seed-$name\",\"waitMs\":$wait_ms}" \
      <"$work/$name.in" >"$work/$name.out" 2>"$work/$name.err"
  ) &
  pid=$!
  seed_pids+=("$pid")
  # Hold the write end open: the child blocks reading stdin (holding the lock) until a line comes.
  exec {fd}>"$work/$name.in"
  printf -v "${name}_pid" '%s' "$pid"
  printf -v "${name}_fd" '%s' "$fd"
}

seed_release() {
  local fd_var="${1}_fd" fd
  fd=${!fd_var}
  printf 'release\n' >&"$fd"
  eval "exec $fd>&-"
}

# seed_event NAME EVENT [SECONDS]: waits (bounded) for the child's EVENT line; prints it.
seed_event() {
  local deadline=$(($(date +%s) + ${3:-30})) line pid_var="${1}_pid"
  while :; do
    line=$(grep -m1 "\"event\":\"$2\"" "$work/$1.out" 2>/dev/null || true)
    [ -n "$line" ] && { printf '%s' "$line"; return 0; }
    if ! kill -0 "${!pid_var}" 2>/dev/null; then
      sleep 0.05
      line=$(grep -m1 "\"event\":\"$2\"" "$work/$1.out" 2>/dev/null || true)
      [ -n "$line" ] && { printf '%s' "$line"; return 0; }
      fail "the seed process $1 exited without '$2': $(cat "$work/$1.out" "$work/$1.err" 2>/dev/null | tail -5)"
    fi
    [ "$(date +%s)" -lt "$deadline" ] || fail "the seed process $1 did not report '$2' within ${3:-30} s: $(cat "$work/$1.out" 2>/dev/null)"
    sleep 0.05
  done
}
