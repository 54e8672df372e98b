#!/usr/bin/env bash
# The container deployment, tested for real: Dockerfile + docker-compose.yml on a Docker engine.
#
#   bash test/container/run.sh        (as root on a fresh machine; CI calls it from .ci/run)
#
# Installs docker.io, docker-compose and debootstrap with apt when they are missing, starts dockerd
# when no engine answers (and stops that engine at the end), makes the node:20-bookworm-slim
# stand-in with $BERTH_BASE_IMAGE_SCRIPT when the image is absent, then: validates the
# compose file, builds the image, brings the stack up on free loopback ports under its own project
# name, run from a scratch project (mounted at its own path, its live directory served in place),
# checks the compose limits reached the containers, waits for both healthchecks, appends an event
# (its journal lands in the project), admits a need (Check, Reserve and its retry, Release), registers a host
# process in the running tally and sees it end with that process (the host pid namespace), takes a
# source lock on the host with the seed's lock-file protocol and sees the containerised service
# honour it (Inspect names the host holder, Acquire waits for it) and the reverse (a host process
# using the seed's protocol waits for a lock the container holds), checks that a budget run alone
# with `--memory 512m --cpus 1` (and the sample source auto) reports those limits, read from the
# host's cgroup hierarchy (v1, hybrid or v2), with and without a cgroup namespace, and refuses a need
# above them (`berth admit` exits 80), checks the journal and the fencing tokens survive `down` and
# `up`, checks `docker stop` takes < 3 s; then brings up
# docker-compose.etcd.yml (three etcd members built from deploy/etcd.Dockerfile, two sessions
# instances of the image) and checks the two instances act as one, also with a member stopped; and
# tears everything down (containers, volumes, the images it built, the scratch project).
#
# The host side of the lock checks runs the seed's protocol from services/sessions/dist: build the
# repository first (`npm ci` does; `npm run build` after a change).
#
# Typical duration, measured on a 2-core machine: about 75 s with the base image and the build cache
# in place (the TypeScript stage rebuilds when sources changed); about 5 min 45 s without them (base
# image ~1 min 50 s, cold build ~3 min), plus the one-time apt install of docker.io (~1 min); the two
# budgets held to their container's limits add about 30 s to each. Every step prints its elapsed time.
#
# Environment:
#   BERTH_CONTAINER_TEST_KEEP_CACHE=0   also remove the build-stage cache images (kept by default:
#                                       they make the next run's build take seconds, not minutes)
#   BERTH_BASE_IMAGE_SCRIPT=PATH        a script that makes node:20-bookworm-slim (.ci/run finds CI's)
#   BERTH_CONTAINER_FRESH_CLONE=1       then, on a fresh machine of the README's kind (a container of
#                                       test/container/fresh-machine.Dockerfile: no etcd, no gRPC or Go
#                                       packages), run a plain clone's `npm install && npm test` without
#                                       the seeds, which must pass with those tests skipped, each saying
#                                       so (about 7 min; .ci/run sets it)
#   BERTH_FRESH_CLONE_REPORT=PATH       where to copy that run's vitest JSON report (.ci/run counts it)
#   BERTH_FRESH_NODE=24                 the fresh machine's Node, from the npm registry (default: the
#                                       base image's 20; .ci/run sets 24)
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
seed_pids=()
stack_up=0
etcd_stack_up=0
etcd_image=""
fresh_image=""
fresh_container=""
limited_container=""
work=$(mktemp -d)
# The user's project, made below. Not under /tmp, which is a tmpfs inside the containers.
project_dir=""

# Run from the project, as a user would: the compose file mounts $PWD at the same path.
compose() { (cd "${project_dir:-$repo}" && docker-compose -p "$project" -f "$repo/docker-compose.yml" "$@"); }

# cleanup (the teardown) and the small helpers: json, rpc, free_port, wait_healthy, the seed-protocol processes.
source "$repo/test/container/helpers.sh"
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. tools ---------------------------------------------------------------------------------------
step "tools: docker, dockerd, docker-compose, debootstrap, curl, node"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker >/dev/null || missing+=(docker.io)
command -v docker-compose >/dev/null || missing+=(docker-compose)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v curl >/dev/null || missing+=(curl)
command -v node >/dev/null || fail "node is not on PATH (the test uses it to find free ports and read JSON)"
seed_child="$repo/services/sessions/dist/locks/testing/seed-holder-child.js"
[ -f "$seed_child" ] || fail "$seed_child is missing: build the repository first (npm run build)"
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
  script=${BERTH_BASE_IMAGE_SCRIPT:-}
  [ -n "$script" ] && [ -f "$script" ] || fail "node:20-bookworm-slim is absent: pull it, or set BERTH_BASE_IMAGE_SCRIPT to a script that makes a stand-in"
  echo "  making it with $script (about a minute)"
  mkdir -p "$work/base"
  bash "$script" "$work/base" >"$work/base-image.log" 2>&1 || { tail -20 "$work/base-image.log" >&2; fail "base-image.sh failed"; }
  done_step "made by base-image.sh"
