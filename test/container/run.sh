#!/usr/bin/env bash
# The container deployment, tested for real: Dockerfile + docker-compose.yml on a Docker engine.
#
#   bash test/container/run.sh        (as root on a fresh machine; CI calls it from .ci/run)
#
# Installs docker.io, docker-compose and debootstrap with apt when they are missing, starts dockerd
# when no engine answers (and stops that engine at the end), makes the node:20-bookworm-slim
# stand-in with ../shared/container/base-image.sh when the image is absent, then: validates the
# compose file, builds the image, brings the stack up on free loopback ports under its own project
# name, waits for both healthchecks, appends an event, admits a need (Check, Reserve, Release),
# registers a host process in the running tally and sees it end with that process (the host pid
# namespace), checks the journal survives `down` and `up`, checks `docker stop` takes < 3 s, and
# tears everything down (containers, volume, the image it built).
#
# Typical duration, measured on a 2-core machine: 45-85 s with the base image and the build cache in
# place (the TypeScript stage rebuilds when sources changed); about 5 min 15 s without them (base
# image ~1 min 45 s, cold build ~3 min), plus the one-time apt install of docker.io (~1 min). Every
# step prints its elapsed time.
#
# Environment:
#   BERTH_CONTAINER_TEST_KEEP_CACHE=0   also remove the build-stage cache images (kept by default:
#                                       they make the next run's build take seconds, not minutes)
#   BERTH_BASE_IMAGE_SCRIPT=PATH        the base image script (default ../shared/container/base-image.sh)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)

started_at=$(date +%s%N)
step_started_at=$started_at
elapsed() { awk -v a="$1" -v b="$(date +%s%N)" 'BEGIN { printf "%.1f", (b - a) / 1e9 }'; }
step() {
  printf '[container %6ss] %s\n' "$(elapsed "$started_at")" "$*"
  step_started_at=$(date +%s%N)
}
done_step() { printf '[container %6ss]   ok (%ss)%s\n' "$(elapsed "$started_at")" "$(elapsed "$step_started_at")" "${1:+: $1}"; }
fail() {
  printf '[container %6ss] FAILED: %s\n' "$(elapsed "$started_at")" "$*" >&2
  exit 1
}

run_id="$(date +%s)-$$"
project="berthtest$$"
image="berth-test:$run_id"
cache_build="berth-test-cache:build"
cache_deps="berth-test-cache:deps"
engine_pid=""
engine_log=""
sleeper_pid=""
stack_up=0
work=$(mktemp -d)

compose() { docker-compose -p "$project" -f "$repo/docker-compose.yml" "$@"; }

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  if [ "$status" -ne 0 ] && [ "$stack_up" -eq 1 ]; then
    echo "--- last service logs ---" >&2
    compose logs --no-color --tail=30 >&2 2>&1
  fi
  [ -n "$sleeper_pid" ] && kill "$sleeper_pid" 2>/dev/null
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
  rm -rf "$work"
  if [ "$status" -eq 0 ]; then
    printf '[container %6ss] passed\n' "$(elapsed "$started_at")"
  else
    printf '[container %6ss] failed (exit %s)\n' "$(elapsed "$started_at")" "$status" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- small helpers --------------------------------------------------------------------------------

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

