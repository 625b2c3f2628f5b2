"""fusefs.image: container images served lazily by the shared FUSE filesystem.

A layer blob (gzip tar, unchanged, as the registry holds it) is a swarm
content; a per-layer index (tar table of contents plus zran access points)
lets the filesystem read any file of the layer by decoding only the span that
holds it. Modules: `gzindex` (build and read the index), `runtime` (run a
command in a mounted rootfs under runc or bubblewrap; with `process`,
`mounts`, `runc_spec`), `baseline` (the skopeo + umoci full pull the lazy
path is measured against), `sample` and `debian` (sample images for tests
and benchmarks), `tool` (running external tools), and the glue that
resolves an image, mounts it, records the blocks a launch touches and
prefetches them the next time.
"""