fi

# --- 4. compose file --------------------------------------------------------------------------------
step "docker-compose config -q"
docker-compose -f docker-compose.yml config -q || fail "docker-compose.yml is not valid"
docker-compose -f docker-compose.etcd.yml config -q || fail "docker-compose.etcd.yml is not valid"
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
# The user's project: a directory of the uid the containers run as (BERTH_UID, default 1000, the
# image's node user), with a source file to lock. Its real path, as the compose file asks.
project_dir=$(mktemp -d /var/tmp/berth-container-project.XXXXXX)
project_dir=$(realpath "$project_dir")
mkdir "$project_dir/src"
printf 'body { color: teal; }\n' >"$project_dir/src/app.css"
chown -R 1000:1000 "$project_dir"
live_dir="$project_dir/.impeccable/live"
lock_file="$project_dir/src/app.css"
# The token, a policy setting and the live directory come from an env file, as a user's
# deploy/berth.env would give them.
cat >"$work/berth.env" <<EOF
BERTH_TOKEN=$token
BERTH_BUDGET_CPU_PRESSURE=100
BERTH_LIVE_DIR=.impeccable/live
EOF
chmod 0600 "$work/berth.env"
export BERTH_IMAGE="$image" BERTH_SESSIONS_PORT="$sessions_port" BERTH_BUDGET_PORT="$budget_port" BERTH_ENV_FILE="$work/berth.env"
stack_up=1
compose up -d --no-build >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "docker-compose up failed"; }
done_step "sessions on 127.0.0.1:$sessions_port, budget on 127.0.0.1:$budget_port, project $project_dir"

step "the compose file's limits and hardening reached the containers"
# No `version:` key: the Compose specification must still apply mem_limit, cpus and pids_limit.
check_container() {
  local service=$1 want=$2 got
  got=$(docker inspect --format '{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.PidsLimit}} {{.HostConfig.ReadonlyRootfs}} {{.HostConfig.CapDrop}} {{.Config.User}} {{.HostConfig.NetworkMode}} {{.HostConfig.PidMode}}' "$3")
  [ "$got" = "$want" ] || fail "$service: memory, cpus, pids, read-only, cap_drop, user, network, pid are '$got', expected '$want'"
}
sessions_id=$(container_of sessions)
check_container sessions "536870912 1000000000 256 true [ALL] 1000:1000 host host" "$sessions_id"
check_container budget "268435456 500000000 128 true [ALL] 1000:1000 host host" "$(container_of budget)"
mount=$(docker inspect --format '{{range .Mounts}}{{if eq .Type "bind"}}{{.Source}} -> {{.Destination}} rw={{.RW}}{{end}}{{end}}' "$sessions_id")
[ "$mount" = "$project_dir -> $project_dir rw=true" ] || fail "sessions: the project is not mounted at its own path: $mount"
workdir=$(docker inspect --format '{{.Config.WorkingDir}}' "$sessions_id")
[ "$workdir" = "$project_dir" ] || fail "sessions: working directory '$workdir', expected the project $project_dir"
done_step "512 MiB / 1 cpu / 256 pids and 256 MiB / 0.5 cpu / 128 pids; project at its own path"

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
# BERTH_LIVE_DIR=.impeccable/live, relative to the service's working directory: the project.
journal="$live_dir/sessions/$session.jsonl"
[ -f "$journal" ] || fail "the journal is not in the project's live directory on the host ($journal): $(ls -la "$live_dir/sessions" 2>&1)"
[ "$(stat -c %u "$journal")" = 1000 ] || fail "the journal belongs to uid $(stat -c %u "$journal"), expected the containers' 1000"
done_step "seq 1, phase generate_requested; journal at $journal on the host"

