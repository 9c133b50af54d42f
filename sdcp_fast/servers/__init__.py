"""aiohttp applications of the SDCP roles and of the MLC (the only places, with the CLI, that do network I/O)."""
