from tests.cache.conftest import clock  # noqa: F401  (the cache's fake clock: leases expire without sleeping)