step "admit a need (budget: Check, Reserve, Release)"
need='{"items":[{"kind":"NEED_ITEM_KIND_START","name":"container-test","cost":{"memoryBytes":"67108864","cpu":0.1}}]}'
rpc_ok "$budget_port" berth.budget.v1.BudgetService/Check "{\"need\":$need}"
[ "$(json .verdict.fits <<<"$body")" = true ] || fail "Check: does not fit: $body"
[ "$(json .verdict.policy.cpuPressure <<<"$body")" = 100 ] || fail "the env file's BERTH_BUDGET_CPU_PRESSURE did not reach the budget: $body"
[ "$(json .verdict.machine.source <<<"$body")" = SAMPLE_SOURCE_HOST ] || fail "the budget does not sample the host: $body"
reserve="{\"need\":$need,\"owner\":\"container-test\",\"maxWait\":\"10s\",\"requestId\":\"container-test-$$\"}"
rpc_ok "$budget_port" berth.budget.v1.BudgetService/Reserve "$reserve"
reservation=$(json .reservation.id <<<"$body")
[ -n "$reservation" ] || fail "Reserve: $body"
# A retry with the same request id answers the same reservation.
rpc_ok "$budget_port" berth.budget.v1.BudgetService/Reserve "$reserve"
[ "$(json .reservation.id <<<"$body")" = "$reservation" ] || fail "Reserve repeated with its request id: $body"
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
while rpc_ok "$budget_port" berth.budget.v1.BudgetService/GetState '{"pageSize":1000}' && grep -q "\"$running_id\"" <<<"$body"; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the running entry of a dead host pid was still counted after 20 s"
  sleep 0.5
done
sessions_pid=$(docker inspect --format '{{.State.Pid}}' "$(container_of sessions)")
lock_pid=$(compose exec -T sessions cat /var/lib/berth/sessions.lock | json .pid)
[ "$lock_pid" = "$sessions_pid" ] || fail "the election lock names pid $lock_pid, the service's host pid is $sessions_pid"
done_step "entry gone after the pid exited; sessions.lock names host pid $sessions_pid"

# --- 7b. source locks across the container boundary -------------------------------------------------
# The seed's lock file of a path is <live>/locks/<sha256(path)[0:24]>.lock: with the project at the
# same path inside and out, the host process and the service name the same file for the same path.
step "a lock taken on the host with the seed's protocol: the containerised service sees its holder"
seed_start seed_holder 0
acquired=$(seed_event seed_holder acquired)
lock_path=$(json .lockPath <<<"$acquired")
# Created by root (this script's user in CI) under umask 022: the containers' uid can read it.
[ "$(stat -c '%a' "$lock_path")" = 644 ] || fail "the seed's lock file is mode $(stat -c '%a' "$lock_path"), expected 644"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Inspect "{\"file\":\"$lock_file\"}"
[ "$(json .file <<<"$body")" = "$lock_file" ] || fail "Inspect: the service names the file differently: $body"
[ "$(json .lockPath <<<"$body")" = "$lock_path" ] || fail "Inspect: the service's lock file is not the one the host process took ($lock_path): $body"
[ "$(json .holder.kind <<<"$body")" = HOLDER_KIND_SEED_LOCK_FILE ] || fail "Inspect: no seed lock-file holder: $body"
[ "$(json .holder.pid <<<"$body")" = "$seed_holder_pid" ] || fail "Inspect: the holder is not host pid $seed_holder_pid: $body"
[ "$(json .holder.owner <<<"$body")" = host-seed-seed_holder ] || fail "Inspect: the holder's owner: $body"
rpc "$sessions_port" berth.locks.v1.LockService/Acquire "{\"file\":\"$lock_file\",\"owner\":\"container-test\",\"maxWait\":\"0s\",\"ttl\":\"60s\"}" "$token"
[ "$http_status" = 429 ] && [ "$(json .code <<<"$body")" = resource_exhausted ] || fail "Acquire with max_wait 0 while the host holds it: expected 429 resource_exhausted (WAIT_EXHAUSTED), got HTTP $http_status $body"
grep -q "pid $seed_holder_pid" <<<"$body" || fail "Acquire's refusal does not name the host holder (pid $seed_holder_pid): $body"
done_step "Inspect names host pid $seed_holder_pid and $lock_path; Acquire without waiting is RESOURCE_EXHAUSTED"

