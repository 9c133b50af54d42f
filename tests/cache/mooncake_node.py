"""One MLC node on Mooncake Store in a process of its own, as a host runs it: ``python -m
tests.cache.mooncake_node MASTER METADATA``. It lends the store a segment, says ``ready``, then
takes commands on stdin, one a line: ``put URI SIZE`` (answers where the object went) and
``get URI`` (answers its size and whether its bytes are ``payload(size)``, or the error)."""

from __future__ import annotations

import sys

from sdcp_fast.cache import MLC
from sdcp_fast.cache.tiers.host import HostTier
from sdcp_fast.cache.tiers.mooncake import MooncakeConfig, MooncakeTier
from tests.cache.mooncake_writer import payload


def main() -> None:
    master, metadata = sys.argv[1], sys.argv[2]
    # No hostname: the node finds its own address on the route to the master.
    config = MooncakeConfig(master, metadata, segment_bytes=16 << 20, buffer_bytes=8 << 20)
    mlc = MLC([HostTier(64 << 20), MooncakeTier(64 << 20, config)])
    print(f"ready {config.local_address()}", flush=True)
    for line in sys.stdin:
        command, uri, *rest = line.split()
        try:
            if command == "put":
                print(f"stored {mlc.put(uri, payload(int(rest[0]))).tier}", flush=True)
            else:
                data = bytes(mlc.get(uri))
                print(f"got {len(data)} {data == payload(len(data))}", flush=True)
        except Exception as exc:  # the test reads the failure, whatever it is
            print(f"failed {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    main()
