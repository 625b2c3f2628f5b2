"""depsnap: dependency snapshots: key, capture, publish, restore, mount.

`key` and `snapshot` are the no-I/O core (what a key hashes; the tree
manifest, its checks and how files are packed). `inputs`, `capture`,
`publish`, `restore`, `run` and `mount` are the shells around it; `hot`
holds the hot-frame records a mount writes and prefetches from. It builds
on `p2p` (the agent's local API, the tracker client, contents) and on
`fusefs` for the lazy mount; nothing in `p2p` or `fusefs` imports it.
"""