step "Acquire in the container waits for the host's seed-protocol lock, and gets it once released"
(
  curl -sS --max-time 90 -o "$work/acquire.json" -w '%{http_code}' -X POST \
    -H 'content-type: application/json' -H 'connect-protocol-version: 1' -H "authorization: Bearer $token" \
    -d "{\"file\":\"$lock_file\",\"owner\":\"container-test\",\"maxWait\":\"60s\",\"ttl\":\"120s\"}" \
    "http://127.0.0.1:$sessions_port/berth.locks.v1.LockService/Acquire" >"$work/acquire.status" 2>"$work/acquire.err"
) &
acquire_pid=$!
deadline=$(($(date +%s) + 30))
while rpc_ok "$sessions_port" berth.locks.v1.LockService/Inspect "{\"file\":\"$lock_file\"}" && [ "$(json .waiters.0.owner <<<"$body")" != container-test ]; do
  kill -0 "$acquire_pid" 2>/dev/null || fail "Acquire returned while the host process held the lock: HTTP $(cat "$work/acquire.status") $(cat "$work/acquire.json")"
  [ "$(date +%s)" -lt "$deadline" ] || fail "the Acquire never queued behind the host's lock: $body"
  sleep 0.05
done
[ "$(json .holder.pid <<<"$body")" = "$seed_holder_pid" ] || fail "Inspect while waiting: the holder is not host pid $seed_holder_pid: $body"
kill -0 "$acquire_pid" 2>/dev/null || fail "Acquire returned while the host process held the lock: $(cat "$work/acquire.json")"
seed_release seed_holder
released=$(seed_event seed_holder released)
acquire_status=0
wait "$acquire_pid" || acquire_status=$?
[ "$acquire_status" = 0 ] && [ "$(cat "$work/acquire.status")" = 200 ] || fail "Acquire after the host released: curl $acquire_status, HTTP $(cat "$work/acquire.status") $(cat "$work/acquire.json" "$work/acquire.err")"
lease=$(cat "$work/acquire.json")
lease_token=$(json .lease.leaseToken <<<"$lease")
fencing_before=$(json .lease.fencingToken <<<"$lease")
[ -n "$lease_token" ] && [ -n "$fencing_before" ] || fail "Acquire: no lease: $lease"
released_ms=$(json .at <<<"$released")
granted_ms=$(ms_of "$(json .lease.acquireTime <<<"$lease")")
# Never two holders: the service granted only after the host process had removed its file.
[ "$granted_ms" -ge "$released_ms" ] || fail "the service granted the lock at $granted_ms, before the host process released it at $released_ms"
seed_status=0
wait "$seed_holder_pid" || seed_status=$?
[ "$seed_status" = 0 ] || fail "the seed process exited $seed_status: $(cat "$work/seed_holder.err")"
done_step "granted $((granted_ms - released_ms)) ms after the host process released (fencing token $fencing_before)"

step "a lock held in the container: a host process using the seed's protocol sees a live holder and waits"
[ -f "$lock_path" ] || fail "the service holds $lock_file but its lock file $lock_path is not on the host"
[ "$(json .pid <"$lock_path")" = "$sessions_pid" ] || fail "the lock file names pid $(json .pid <"$lock_path"), the service's host pid is $sessions_pid"
# Written by the containers' uid, readable by any host user's seed process.
[ "$(stat -c '%a %u' "$lock_path")" = "644 1000" ] || fail "the service's lock file is mode/uid $(stat -c '%a %u' "$lock_path"), expected 644 1000"
berth_file_token=$(json .token <"$lock_path")
seed_start seed_blocked 1000
blocked_from=$(json .at <<<"$(seed_event seed_blocked started)")
locked=$(seed_event seed_blocked locked)
blocked_status=0
wait "$seed_blocked_pid" || blocked_status=$?
[ "$blocked_status" = 3 ] || fail "the seed process that found the lock held exited $blocked_status, expected 3 (SOURCE_LOCKED)"
eval "exec $seed_blocked_fd>&-"
blocked_ms=$(($(json .at <<<"$locked") - blocked_from))
[ "$blocked_ms" -ge 1000 ] || fail "the seed process gave up after $blocked_ms ms, before its 1000 ms wait: it did not wait for the holder"
[ "$(json .token <"$lock_path")" = "$berth_file_token" ] || fail "the seed process replaced the service's live lock file"
# The lease renewed over plain HTTP/1.1 (unary KeepAlive): what a client that cannot hold a stream does.
rpc_ok "$sessions_port" berth.locks.v1.LockService/KeepAlive "{\"leaseTokens\":[\"$lease_token\"]}"
[ "$(json .renewals.0.alive <<<"$body")" = true ] || fail "KeepAlive of the held lease: $body"
seed_start seed_waiter 60000
seed_event seed_waiter started >/dev/null
grep -q '"acquired"' "$work/seed_waiter.out" && fail "a host process took the lock the service holds"
release_from=$(now_ms)
rpc_ok "$sessions_port" berth.locks.v1.LockService/Release "{\"leaseToken\":\"$lease_token\"}"
[ "$(json .released <<<"$body")" = true ] || fail "Release: $body"
waiter_acquired=$(seed_event seed_waiter acquired)
waiter_ms=$(($(json .at <<<"$waiter_acquired") - release_from))
[ "$waiter_ms" -ge 0 ] || fail "the host process took the lock before the service released it"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Inspect "{\"file\":\"$lock_file\"}"
[ "$(json .holder.pid <<<"$body")" = "$seed_waiter_pid" ] || fail "Inspect after the hand-back: the holder is not host pid $seed_waiter_pid: $body"
seed_release seed_waiter
seed_event seed_waiter released >/dev/null
waiter_status=0
wait "$seed_waiter_pid" || waiter_status=$?
[ "$waiter_status" = 0 ] || fail "the seed process exited $waiter_status: $(cat "$work/seed_waiter.err")"
[ ! -e "$lock_path" ] || fail "the lock file outlived both holders: $(cat "$lock_path")"
done_step "a seed process waiting 1000 ms gave up after $blocked_ms ms; a waiting one got the lock $waiter_ms ms after Release was sent"