# --- 1. tools ---------------------------------------------------------------------------------------
step "tools: docker, dockerd, docker-compose, debootstrap, curl, node"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v curl >/dev/null || missing+=(curl)
command -v node >/dev/null || fail "node is not on PATH (the test uses it to find free ports and read JSON)"
if [ "${#missing[@]}" -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || fail "missing ${missing[*]}: install them (apt-get install docker.io docker-compose debootstrap curl) or run as root"
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "  installing ${missing[*]} with apt-get (the first time takes a few minutes)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null || fail "apt-get update failed"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$work/apt.log" 2>&1 || {
    tail -20 "$work/apt.log" >&2
    fail "apt-get install ${missing[*]} failed"
  }
fi
done_step "$(docker-compose version --short 2>/dev/null | head -1 | sed 's/^/docker-compose /')"

# --- 2. engine --------------------------------------------------------------------------------------
step "Docker engine"
if timeout 10 docker info >/dev/null 2>&1; then
  done_step "an engine already answers; it is left running"
else
  [ "$(id -u)" -eq 0 ] || fail "no Docker engine answers and starting one needs root"
  engine_log="$work/dockerd.log"
  # cgroupfs: these machines run no systemd to delegate cgroups to the engine.
  dockerd --exec-opt native.cgroupdriver=cgroupfs >"$engine_log" 2>&1 &
  engine_pid=$!
  for _ in $(seq 1 120); do
    timeout 5 docker info >/dev/null 2>&1 && break
    kill -0 "$engine_pid" 2>/dev/null || { tail -20 "$engine_log" >&2; engine_pid=""; fail "dockerd exited at start"; }
    sleep 0.5
  done
  timeout 5 docker info >/dev/null 2>&1 || { tail -20 "$engine_log" >&2; fail "dockerd did not answer within 60 s"; }
  done_step "started dockerd (pid $engine_pid)"
fi

# --- 3. base image ----------------------------------------------------------------------------------
step "base image node:20-bookworm-slim"
if docker image inspect node:20-bookworm-slim >/dev/null 2>&1; then
  done_step "present"
else
  script=${BERTH_BASE_IMAGE_SCRIPT:-$repo/../shared/container/base-image.sh}
  [ -f "$script" ] || fail "node:20-bookworm-slim is absent and $script (which makes a stand-in) is missing"
  echo "  making it with $script (about a minute)"
  mkdir -p "$work/base"
  bash "$script" "$work/base" >"$work/base-image.log" 2>&1 || { tail -20 "$work/base-image.log" >&2; fail "base-image.sh failed"; }
  done_step "made by base-image.sh"
fi

# --- 4. compose file --------------------------------------------------------------------------------
step "docker-compose config -q"
docker-compose -f docker-compose.yml config -q || fail "docker-compose.yml is not valid"
done_step

# --- 5. image ---------------------------------------------------------------------------------------
step "docker build (classic builder) -> $image"
# The classic builder: BuildKit is not available on these machines. The build stages are tagged as
# the cache of the next run; a stage they replace becomes an untagged image that cleanup prunes.
export DOCKER_BUILDKIT=0
build() { docker build "$@" . >>"$work/build.log" 2>&1 || { tail -30 "$work/build.log" >&2; fail "docker build $* failed"; }; }
build --target deps -t "$cache_deps"
build --target build -t "$cache_build"
build -t "$image"
done_step "$(docker image inspect --format '{{.Size}}' "$image" | awk '{ printf "%.0f MB", $1 / 1e6 }')"

step "image: non-root user, state volume, healthcheck, production dependencies only"
user=$(docker image inspect --format '{{.Config.User}}' "$image")
[ "$user" = node ] || fail "image user is '$user', expected node"
docker image inspect --format '{{json .Config.Volumes}}' "$image" | grep -q '"/var/lib/berth"' || fail "/var/lib/berth is not a VOLUME"
docker image inspect --format '{{json .Config.Healthcheck}}' "$image" | grep -q healthcheck.mjs || fail "no HEALTHCHECK"
modules=$(docker run --rm --entrypoint sh "$image" -c 'ls /app/node_modules /app/node_modules/@bufbuild /app/node_modules/@berth 2>/dev/null | tr "\n" " "')
for unwanted in typescript vitest @vitest vite @bufbuild/buf @bufbuild/protoc-gen-es @grpc fast-check bench test; do
  case " $modules " in *" ${unwanted#*/} "*) fail "the image carries $unwanted: $modules" ;; esac
done
docker run --rm --entrypoint node "$image" -e 'require("fs-ext").flockSync' >/dev/null || fail "fs-ext does not load in the image"
done_step

# --- 6. up ------------------------------------------------------------------------------------------
step "docker-compose up -d (project $project)"
sessions_port=$(free_port)
budget_port=$(free_port)
while [ "$budget_port" = "$sessions_port" ]; do budget_port=$(free_port); done
token="ct-$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
# The token and a policy setting come from an env file, as a user's deploy/berth.env would give them.
cat >"$work/berth.env" <<EOF
BERTH_TOKEN=$token
BERTH_BUDGET_CPU_PRESSURE=100
EOF
chmod 0600 "$work/berth.env"
export BERTH_IMAGE="$image" BERTH_SESSIONS_PORT="$sessions_port" BERTH_BUDGET_PORT="$budget_port" BERTH_ENV_FILE="$work/berth.env"
stack_up=1
compose up -d --no-build >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "docker-compose up failed"; }
done_step "sessions on 127.0.0.1:$sessions_port, budget on 127.0.0.1:$budget_port"

step "waiting for both healthchecks (grpc.health.v1 through healthcheck.mjs)"
wait_healthy 90
done_step

# --- 7. calls ---------------------------------------------------------------------------------------
step "health without a token; other RPCs refused without it"
rpc "$sessions_port" grpc.health.v1.Health/Check '{}'
[ "$(json .status <<<"$body")" = SERVING ] || fail "sessions health: $body"
rpc "$budget_port" grpc.health.v1.Health/Check '{}'
[ "$(json .status <<<"$body")" = SERVING ] || fail "budget health: $body"
rpc "$sessions_port" berth.sessions.v1.SessionService/ListSessions '{}'
[ "$http_status" = 401 ] && [ "$(json .code <<<"$body")" = unauthenticated ] || fail "no token: expected 401 unauthenticated, got HTTP $http_status $body"
done_step

step "append an event (sessions)"
session="container-$run_id"
rpc_ok "$sessions_port" berth.sessions.v1.SessionService/AppendEvent \
  "{\"sessionId\":\"$session\",\"event\":{\"generate\":{\"pageUrl\":\"http://localhost:3000\",\"count\":3}}}"
[ "$(json .seq <<<"$body")" = 1 ] || fail "AppendEvent: $body"
[ "$(json .snapshot.phase <<<"$body")" = generate_requested ] || fail "AppendEvent snapshot: $body"
done_step "seq 1, phase generate_requested"

