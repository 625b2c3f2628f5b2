"""fusefs.image: container images served lazily by the shared FUSE filesystem.

A layer blob (gzip tar, unchanged, as the registry holds it) is a swarm
content; a per-layer index (tar table of contents plus zran access points)
lets the filesystem read any file of the layer by decoding only the span that
holds it. Modules: `toc` (the tar table of contents, no I/O), `layerindex`
(the index as a value and its file form, no I/O), `gzindex` (build the index
from a blob, read the tar through it), `catalog` (index an image once; find
its layers, indexes and hot-block records), `record` (hot-block records, no
I/O), `source` (the filesystem's reads of image files), `mount` (serving an
image), `options` (what a mount is asked for), `run` (`image run`: its mount
served by the node's mount server, `served`, or by a forked child, `forked`)
and `cli` (`bootseer image ...`), `runtime` (run a command in a mounted rootfs under
runc or bubblewrap; with `process`, `mounts`, `runc_spec`), `baseline` (the
skopeo + umoci full pull the lazy path is measured against), `sample` and
`debian` (sample images for tests and benchmarks), `testbed` (a registry on
loopback, capped), `bench` and `tool` (running external tools).
"""