step "a lock file the service may not read (root's, umask 077) still holds the lock"
seed_start seed_private 0 077
seed_event seed_private acquired >/dev/null
[ "$(stat -c '%a %u' "$lock_path")" = "600 0" ] || fail "the private seed lock file is mode/uid $(stat -c '%a %u' "$lock_path"), expected 600 0"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Inspect "{\"file\":\"$lock_file\"}"
[ "$(json .holder.kind <<<"$body")" = HOLDER_KIND_SEED_LOCK_FILE ] || fail "Inspect: an unreadable lock file is not shown as a holder: $body"
[ -z "$(json .holder.pid <<<"$body")" ] || fail "Inspect: the service read a pid from a file it may not read: $body"
rpc "$sessions_port" berth.locks.v1.LockService/Acquire "{\"file\":\"$lock_file\",\"owner\":\"container-test\",\"maxWait\":\"1s\",\"ttl\":\"60s\"}" "$token"
[ "$http_status" = 429 ] && [ "$(json .code <<<"$body")" = resource_exhausted ] || fail "Acquire (1 s) while an unreadable lock file is there: expected 429 resource_exhausted, got HTTP $http_status $body"
[ "$(stat -c '%a %u' "$lock_path" 2>/dev/null)" = "600 0" ] || fail "the unreadable lock file was removed or replaced while its holder lived"
seed_release seed_private
seed_event seed_private released >/dev/null
private_status=0
wait "$seed_private_pid" || private_status=$?
[ "$private_status" = 0 ] || fail "the seed process exited $private_status: $(cat "$work/seed_private.err")"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Acquire "{\"file\":\"$lock_file\",\"owner\":\"container-test\",\"maxWait\":\"0s\",\"ttl\":\"60s\"}"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Release "{\"leaseToken\":\"$(json .lease.leaseToken <<<"$body")\"}"
done_step "held by an unnamed holder (Inspect, Acquire RESOURCE_EXHAUSTED after its 1 s wait); free once removed"

step "the berth command inside the containers (docker-compose exec, with the token from the env file)"
out=$(compose exec -T sessions berth sessions get "$session" --json 2>&1) || fail "berth sessions get in the container: $out"
grep -q '"pageUrl":"http://localhost:3000"' <<<"$out" || fail "berth sessions get in the container: $out"
out=$(compose exec -T budget berth budget state --json 2>&1) || fail "berth budget state in the container: $out"
grep -q '"policy"' <<<"$out" || fail "berth budget state in the container: $out"
done_step