step "admit a need (budget: Check, Reserve, Release)"
need='{"items":[{"kind":"NEED_ITEM_KIND_START","name":"container-test","cost":{"memoryBytes":"67108864","cpu":0.1}}]}'
rpc_ok "$budget_port" berth.budget.v1.BudgetService/Check "{\"need\":$need}"
[ "$(json .verdict.fits <<<"$body")" = true ] || fail "Check: does not fit: $body"
[ "$(json .verdict.policy.cpuPressure <<<"$body")" = 100 ] || fail "the env file's BERTH_BUDGET_CPU_PRESSURE did not reach the budget: $body"
[ "$(json .verdict.machine.source <<<"$body")" = SAMPLE_SOURCE_HOST ] || fail "the budget does not sample the host: $body"
rpc_ok "$budget_port" berth.budget.v1.BudgetService/Reserve "{\"need\":$need,\"label\":\"container-test\",\"maxWait\":\"10s\"}"
reservation=$(json .reservation.id <<<"$body")
[ -n "$reservation" ] || fail "Reserve: $body"
rpc_ok "$budget_port" berth.budget.v1.BudgetService/Release "{\"reservationId\":\"$reservation\"}"
[ "$(json .released <<<"$body")" = true ] || fail "Release: $body"
done_step "fits; reserved and released $reservation"

step "host pid namespace: a host process in the running tally ends with it"
sleep 120 &
sleeper_pid=$!
rpc_ok "$budget_port" berth.budget.v1.BudgetService/RegisterRunning \
  "{\"name\":\"container-test-sleeper\",\"cost\":{\"memoryBytes\":\"1048576\",\"cpu\":0.01},\"pid\":$sleeper_pid}"
[ -n "$(json .running.pidStartTime <<<"$body")" ] || fail "the budget cannot see host pid $sleeper_pid (no start time): $body"
running_id=$(json .running.id <<<"$body")
kill "$sleeper_pid"
wait "$sleeper_pid" 2>/dev/null || true
sleeper_pid=""
deadline=$(($(date +%s) + 20))
while rpc_ok "$budget_port" berth.budget.v1.BudgetService/GetState '{}' && grep -q "\"$running_id\"" <<<"$body"; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the running entry of a dead host pid was still counted after 20 s"
  sleep 0.5
done
sessions_pid=$(docker inspect --format '{{.State.Pid}}' "$(container_of sessions)")
lock_pid=$(compose exec -T sessions cat /var/lib/berth/sessions.lock | json .pid)
[ "$lock_pid" = "$sessions_pid" ] || fail "the election lock names pid $lock_pid, the service's host pid is $sessions_pid"
done_step "entry gone after the pid exited; sessions.lock names host pid $sessions_pid"

step "the berth command inside the containers (docker-compose exec, with the token from the env file)"
out=$(compose exec -T sessions berth sessions get "$session" --json 2>&1) || fail "berth sessions get in the container: $out"
grep -q '"pageUrl":"http://localhost:3000"' <<<"$out" || fail "berth sessions get in the container: $out"
out=$(compose exec -T budget berth budget state --json 2>&1) || fail "berth budget state in the container: $out"
grep -q '"policy"' <<<"$out" || fail "berth budget state in the container: $out"
done_step

# --- 8. restart -------------------------------------------------------------------------------------
step "docker-compose down (keeping the volume), up again"
compose down -t 5 >"$work/down.log" 2>&1 || { cat "$work/down.log" >&2; fail "docker-compose down failed"; }
docker volume inspect "${project}_berth-state" >/dev/null 2>&1 || fail "the state volume did not survive down"
compose up -d --no-build >"$work/up2.log" 2>&1 || { cat "$work/up2.log" >&2; fail "docker-compose up (again) failed"; }
wait_healthy 90
done_step

step "the journal survived (GetSnapshot)"
rpc_ok "$sessions_port" berth.sessions.v1.SessionService/GetSnapshot "{\"sessionId\":\"$session\"}"
[ "$(json .exists <<<"$body")" = true ] && [ "$(json .lastSeq <<<"$body")" = 1 ] || fail "GetSnapshot after down/up: $body"
[ "$(json .snapshot.pageUrl <<<"$body")" = http://localhost:3000 ] || fail "GetSnapshot after down/up: $body"
done_step "lastSeq 1, pageUrl http://localhost:3000"

# --- 9. stop ----------------------------------------------------------------------------------------
for service in sessions budget; do
  step "docker stop $service takes < 3 s (SIGTERM handled)"
  id=$(container_of "$service")
  t0=$(date +%s%N)
  docker stop -t 10 "$id" >/dev/null
  took_ms=$((($(date +%s%N) - t0) / 1000000))
  [ "$took_ms" -lt 3000 ] || fail "docker stop $service took ${took_ms} ms (the SIGTERM handler did not end the process)"
  code=$(docker inspect --format '{{.State.ExitCode}}' "$id")
  [ "$code" = 0 ] || fail "$service exited $code after SIGTERM, expected 0 (graceful)"
  done_step "${took_ms} ms, exit 0"
done
