"""fusefs.image: container images served lazily by the shared FUSE filesystem.

A layer blob (gzip tar, unchanged, as the registry holds it) is a swarm
content; a per-layer index (tar table of contents plus zran access points)
lets the filesystem read any file of the layer by decoding only the span that
holds it. Modules: `toc` (the tar table of contents, no I/O), `layerindex`
(the index as a value and its file form, no I/O), `gzindex` (build the index
from a blob, read the tar through it), `runtime` (run a command in a mounted
rootfs under runc or bubblewrap), and the glue that resolves an image, mounts
it, records the blocks a launch touches and prefetches them the next time.
"""