# --- 7c. a budget held to its container's limits ------------------------------------------------------
# A budget started with `docker run --memory 512m --cpus 1` and the sample source `auto` must budget
# for those limits, whichever cgroup hierarchy the host has (v1, hybrid or v2), with and without a
# cgroup namespace (Docker's default on a v1 host is none: the container sees its own cgroup at the
# mount point, /proc/self/cgroup naming /docker/<id>). Its own loopback only (--network none): the
# berth command runs inside it. The cpu pressure gate is off (100 %), as in the env file above:
# these steps check the cgroup's limits, and a CI box busy with other work must not queue them.
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then want_version=CGROUP_VERSION_V2; else want_version=CGROUP_VERSION_V1; fi
for cgroupns in host private; do
  step "a budget in a container of 512 MiB and 1 cpu (--cgroupns $cgroupns, sample source auto) reports them and refuses a need above them"
  limited_container="berth-limited-$cgroupns-$run_id"
  docker run -d --name "$limited_container" --memory 512m --cpus 1 --cgroupns "$cgroupns" --network none \
    --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges:true \
    -e BERTH_SERVICE=budget -e BERTH_TOKEN="$token" -e BERTH_BUDGET_SAMPLE_SOURCE=auto -e BERTH_BUDGET_CPU_PRESSURE=100 \
    "$image" >/dev/null || fail "docker run of the limited budget failed"
  deadline=$(($(date +%s) + 60))
  until out=$(docker exec "$limited_container" berth budget machine --json 2>&1); do
    [ "$(docker inspect --format '{{.State.Status}}' "$limited_container")" = running ] || fail "the limited budget exited: $(docker logs --tail 20 "$limited_container" 2>&1)"
    [ "$(date +%s)" -lt "$deadline" ] || fail "the limited budget did not answer GetMachine within 60 s: $out"
    sleep 0.5
  done
  machine=$(json .machine <<<"$out")
  [ "$(json .source <<<"$machine")" = SAMPLE_SOURCE_CGROUP ] || fail "the limited budget does not budget for its cgroup: $out"
  [ "$(json .cgroup.version <<<"$machine")" = "$want_version" ] || fail "the limited budget read $(json .cgroup.version <<<"$machine"), expected $want_version: $out"
  [ "$(json .cgroup.memoryMax <<<"$machine")" = 536870912 ] || fail "the limited budget's memory limit is not 512 MiB: $out"
  [ "$(json .totalBytes <<<"$machine")" = 536870912 ] || fail "the limited budget's total memory is not its 512 MiB: $out"
  available=$(json .availableBytes <<<"$machine")
  [ -n "$available" ] && [ "$available" -le 536870912 ] || fail "the limited budget's available memory is above its limit: $out"
  [ "$(json .cgroup.cpuQuota <<<"$machine")" = 1 ] || fail "the limited budget's cpu quota is not 1: $out"
  [ "$(json .cores <<<"$machine")" = 1 ] || fail "the limited budget's cores are not its 1 cpu: $out"
  cgroup_line=$(docker exec "$limited_container" berth budget machine 2>&1 | grep '^cgroup') || fail "berth budget machine prints no cgroup line"
  echo "  $cgroup_line"
  # 1G is more than the whole budget of a 512 MiB machine (75 % of it): never admitted, at once.
  refused=0
  out=$(docker exec "$limited_container" berth admit --memory 1G --max-wait 0 --json -- true 2>&1) || refused=$?
  [ "$refused" = 80 ] || fail "berth admit --memory 1G in the 512 MiB container exited $refused, expected 80 (impossible): $out"
  grep -q '"event":"refused"' <<<"$out" || fail "berth admit --memory 1G: no refused event: $out"
  refused=0
  out=$(docker exec "$limited_container" berth admit --cpu 2 --memory 16M --max-wait 0 --json -- true 2>&1) || refused=$?
  [ "$refused" = 80 ] || fail "berth admit --cpu 2 in the 1 cpu container exited $refused, expected 80 (impossible): $out"
  out=$(docker exec "$limited_container" berth admit --memory 64M --cpu 0.5 --max-wait 10s --json -- true 2>&1) || fail "berth admit --memory 64M --cpu 0.5 in the container: $out"
  state=$(docker exec "$limited_container" berth budget state --json 2>&1) || fail "berth budget state in the limited container: $state"
  budget_mib=$(($(json .policy.memoryBytes <<<"$state") / 1048576))
  docker rm -f -v "$limited_container" >/dev/null 2>&1
  limited_container=""
  done_step "$(json .cgroup.version <<<"$machine") $(json .cgroup.path <<<"$machine"): 512 MiB total, $((available / 1048576)) MiB available, quota 1 cpu; budget ${budget_mib} MiB, $(json .policy.cpu <<<"$state") cpu; 1G and 2 cpus refused (exit 80), 64M and 0.5 cpu admitted"
done

# --- 8. restart -------------------------------------------------------------------------------------
step "docker-compose down (keeping the volume), up again"
compose down -t 5 >"$work/down.log" 2>&1 || { cat "$work/down.log" >&2; fail "docker-compose down failed"; }
docker volume inspect "${project}_berth-state" >/dev/null 2>&1 || fail "the state volume did not survive down"
compose up -d --no-build >"$work/up2.log" 2>&1 || { cat "$work/up2.log" >&2; fail "docker-compose up (again) failed"; }
wait_healthy 90
done_step

