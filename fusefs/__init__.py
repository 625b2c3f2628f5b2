"""fusefs: one read-only FUSE filesystem for every content kind.

A `tree.Tree` (no I/O) maps paths to extents of swarm contents; `source`
reads those bytes from the agent's verified store (or through the agent);
`fs` is the pyfuse3 shell; `mount` runs it in a process of its own; `cli`
registers `bootseer fs`; `record` (no I/O) is the access record that image
and snapshot mounts write and prefetch from.
"""
