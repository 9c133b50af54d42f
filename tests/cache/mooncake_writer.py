"""A writer MLC in a process of its own (``python -m tests.cache.mooncake_writer MASTER METADATA
URI SIZE``): it puts SIZE bytes under URI, says where they went, and waits to be killed."""

from __future__ import annotations

import sys
import time

from sdcp_fast.cache import MLC
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.tiers.mooncake import MooncakeConfig, MooncakeTier


def payload(size: int) -> bytes:
    return bytes(i % 251 for i in range(size))


def main() -> None:
    master, metadata, uri, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    config = MooncakeConfig(master, metadata, segment_bytes=16 << 20, buffer_bytes=8 << 20, hostname="127.0.0.1")
    mlc = MLC([HostTier(64 << 20), MooncakeTier(64 << 20, config)])
    stored = mlc.put(uri, payload(size))
    print(f"stored {stored.tier}", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