step "the journal survived (GetSnapshot)"
rpc_ok "$sessions_port" berth.sessions.v1.SessionService/GetSnapshot "{\"sessionId\":\"$session\"}"
[ "$(json .lastSeq <<<"$body")" = 1 ] || fail "GetSnapshot after down/up: $body"
[ "$(json .snapshot.pageUrl <<<"$body")" = http://localhost:3000 ] || fail "GetSnapshot after down/up: $body"
done_step "lastSeq 1, pageUrl http://localhost:3000"

step "the fencing tokens survived (the state volume)"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Acquire "{\"file\":\"$lock_file\",\"owner\":\"container-test\",\"maxWait\":\"10s\",\"ttl\":\"60s\"}"
fencing_after=$(json .lease.fencingToken <<<"$body")
[ -n "$fencing_after" ] && [ "$fencing_after" -gt "$fencing_before" ] || fail "fencing token after down/up is '$fencing_after', not above $fencing_before: $body"
rpc_ok "$sessions_port" berth.locks.v1.LockService/Release "{\"leaseToken\":\"$(json .lease.leaseToken <<<"$body")\"}"
done_step "$fencing_before before, $fencing_after after"

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

# --- 10. beyond one box: the etcd stack ---------------------------------------------------------------
# docker-compose.etcd.yml brought up for real: three etcd members (deploy/etcd.Dockerfile) and two
# sessions instances of the image built above, on the host's loopback at the file's fixed ports.
step "docker build -f deploy/etcd.Dockerfile (Debian's etcd-server)"
for port in 2379 2380 22379 22380 32379 32380 7301 7311; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then fail "127.0.0.1:$port is taken: docker-compose.etcd.yml needs it"; fi
done
etcd_image="berth-etcd-test:$run_id"
docker build -f deploy/etcd.Dockerfile -t "$etcd_image" . >>"$work/etcd-build.log" 2>&1 || { tail -30 "$work/etcd-build.log" >&2; fail "docker build of deploy/etcd.Dockerfile failed"; }
done_step "$(docker image inspect --format '{{.Size}}' "$etcd_image" | awk '{ printf "%.0f MB", $1 / 1e6 }')"

step "docker-compose -f docker-compose.etcd.yml up -d: three etcd members, two sessions instances"
printf 'BERTH_TOKEN=%s\n' "$token" >"$work/berth-etcd.env"
chmod 0600 "$work/berth-etcd.env"
etcd_stack_up=1
BERTH_IMAGE="$image" BERTH_ETCD_IMAGE="$etcd_image" BERTH_ENV_FILE="$work/berth-etcd.env" \
  etcd_compose up -d --no-build >"$work/etcd-up.log" 2>&1 || { cat "$work/etcd-up.log" >&2; fail "docker-compose up of the etcd stack failed"; }
deadline=$(($(date +%s) + 120))
for service in etcd1 etcd2 etcd3 berth-a berth-b; do
  id=$(etcd_compose ps -q "$service")
  [ -n "$id" ] || fail "no $service container"
  until [ "$(docker inspect --format '{{if .State.Health}}{{.State.Health.Status}}{{end}}' "$id")" = healthy ]; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$service not healthy in time: $(docker inspect --format '{{range .State.Health.Log}}{{.Output}}{{end}}' "$id" | tail -3)"
    sleep 0.5
  done
done
done_step "5 containers healthy"

step "the two instances are one service: appended through one, read and locked through the other"
etcd_session="etcd-$run_id"
rpc_ok 7301 berth.sessions.v1.SessionService/AppendEvent "{\"sessionId\":\"$etcd_session\",\"event\":{\"steer\":{\"pageUrl\":\"/pricing\"}}}"
rpc_ok 7311 berth.sessions.v1.SessionService/GetSnapshot "{\"sessionId\":\"$etcd_session\"}"
[ "$(json .lastSeq <<<"$body")" = 1 ] || fail "GetSnapshot through the other instance: $body"
rpc_ok 7301 berth.locks.v1.LockService/Acquire "{\"file\":\"/srv/etcd-test.ts\",\"owner\":\"container-test\",\"maxWait\":\"0s\",\"ttl\":\"60s\"}"
etcd_lease=$(json .lease.leaseToken <<<"$body")
etcd_token=$(json .lease.fencingToken <<<"$body")
rpc 7311 berth.locks.v1.LockService/Acquire "{\"file\":\"/srv/etcd-test.ts\",\"owner\":\"other\",\"maxWait\":\"0s\"}" "$token"
[ "$http_status" = 429 ] || fail "Acquire through the other instance while held answered HTTP $http_status: $body"
grep -q container-test <<<"$body" || fail "the refusal does not name the holder: $body"
rpc_ok 7301 berth.locks.v1.LockService/Release "{\"leaseToken\":\"$etcd_lease\"}"
done_step "seq 1 read through 7311; the lock (token $etcd_token) held through 7301 refused through 7311"

step "a member down: still served (docker-compose stop etcd2)"
etcd_compose stop -t 5 etcd2 >/dev/null 2>&1 || fail "docker-compose stop etcd2 failed"
rpc_ok 7311 berth.sessions.v1.SessionService/AppendEvent "{\"sessionId\":\"$etcd_session\",\"event\":{\"steer\":{\"pageUrl\":\"/docs\"}}}"
rpc_ok 7301 berth.sessions.v1.SessionService/GetSnapshot "{\"sessionId\":\"$etcd_session\"}"
[ "$(json .lastSeq <<<"$body")" = 2 ] || fail "GetSnapshot with etcd2 down: $body"
done_step "seq 2 appended through 7311, read through 7301"

# --- a plain clone on a fresh machine ---------------------------------------------------------------
# A user's clone comes without the seeds, and their machine may lack what CI installs (etcd, the
# Python and Go gRPC packages): the README's `npm install && npm test` must still pass there, with
# the tests that need those skipped, each with its one line.
if [ "${BERTH_CONTAINER_FRESH_CLONE:-0}" = 1 ]; then
  step "both stacks down: the fresh machine gets the engine to itself"
  etcd_compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || fail "down -v of the etcd stack failed"
  etcd_stack_up=0
  compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || fail "down -v failed"
  stack_up=0
  done_step

  step "docker build test/container/fresh-machine.Dockerfile (node:20-bookworm-slim${BERTH_FRESH_NODE:+ with Node $BERTH_FRESH_NODE}, python3, make, g++, git, curl)"
  fresh_image="berth-fresh-machine:$run_id"
  docker build --build-arg NPM_VERSION="$(npm --version)" --build-arg NODE_VERSION="${BERTH_FRESH_NODE:-}" \
    -f test/container/fresh-machine.Dockerfile -t "$fresh_image" test/container \
    >"$work/fresh-build.log" 2>&1 || { tail -30 "$work/fresh-build.log" >&2; fail "docker build of the fresh machine failed"; }
  done_step

  fresh=$work/fresh
  git clone -q "$repo" "$fresh/berth"
  step "npm install && npm test in a plain clone of $(git -C "$fresh/berth" rev-parse --short HEAD), without the seeds, on the fresh machine"
  fresh_container="berth-fresh-$run_id"
  docker run --rm --name "$fresh_container" -v "$fresh:/fresh" -w /fresh/berth "$fresh_image" bash -c \
    'git config --global --add safe.directory "*" && npm install --no-audit --no-fund && npm test -- --reporter=default --reporter=json --outputFile.json=/fresh/report.json' \
    >"$work/fresh-test.log" 2>&1 || {
    { grep -E "NOTE|FAIL|Test Files|Tests " "$work/fresh-test.log" || tail -40 "$work/fresh-test.log"; } | tail -40 >&2
    fail "npm install && npm test failed on the fresh machine"
  }
  fresh_container=""
  counts=$(node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    console.log(`${r.numPassedTests} passed, ${r.numFailedTests} failed, ${r.numPendingTests + r.numTodoTests} skipped`);
    process.exit(r.numTotalTests > 0 && r.numPassedTests > 0 && r.numFailedTests === 0 ? 0 : 1);
  ' "$fresh/report.json") || fail "the fresh machine's run: $counts"
  # Each skip must say so, in its one line: the seeds' comparisons and the four tags.
  notes=$(grep -E "^NOTE: " "$work/fresh-test.log" || true)
  for skipped in "BERTH_SEEDS_DIR is not set" "tests that need etcd" "tests that need python" "tests that need go" "tests that need chromium"; do
    grep -qF "$skipped" <<<"$notes" || fail "the fresh machine's run skipped without its NOTE line ('$skipped'); its NOTE lines: $notes"
  done
  sed 's/^/  /' <<<"$notes"
  if [ -n "${BERTH_FRESH_CLONE_REPORT:-}" ]; then cp "$fresh/report.json" "$BERTH_FRESH_CLONE_REPORT"; fi
  done_step "$counts"
fi
