"""How long a read through a mount waits for its chunk before it fails with EIO: the
default of every mount's --read-timeout. A module of its own so that what only names a
mount's options (`fusefs.image.options`) need not import the reading code
(`fusefs.source`, which imports the agent's client and aiohttp)."""

READ_TIMEOUT_S = 30.0
