# berth: one image for both services. BERTH_SERVICE (or the first argument) picks which one runs:
# sessions (default), budget, or up (both in one process).
#
#   docker build -t berth:local .
#   docker run --rm --network host --pid host -v berth-state:/var/lib/berth berth:local budget
#
# Written for the classic builder as well as BuildKit: no RUN --mount, no heredocs, no # syntax.

# --- toolchain: what building the flock addon (fs-ext, node-gyp) needs --------------------------
FROM node:20-bookworm-slim AS toolchain
# Marks the build stages (they inherit it; the runtime image does not), so that stale stage images
# left by rebuilds can be found: docker image prune -f --filter label=berth.build-stage
LABEL berth.build-stage=toolchain
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 make g++ \
 && rm -rf /var/lib/apt/lists/*
# node-gyp needs Node's headers. The official image ships them in /usr/local/include/node; an image
# without them (or a machine that cannot reach nodejs.org, where node-gyp downloads them from) gets
# them from the npm registry's node-<platform>-<arch> package of the exact running version.
RUN if [ ! -f /usr/local/include/node/node_version.h ]; then \
      cd /tmp \
      && npm pack --silent "node-$(node -p 'process.platform + "-" + process.arch')@$(node -p process.versions.node)" >/dev/null \
      && tar -xzf node-*.tgz -C /usr/local --strip-components=1 package/include \
      && rm -f node-*.tgz; \
    fi
ENV npm_config_nodedir=/usr/local \
    npm_config_update_notifier=false \
    npm_config_fund=false \
    npm_config_audit=false
WORKDIR /src
# The manifests alone first, so that changing a source file does not re-install the dependencies.
COPY package.json package-lock.json ./
COPY packages/api/package.json packages/api/
COPY packages/wire/package.json packages/wire/
COPY packages/shared/package.json packages/shared/
COPY packages/cli/package.json packages/cli/
COPY packages/client/package.json packages/client/
COPY packages/mcp/package.json packages/mcp/
COPY packages/ui/package.json packages/ui/
COPY packages/etcd/package.json packages/etcd/
COPY services/sessions/package.json services/sessions/
COPY services/budget/package.json services/budget/
COPY test/package.json test/
COPY bench/package.json bench/

# --- build: every dependency, then the TypeScript of the packages the services run ---------------
FROM toolchain AS build
# --ignore-scripts: the root's `prepare` (tsc -b) needs the sources, which come next; the native
# addon is not needed to compile.
RUN npm ci --ignore-scripts
COPY tsconfig.base.json tsconfig.json ./
COPY packages packages
COPY services services
# The cli references api, shared, client, mcp, ui, sessions (and through it etcd) and budget: this builds exactly what the image
# runs (test/ and bench/ are not part of it), then bundles the command and the live page as `npm run build` does.
RUN npx tsc -b packages/cli \
 && node packages/cli/scripts/bundle.mjs \
 && node packages/ui/scripts/build-page.mjs

# --- deps: production dependencies of the services and the cli only -----------------------------
FROM toolchain AS deps
# Only these workspaces: a plain `npm prune --omit=dev` would keep bench's and test's dependencies
# (grpc-js, protobufjs, yargs...). Then the one native addon, built for this image's Node.
RUN npm ci --omit=dev --ignore-scripts -w @berth/cli -w @berth/ui -w @berth/sessions -w @berth/budget \
 && npm rebuild fs-ext \
 && node -e 'require("fs-ext")'

# --- runtime ------------------------------------------------------------------------------------
FROM node:20-bookworm-slim AS runtime
ENV NODE_ENV=production \
    BERTH_SERVICE=sessions \
    BERTH_STATE_DIR=/var/lib/berth \
    BERTH_HOST=127.0.0.1 \
    BERTH_SESSIONS_PORT=7301 \
    BERTH_BUDGET_PORT=7302
WORKDIR /app
COPY --from=deps /src/package.json /src/package-lock.json ./
# node_modules/@berth/* are symlinks into packages/ and services/: the trees below complete them.
COPY --from=deps /src/node_modules node_modules
COPY --from=build /src/packages/api/package.json packages/api/
COPY --from=build /src/packages/api/dist packages/api/dist
COPY --from=build /src/packages/wire/package.json packages/wire/
COPY --from=build /src/packages/wire/dist packages/wire/dist
COPY --from=build /src/packages/shared/package.json packages/shared/
COPY --from=build /src/packages/shared/dist packages/shared/dist
COPY --from=build /src/packages/etcd/package.json packages/etcd/
COPY --from=build /src/packages/etcd/dist packages/etcd/dist
COPY --from=build /src/packages/client/package.json packages/client/
COPY --from=build /src/packages/client/dist packages/client/dist
COPY --from=build /src/packages/ui/package.json packages/ui/
COPY --from=build /src/packages/ui/dist packages/ui/dist
COPY --from=build /src/packages/cli/package.json packages/cli/
COPY --from=build /src/packages/cli/dist packages/cli/dist
COPY --from=build /src/packages/cli/bin packages/cli/bin
COPY --from=build /src/services/sessions/package.json services/sessions/
COPY --from=build /src/services/sessions/dist services/sessions/dist
COPY --from=build /src/services/budget/package.json services/budget/
COPY --from=build /src/services/budget/dist services/budget/dist
COPY deploy/entrypoint.sh deploy/healthcheck.mjs deploy/
# State lives in a volume owned by the unprivileged user: a fresh named volume is initialised from
# this directory, ownership and mode included. `berth` on PATH is the cli (`docker exec ... berth`).
RUN mkdir -p /var/lib/berth \
 && chown node:node /var/lib/berth \
 && chmod 0700 /var/lib/berth \
 && ln -s /app/packages/cli/bin/berth.js /usr/local/bin/berth
VOLUME ["/var/lib/berth"]
USER node
EXPOSE 7301 7302
# Health is asked of the service itself (grpc.health.v1 over Connect JSON), not inferred from the
# process being alive: SERVING only once it holds its state directory and listens.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["node", "/app/deploy/healthcheck.mjs"]
# exec in the entrypoint: node itself receives SIGTERM and shuts down gracefully at once.
ENTRYPOINT ["/bin/sh", "/app/deploy/entrypoint.sh"]
CMD []
