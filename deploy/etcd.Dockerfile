# Debian's etcd (etcd-server, and etcd-client for the healthcheck's etcdctl), for the members of
# docker-compose.etcd.yml: the same etcd 3.4 the tests start and berth's client is generated from.
#
#   docker build -f deploy/etcd.Dockerfile -t berth-etcd:local .
#
# Built like the berth image (../Dockerfile): on node:20-bookworm-slim, which is only a Debian
# bookworm root here, so the image builds wherever berth's does, a machine without registry access
# included (its stand-in base image, docs/containers.md); apt fetches from the Debian mirror. The
# classic builder as well as BuildKit: no RUN --mount, no heredocs, no # syntax line.
FROM node:20-bookworm-slim
# No service starts during the install (there is no init here; the package's postinst would try).
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
 && chmod 0755 /usr/sbin/policy-rc.d \
 && apt-get update \
 && apt-get install -y --no-install-recommends etcd-server etcd-client \
 && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
 && mkdir -p /var/lib/etcd/member \
 && chown etcd:etcd /var/lib/etcd/member \
 && chmod 0700 /var/lib/etcd/member \
 && etcd --version
# A fresh named volume is initialised from this directory, ownership and mode included.
VOLUME ["/var/lib/etcd/member"]
# The package's own system user: etcd needs no privilege.
USER etcd
ENV ETCDCTL_API=3
ENTRYPOINT ["/usr/bin/etcd"]
