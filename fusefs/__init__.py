"""fusefs: one read-only FUSE filesystem for every content kind.

A `tree.Tree` (no I/O) maps paths to extents of swarm contents; `source`
reads those bytes from the agent's verified store (or through the agent);
`fs` is the pyfuse3 shell; `kernelfs` the shell that speaks the kernel
protocol itself (`protocol`, no I/O) so that whole, verified files are read by
FUSE passthrough from backing files (`backing`); `mount` runs either in a
process of its own; `cli` registers `bootseer fs`; `record` (no I/O) is the access record that image
and snapshot mounts write and prefetch from.
"""
