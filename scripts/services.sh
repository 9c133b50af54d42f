#!/usr/bin/env bash
# Install the external servers the test suite starts (etcd, a networked KV store) when
# they are missing and we are allowed to (root with apt-get). Tests that need a server
# that is still missing skip and say why.
set -uo pipefail
PACKAGES=()
need() { command -v "$1" >/dev/null 2>&1 || PACKAGES+=("$2"); }
# The MLC's etcd commit log and its networked tiers (Redis; Mooncake Store, whose master and TCP
# transfer engine load libibverbs even without RDMA hardware).
need etcd etcd-server
need redis-server redis-server
ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 ' || PACKAGES+=(libibverbs1)
# Simulated hosts (sdcp-fast cluster): network namespaces, veth pairs and a bridge.
need ip iproute2
if [ ${#PACKAGES[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "services: installing ${PACKAGES[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}") >/tmp/sdcp-services-install.log 2>&1 \
      || echo "services: install failed (see /tmp/sdcp-services-install.log); dependent tests will skip"
  else
    echo "services: missing ${PACKAGES[*]} and not root; dependent tests will skip"
  fi
fi
exit 0
