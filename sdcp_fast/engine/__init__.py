"""In-process engines: run SDCP sessions through the protocol core with a scorer and
drafters (no HTTP). Services reuse the same pieces behind aiohttp."""
