"""MLC storage tiers, fastest first: device, host (page-locked), disk, networked (Mooncake Store or Redis)."""
