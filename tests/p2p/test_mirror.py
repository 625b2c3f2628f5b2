"""The agent's pull-through registry mirror (p2p.mirror) against a real registry.

Agents started with `mirror` pull for skopeo (an unchanged registry client) from
Debian's docker-registry; the registry's own access log says how often each blob left it.
A containerd we did not write pulls and runs the image too: two daemons (Debian's
`containerd`, each with its own root, state and socket under the test's directory) pull
through their own agent's mirror, named in a `hosts.toml` as operators would.
Faults: the upstream down, a blob whose bytes miss their digest, a client the registry
refuses, a manifest over the limit or of an unknown type.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import re
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from helpers.oci_images import skopeo_copy
from helpers.registry import RunningRegistry, running_registry

from fusefs.testing.containerd import ctr, hosts_dir, running_containerd
from fusefs.testing.sample import Layer, add_file, assemble, busybox_tar, push_sample
from p2p.mirror.upstream import MirrorError, parse_upstream, pick_upstream
from p2p.origin.oci import RegistryClient
from p2p.origin.oci_manifest import MANIFEST_TYPES, Platform
from p2p.origin.oci_origin import layer_name
from p2p.process import free_port
from p2p.testing.localcluster import AgentHandle, LocalCluster
from p2p.tracker_client import TrackerClient, TrackerError

TEST_BOUND_S = 240.0
LAYER_BYTES = (3_000_000, 2_000_000, 1_500_000)  # random, so gzip keeps them this big


def _random_layer(size: int, seed: int) -> Layer:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_file(tar, f"data/{seed}.bin", random.Random(seed).randbytes(size))
    return Layer.of_tar(out.getvalue())


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    with running_registry(tmp_path_factory.mktemp("registry")) as started:
        yield started


@pytest.fixture(scope="module")
def image():  # type: ignore[no-untyped-def]
    layers = [Layer.of_tar(busybox_tar("amd64")),
              *(_random_layer(size, seed) for seed, size in enumerate(LAYER_BYTES))]
    return assemble(Platform("linux", "amd64"), layers, {"Cmd": ["/bin/sh"]})


async def push(registry: RunningRegistry, repository: str, image) -> None:  # type: ignore[no-untyped-def]
    async with RegistryClient() as client:
        await push_sample(client, registry.ref(repository), image)


@contextlib.asynccontextmanager
async def mirrored(tmp_path: Path, count: int, upstream: str
                   ) -> AsyncIterator[tuple[LocalCluster, list[AgentHandle]]]:
    cluster = LocalCluster(tmp_path / "cluster")
    try:
        await cluster.start_tracker()
        agents = [await cluster.start_agent(i, "r0", {"mirror": "127.0.0.1:0",
                                                      "mirror_upstream": upstream})
                  for i in range(count)]
        yield cluster, agents
    finally:
        await cluster.stop()


def mirror_of(agent: AgentHandle) -> str:
    url = agent.child.ready["mirror"]
    assert isinstance(url, str)
    return url.removeprefix("http://")


def log_mark(registry: RunningRegistry) -> int:
    return registry.log_path.stat().st_size


def blob_bytes_sent(registry: RunningRegistry, digest: str, since: int) -> tuple[int, int]:
    """(GETs, bytes) of blob `digest` in the registry's own access log after `since`
    (its size when the test began: the tests share the registry and some blobs)."""
    gets = sent = 0
    with registry.log_path.open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    for line in lines:
        match = re.search(r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64})\S* HTTP/[\d.]+" (\d+) (\d+)',
                          line)
        if match and match[1] == digest and match[2] in ("200", "206"):
            gets += 1
            sent += int(match[3])
    return gets, sent


def test_the_upstream_is_the_one_containerd_names_else_the_default() -> None:
    default = parse_upstream("https://registry.example:5000")
    assert pick_upstream(None, default) == default
    assert pick_upstream("127.0.0.1:5000", default).base == "http://127.0.0.1:5000"
    assert pick_upstream("ghcr.example", default).base == "https://ghcr.example"
    assert pick_upstream("docker.io", None).host == "registry-1.docker.io"
    with pytest.raises(MirrorError) as refused:
        pick_upstream(None, None)
    assert refused.value.status == 400
    with pytest.raises(ValueError):
        parse_upstream("registry.example:5000")


async def test_two_agents_pull_a_four_layer_image_each_blob_leaves_the_registry_once(
        registry: RunningRegistry, image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    await push(registry, "mirror/herd", image)
    mark = log_mark(registry)
    upstream = f"http://{registry.address}"
    async with asyncio.timeout(TEST_BOUND_S), mirrored(tmp_path, 2, upstream) as (cluster, agents):
        outs = [tmp_path / f"out{i}" for i in range(2)]
        # Both at once: the blobs are unindexed, the herd case.
        pulls = [skopeo_copy(f"docker://{mirror_of(agent)}/mirror/herd:latest", f"dir:{out}")
                 for agent, out in zip(agents, outs, strict=True)]
        await asyncio.gather(*pulls)
        for out in outs:
            for layer in image.layers:
                assert (out / layer.digest.removeprefix("sha256:")).read_bytes() == layer.read()
        image_bytes = sum(layer.size for layer in image.layers)
        total = 0
        for layer in image.layers:
            gets, sent = blob_bytes_sent(registry, layer.digest, mark)
            assert gets >= 1, f"blob {layer.digest} never left the registry"
            assert sent <= layer.size * 1.1, (layer.digest, gets, sent, layer.size)
            total += sent
        print(json.dumps({"image_bytes": image_bytes, "registry_blob_bytes": total,
                          "ratio": round(total / image_bytes, 3)}))
        assert total <= image_bytes * 1.1
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            for layer in image.layers:  # published as `image index` would
                await tracker.get_name(layer_name(layer.digest))


async def test_two_containerds_pull_and_run_an_image_through_their_mirrors(
        registry: RunningRegistry, image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    await push(registry, "mirror/ctr", image)
    mark = log_mark(registry)
    reference = f"{registry.address}/mirror/ctr:latest"
    async with asyncio.timeout(TEST_BOUND_S), \
            mirrored(tmp_path, 2, f"http://{registry.address}") as (_, agents), \
            running_containerd(tmp_path / "ctrd0") as sock0, \
            running_containerd(tmp_path / "ctrd1") as sock1:
        pulls = []
        for i, (sock, agent) in enumerate(((sock0, agents[0]), (sock1, agents[1]))):
            hosts = hosts_dir(tmp_path / f"hosts{i}", registry.address, mirror_of(agent))
            pulls.append(ctr(sock, "image", "pull", "--hosts-dir", str(hosts), reference))
        await asyncio.gather(*pulls)
        for i, sock in enumerate((sock0, sock1)):
            out = await ctr(sock, "run", "--rm", reference, f"job{i}", "/bin/sh", "-c",
                            "echo ran-$((6 * 7)); ls /data")
            assert "ran-42" in out and "0.bin" in out, out
        image_bytes = sum(layer.size for layer in image.layers)
        total = sum(blob_bytes_sent(registry, layer.digest, mark)[1] for layer in image.layers)
        for layer in image.layers:
            gets, sent = blob_bytes_sent(registry, layer.digest, mark)
            assert gets == 1 and sent == layer.size, (layer.digest, gets, sent, layer.size)
        assert total == image_bytes


async def test_upstream_down_is_a_502_naming_it_and_ns_picks_another(
        registry: RunningRegistry, image, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    await push(registry, "mirror/ns", image)
    dead = f"http://127.0.0.1:{free_port()}"
    async with asyncio.timeout(TEST_BOUND_S), mirrored(tmp_path, 1, dead) as (_, agents):
        base = f"http://{mirror_of(agents[0])}/v2"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/") as resp:
                assert resp.status == 200
            for path in ("x/manifests/latest", f"x/blobs/sha256:{'a' * 64}"):
                async with http.get(f"{base}/{path}") as resp:
                    assert resp.status == 502
                    assert dead in json.loads(await resp.text())["errors"][0]["message"]
            # containerd names the registry it means in ns=: that one is asked instead.
            async with http.get(f"{base}/mirror/ns/manifests/latest",
                                params={"ns": registry.address},
                                headers={"Accept": ", ".join(MANIFEST_TYPES)}) as resp:
                assert resp.status == 200
                assert await resp.read() == image.manifest


async def test_with_the_upstream_down_a_blob_already_held_is_still_served(
        tmp_path: Path, image) -> None:  # type: ignore[no-untyped-def]
    held, other = image.layers[1], image.layers[2]
    async with asyncio.timeout(TEST_BOUND_S):
        with running_registry(tmp_path / "registry") as registry:
            await push(registry, "mirror/down", image)
            async with mirrored(tmp_path, 1, f"http://{registry.address}") as (_, agents):
                base = f"http://{mirror_of(agents[0])}/v2/mirror/down/blobs"
                async with aiohttp.ClientSession() as http:
                    async with http.get(f"{base}/{held.digest}") as resp:
                        assert resp.status == 200
                    registry.process.terminate()  # type: ignore[union-attr]
                    registry.process.wait(10)  # type: ignore[union-attr]
                    async with http.get(f"{base}/{held.digest}") as resp:
                        assert resp.status == 200
                        assert await resp.read() == held.read()
                    async with http.get(f"{base}/{other.digest}") as resp:
                        assert resp.status == 502
                        assert registry.address in await resp.text()


async def test_a_blob_that_misses_its_digest_is_never_served_nor_published(
        registry: RunningRegistry, tmp_path: Path) -> None:
    layer = _random_layer(600_000, seed=99)
    image = assemble(Platform("linux", "amd64"), [layer], {})
    await push(registry, "mirror/bad", image)
    stored = registry.blob_path(layer.digest)
    data = bytearray(stored.read_bytes())
    data[1000] ^= 0xFF  # same size, other bytes
    stored.write_bytes(bytes(data))
    upstream = f"http://{registry.address}"
    async with asyncio.timeout(TEST_BOUND_S), mirrored(tmp_path, 1, upstream) as (cluster, agents):
        url = f"http://{mirror_of(agents[0])}/v2/mirror/bad/blobs/{layer.digest}"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            body = await resp.read()
            assert resp.status == 502, body[:200]
            assert b"does not match its digest" in body
        async with TrackerClient(cluster.tracker_url, cluster.secret) as tracker:
            with pytest.raises(TrackerError) as refused:
                await tracker.get_name(layer_name(layer.digest))
            assert refused.value.status == 404


async def test_a_client_the_registry_refuses_gets_its_401_and_no_cached_blob(
        tmp_path: Path, image) -> None:  # type: ignore[no-untyped-def]
    with running_registry(tmp_path / "registry", "htpasswd") as registry:
        async with RegistryClient(credentials=lambda _: registry.credentials()) as client:
            await push_sample(client, registry.ref("private/app"), image)
        upstream = f"http://{registry.address}"
        async with asyncio.timeout(TEST_BOUND_S), \
                mirrored(tmp_path, 1, upstream) as (_, agents):
            base = f"http://{mirror_of(agents[0])}/v2/private/app"
            digest = image.layers[1].digest
            creds = registry.credentials()
            assert creds is not None
            good = {"Authorization": creds.basic_header()}
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/blobs/{digest}", headers=good) as resp:
                    assert resp.status == 200
                    assert await resp.read() == image.layers[1].read()
                async with http.get(f"{base}/blobs/{digest}",
                                    headers={"Range": "bytes=10-19", **good}) as resp:
                    assert resp.status == 206
                    assert await resp.read() == image.layers[1].read()[10:20]
                for path in (f"blobs/{digest}", "manifests/latest"):
                    async with http.get(f"{base}/{path}") as resp:  # no credentials
                        assert resp.status == 401
                        assert "WWW-Authenticate" in resp.headers
                        assert len(await resp.read()) < 1000


async def test_a_manifest_over_the_limit_or_of_an_unknown_type_is_refused_whole(
        tmp_path: Path) -> None:
    # Distribution refuses to store either (a manifest over 4 MiB, the mirror's limit too),
    # so the upstream here is a plain HTTP origin (`bootseer origin`) serving them at the
    # paths a registry would.
    served = tmp_path / "upstream"
    for name, media_type, pad in (("big", "application/vnd.oci.image.index.v1+json", 5 << 20),
                                  ("odd", "application/vnd.example.unknown+json", 10)):
        path = served / "v2" / "mirror" / name / "manifests"
        path.mkdir(parents=True)
        (path / "latest").write_bytes(json.dumps({
            "schemaVersion": 2, "mediaType": media_type, "manifests": [],
            "annotations": {"pad": "x" * pad}}).encode())
    cluster = LocalCluster(tmp_path / "origin")
    try:
        await cluster.start_origin(served)
        async with asyncio.timeout(TEST_BOUND_S), \
                mirrored(tmp_path, 1, cluster.origin_url) as (_, agents):
            base = f"http://{mirror_of(agents[0])}/v2/mirror"
            async with aiohttp.ClientSession() as http:
                for name, says in (("big", b"over the 4194304-byte limit"),
                                   ("odd", b"unsupported manifest media type")):
                    async with http.get(f"{base}/{name}/manifests/latest") as resp:
                        body = await resp.read()
                        assert resp.status == 502, body[:300]
                        assert says in body and len(body) < 2000, body[:300]
    finally:
        await cluster.stop()
