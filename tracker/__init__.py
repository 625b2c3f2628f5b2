"""tracker: the control plane (aiohttp), with a no-I/O registry and handout policy."""
