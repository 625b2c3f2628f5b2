"""A pull-through registry mirror in the agent: `bootseer agent --mirror HOST:PORT`.

Container runtimes (containerd's `hosts.toml`, Docker's `registry-mirrors`, skopeo,
crane) pull unchanged images from the node's agent as if it were the registry. The read
side of the OCI distribution API is served:

- `/v2/`: 200, so clients accept the endpoint.
- manifests, by tag or digest: passed through to the upstream with the client's own
  `Authorization` and `Accept`, never cached (a tag moves; a private manifest must not
  be readable by another tenant from a cache). Size-capped and type-checked.
- blobs, by digest, with Range: the client's right to the blob is asked of the upstream
  first (a HEAD with its credentials; a 401/403/404 passes through), then the bytes come
  through the swarm as the layer content `image index` publishes (`layer/v1/<digest>`).
  A blob nobody published is fetched whole by one node of the cluster, checked against
  its sha256, seeded from that node's store and published; the nodes asking meanwhile
  wait for that publication instead of all going to the registry (`p2p.mirror.blobs`).

The upstream is the registry containerd names in its `ns=` query parameter, else the
agent's `mirror_upstream`. The pieces: `routes` (the HTTP side), `upstream` (passing
requests through), `blobs` (one fetch per blob across the cluster).
"""

from p2p.mirror.routes import serve_mirror

__all__ = ["serve_mirror"]
