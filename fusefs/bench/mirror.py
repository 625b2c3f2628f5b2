"""`bootseer bench mirror`: containerd pulling through the agents' registry mirror against
containerd pulling straight from the registry, in one run.

A real `docker-registry` on 127.0.0.1 holds a 4-layer image (busybox and three layers of
incompressible bytes, `--layer-mb` each) behind a `CappedProxy` (`--registry-cap`, MB/s).
Three containerd daemons of their own (fusefs.testing.containerd), every one cold:

- `direct_seconds`: `ctr image pull` straight from the capped registry (the baseline);
- `mirror_cold_seconds`: the same through agent A's mirror, nothing published yet (A
  fetches every blob from the registry, checks it and publishes it);
- `mirror_warm_seconds`: the same through agent B's mirror, the swarm warm (B's blobs
  come from A).

Each pull unpacks the image too (ctr's default), in every arm; `--fetch-only` times the
transfer alone (`ctr content fetch`). The JSON line also gives
the registry's egress for each arm and `warm_speedup` = direct / warm.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import tarfile
import time
from pathlib import Path
from typing import Any

from p2p.bench import workdir
from p2p.units import MiB


def add_parser(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = kinds.add_parser("mirror", help="containerd pulls through the agents' mirror vs "
                                        "straight from a capped registry")
    p.add_argument("--registry-cap", type=float, default=40.0, help="MB/s out of the registry")
    p.add_argument("--layer-mb", type=int, default=32, help="size of each random layer")
    p.add_argument("--fetch-only", action="store_true",
                   help="`ctr content fetch` (the transfer alone) instead of `ctr image pull` "
                        "(transfer and unpack)")
    p.add_argument("--workdir", type=Path, help="keep logs and stores here")
    p.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    import uvloop

    from p2p.errors import UserError
    from p2p.process import ToolMissing

    try:
        result = uvloop.run(_bench(args))
    except ToolMissing as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(result))
    return 0


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    with workdir(args.workdir, "mirror") as work:
        return await _bench_in(args, work)


def _image(layer_bytes: int) -> Any:
    from fusefs.testing.sample import Layer, add_file, assemble, busybox_tar
    from p2p.origin.oci_manifest import Platform

    layers = [Layer.of_tar(busybox_tar("amd64"))]
    for seed in range(3):
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            add_file(tar, f"data/{seed}.bin", random.Random(seed).randbytes(layer_bytes))
        layers.append(Layer.of_tar(out.getvalue()))
    return assemble(Platform("linux", "amd64"), layers, {"Cmd": ["/bin/sh"]})


async def _bench_in(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from fusefs.testing.containerd import ctr, hosts_dir, running_containerd
    from fusefs.testing.registry import CappedProxy, local_registry
    from fusefs.testing.sample import push_sample
    from p2p.origin.oci import RegistryClient
    from p2p.origin.oci_ref import ImageRef
    from p2p.testing.localcluster import LocalCluster

    image = _image(args.layer_mb * MiB)
    result: dict[str, Any] = {"bench": "mirror", "registry_cap_mbps": args.registry_cap,
                              "image_bytes": sum(layer.size for layer in image.layers),
                              "layers": len(image.layers),
                              "command": "content fetch" if args.fetch_only else "image pull"}
    with local_registry(work / "registry") as registry:
        async with RegistryClient() as client:
            await push_sample(client, ImageRef(registry.address, "bench/mirror", "1"), image)
        async with CappedProxy(registry.address, args.registry_cap) as proxy:
            reference = f"{proxy.address}/bench/mirror:1"
            cluster = LocalCluster(work / "cluster")
            try:
                await cluster.start_tracker()
                agents = [await cluster.start_agent(i, "rack0", {
                    "mirror": "127.0.0.1:0", "mirror_upstream": f"http://{proxy.address}"})
                    for i in range(2)]
                arms = (("direct", None), ("mirror_cold", agents[0]), ("mirror_warm", agents[1]))
                for name, agent in arms:
                    flags = ["--plain-http"]
                    if agent is not None:
                        mirror = str(agent.child.ready["mirror"]).removeprefix("http://")
                        flags = ["--hosts-dir", str(hosts_dir(work / f"hosts-{name}",
                                                              proxy.address, mirror))]
                    async with running_containerd(work / f"containerd-{name}") as sock:
                        sent, started = proxy.sent_bytes, time.monotonic()
                        await ctr(sock, *result["command"].split(), *flags, reference)
                        result[f"{name}_seconds"] = round(time.monotonic() - started, 3)
                        result[f"{name}_registry_bytes"] = proxy.sent_bytes - sent
            finally:
                await cluster.stop()
    result["warm_speedup"] = round(result["direct_seconds"] / result["mirror_warm_seconds"], 2)
    result["cold_vs_direct"] = round(result["mirror_cold_seconds"] / result["direct_seconds"],
                                     2)
    return result
