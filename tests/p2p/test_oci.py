"""The registry client against a real docker-registry, in each auth mode, and a hostile one.

The real registry (tests/helpers/registry.py) receives busybox images (tests/helpers/oci_images.py)
pushed by skopeo and by our own client; what each side pushed, the other reads
back. The hostile registry at the end is a few aiohttp handlers serving what a
real registry never would (oversized or unknown manifests, bytes that miss
their digest, endless 429/5xx), to check that the client refuses or gives up
with a clear message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web
from helpers.oci_images import (
    BuiltImage,
    busybox_image,
    push_index,
    push_sample,
    skopeo_copy,
    write_oci_layout,
)
from helpers.registry import MODES, PASSWORD, READER, USER, RunningRegistry, running_registry

from fusefs.testing import registry as testbed
from p2p.origin import OriginError, OriginPool
from p2p.origin.oci import RegistryClient, RegistryError, sha256_digest
from p2p.origin.oci_auth import Credentials
from p2p.origin.oci_http import RetryPolicy
from p2p.origin.oci_manifest import DOCKER_LIST, DOCKER_MANIFEST, OCI_MANIFEST, Platform
from p2p.origin.oci_origin import blob_url
from p2p.origin.oci_ref import ImageRef
from p2p.peer import listen_socket

AUTH_MODES = ("htpasswd", "token")
FAST_RETRY = RetryPolicy(attempts=3, first_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture(scope="module")
def registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningRegistry]]:
    """One real registry per auth mode for this module, all stopped at its end."""
    with contextlib.ExitStack() as stack:
        yield {mode: stack.enter_context(running_registry(tmp_path_factory.mktemp(mode), mode))
               for mode in MODES}


@pytest.fixture(scope="module")
def images() -> dict[str, BuiltImage]:
    return {arch: busybox_image(arch) for arch in ("amd64", "arm64")}


def client_for(registry: RunningRegistry, creds: Credentials | None = None,
               **kwargs: object) -> RegistryClient:
    given = creds or registry.credentials()
    return RegistryClient(credentials=lambda _: given, **kwargs)  # type: ignore[arg-type]


def skopeo_creds(registry: RunningRegistry) -> str | None:
    return None if registry.mode == "none" else f"{USER}:{PASSWORD}"


# -- the real registry ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_skopeo_pushed_image_pulls_by_tag_and_by_digest(
        mode: str, registries: dict[str, RunningRegistry], images: dict[str, BuiltImage],
        tmp_path: Path) -> None:
    registry, image = registries[mode], images["amd64"]
    write_oci_layout(tmp_path / "layout", "v1", [image])
    await skopeo_copy(f"oci:{tmp_path}/layout:v1", f"docker://{registry.address}/sk/busybox:v1",
                      creds=skopeo_creds(registry))
    async with client_for(registry) as client:
        by_tag = await client.get_manifest(registry.ref("sk/busybox", "v1"))
        assert by_tag.digest == image.digest and by_tag.body == image.manifest
        assert by_tag.ref == registry.ref("sk/busybox", "v1").with_digest(image.digest)
        assert [layer.digest for layer in by_tag.manifest.layers] == [image.layers[0].digest]
        by_digest = await client.get_manifest(ImageRef(registry.address, "sk/busybox",
                                                       digest=image.digest))
        assert by_digest.body == image.manifest and by_digest.index_digest is None
        config = by_tag.manifest.config
        assert await client.get_blob(by_tag.ref, config.digest) == image.config
        assert "v1" in await client.list_tags(by_tag.ref)


@pytest.mark.parametrize("mode", MODES)
async def test_own_push_is_read_back_by_skopeo(
        mode: str, registries: dict[str, RunningRegistry], images: dict[str, BuiltImage],
        tmp_path: Path) -> None:
    registry, image = registries[mode], images["amd64"]
    async with client_for(registry) as client:
        digest = await push_sample(client, registry.ref("own/busybox", "v1"), image)
        assert digest == image.digest
        assert await push_sample(client, registry.ref("own/busybox", "v1"), image) == digest
    await skopeo_copy(f"docker://{registry.address}/own/busybox:v1", f"oci:{tmp_path}/out:v1",
                      creds=skopeo_creds(registry))
    blobs = tmp_path / "out" / "blobs" / "sha256"
    for blob in (image.layers[0].read(), image.config, image.manifest):
        assert (blobs / sha256_digest(blob).removeprefix("sha256:")).read_bytes() == blob


@pytest.mark.parametrize("mode", MODES)
async def test_an_index_resolves_to_the_configured_platform(
        mode: str, registries: dict[str, RunningRegistry], images: dict[str, BuiltImage],
        tmp_path: Path) -> None:
    registry = registries[mode]
    both = [images["amd64"], images["arm64"]]
    write_oci_layout(tmp_path / "layout", "multi", both)
    await skopeo_copy(f"oci:{tmp_path}/layout:multi",
                      f"docker://{registry.address}/multi/skopeo:v1",
                      creds=skopeo_creds(registry), all_platforms=True)
    async with client_for(registry) as client:
        index_digest = await push_index(client, registry.ref("multi/own", "v1"), both)
        for repository in ("multi/skopeo", "multi/own"):
            ref = registry.ref(repository, "v1")
            default = await client.get_manifest(ref)
            assert default.digest == images["amd64"].digest
            assert default.index_digest == index_digest
            arm = await client.get_manifest(ref, Platform("linux", "arm64"))
            assert arm.digest == images["arm64"].digest
            layer = await client.get_blob(ref, arm.manifest.layers[0].digest)
            assert layer == images["arm64"].layers[0].read()
            with pytest.raises(RegistryError, match=rf"image {ref} on registry "
                               rf"{registry.address}: no manifest for platform linux/s390x "
                               r"\(available: linux/amd64, linux/arm64\)"):
                await client.get_manifest(ref, Platform("linux", "s390x"))
    async with client_for(registry, platform=Platform("linux", "arm64")) as client:
        arm_by_default = await client.get_manifest(registry.ref("multi/own", "v1"))
        assert arm_by_default.digest == images["arm64"].digest


async def test_docker_schema2_manifests_and_lists_are_read(
        registries: dict[str, RunningRegistry], images: dict[str, BuiltImage],
        tmp_path: Path) -> None:
    registry = registries["token"]
    write_oci_layout(tmp_path / "one", "v1", [images["amd64"]])
    write_oci_layout(tmp_path / "multi", "v1", [images["amd64"], images["arm64"]])
    await skopeo_copy(f"oci:{tmp_path}/one:v1", f"docker://{registry.address}/docker/one:v1",
                      creds=skopeo_creds(registry), docker_format=True)
    await skopeo_copy(f"oci:{tmp_path}/multi:v1", f"docker://{registry.address}/docker/multi:v1",
                      creds=skopeo_creds(registry), docker_format=True, all_platforms=True)
    async with client_for(registry) as client:
        one = await client.get_manifest(registry.ref("docker/one", "v1"))
        assert one.media_type == DOCKER_MANIFEST
        layer = one.manifest.layers[0]
        assert layer.media_type == "application/vnd.docker.image.rootfs.diff.tar.gzip"
        assert await client.get_blob(one.ref, layer.digest) == images["amd64"].layers[0].read()
        top = await client.get_manifest_raw(registry.ref("docker/multi", "v1"))
        assert top.media_type == DOCKER_LIST
        arm = await client.get_manifest(registry.ref("docker/multi", "v1"),
                                        Platform("linux", "arm64"))
        assert arm.media_type == DOCKER_MANIFEST and arm.index_digest == top.digest
        arm_layer = arm.manifest.layers[0].digest
        assert await client.get_blob(arm.ref, arm_layer) == images["arm64"].layers[0].read()


@pytest.mark.parametrize("mode", MODES)
async def test_blob_range_reads_and_streams_match_the_pushed_bytes(
        mode: str, registries: dict[str, RunningRegistry], images: dict[str, BuiltImage]) -> None:
    registry, image = registries[mode], images["amd64"]
    ref, layer = registry.ref("ranges/busybox"), image.layers[0].read()
    async with client_for(registry) as client:
        await push_sample(client, ref, image)
        assert await client.blob_size(ref, image.layers[0].digest) == len(layer)
        for offset, size in ((0, 100), (len(layer) // 2, 65_536), (len(layer) - 10, 10)):
            view = memoryview(bytearray(size))
            await client.read_blob_range(ref, image.layers[0].digest, offset, view)
            assert bytes(view) == layer[offset:offset + size]
        streamed = b"".join([b async for b in client.stream_blob(ref, image.layers[0].digest)])
        assert streamed == layer


@pytest.mark.parametrize("mode", MODES)
async def test_the_origin_adapter_reads_a_chunk_of_a_layer_blob(
        mode: str, registries: dict[str, RunningRegistry], images: dict[str, BuiltImage],
        monkeypatch: pytest.MonkeyPatch) -> None:
    registry, image = registries[mode], images["amd64"]
    ref = registry.ref("origin/busybox")
    async with client_for(registry) as client:
        await push_sample(client, ref, image)
    if mode != "none":
        monkeypatch.setenv("BOOTSEER_REGISTRY_AUTH", f"{USER}:{PASSWORD}")
    url = blob_url(ref, image.layers[0].digest)
    pool = OriginPool(concurrency=8)
    try:
        parts = [memoryview(bytearray(64 * 1024)) for _ in range(8)]
        await asyncio.gather(*(pool.for_url(url).read_into(url, n * 100_000, part)
                               for n, part in enumerate(parts)))
        for n, part in enumerate(parts):
            assert bytes(part) == image.layers[0].read()[n * 100_000:n * 100_000 + len(part)]
        chunk = memoryview(bytearray(256 * 1024))
        await pool.for_url(url).read_into(url, 300_000, chunk)
        assert bytes(chunk) == image.layers[0].read()[300_000:300_000 + len(chunk)]
        with pytest.raises(OriginError, match="bad registry blob URL"):
            await pool.for_url(url).read_into(f"oci://{registry.address}/origin/busybox:latest",
                                              0, chunk)
    finally:
        await pool.close()
    if registry.issuer is not None:  # concurrent first reads share one token
        pull = ("repository:origin/busybox:pull",)
        assert [s for _, s in registry.issuer.requests if s == pull] == [pull]


@pytest.mark.parametrize("mode", AUTH_MODES)
async def test_a_wrong_password_is_a_401_naming_image_and_registry(
        mode: str, registries: dict[str, RunningRegistry]) -> None:
    registry = registries[mode]
    ref = registry.ref("private/app", "v1")
    async with client_for(registry, Credentials(USER, "wrong")) as client:
        with pytest.raises(RegistryError) as caught:
            await client.get_manifest(ref)
    assert caught.value.status == 401
    message = str(caught.value)
    assert f"registry {registry.address} refused the credentials of user '{USER}'" in message
    assert f"image {ref}" in message and "check the user name and password" in message


@pytest.mark.parametrize("mode", AUTH_MODES)
async def test_missing_credentials_say_how_to_give_them(
        mode: str, registries: dict[str, RunningRegistry]) -> None:
    registry = registries[mode]
    ref = registry.ref("private/app", "v1")
    async with RegistryClient(credentials=lambda _: None) as client:
        with pytest.raises(RegistryError, match=rf"registry {registry.address} requires "
                           rf"credentials for image {ref} .*BOOTSEER_REGISTRY_AUTH=user:password"):
            await client.get_manifest(ref)


async def test_a_pull_only_user_is_denied_a_push_in_plain_words(
        registries: dict[str, RunningRegistry], images: dict[str, BuiltImage]) -> None:
    registry = registries["token"]
    async with client_for(registry, Credentials(READER, PASSWORD)) as client:
        with pytest.raises(RegistryError, match=rf"registry {registry.address} denied access "
                           r"to .* not allowed to push it"):
            await push_sample(client, registry.ref("readonly/app"), images["amd64"])


async def test_tokens_are_asked_once_per_scope(registries: dict[str, RunningRegistry],
                                               images: dict[str, BuiltImage]) -> None:
    registry, image = registries["token"], images["amd64"]
    assert registry.issuer is not None
    ref = registry.ref("scopes/busybox")
    async with client_for(registry) as client:
        await push_sample(client, ref, image)
        for _ in range(2):
            pulled = await client.get_manifest(ref)
            await client.get_blob(ref, pulled.manifest.config.digest)
    asked = [scopes for user, scopes in registry.issuer.requests
             if any("scopes/busybox" in s for s in scopes)]
    assert asked == [("repository:scopes/busybox:pull,push",),
                     ("repository:scopes/busybox:pull",)]


async def test_a_refused_token_is_replaced_once(registries: dict[str, RunningRegistry],
                                                images: dict[str, BuiltImage]) -> None:
    registry, image = registries["token"], images["amd64"]
    assert registry.issuer is not None
    ref = registry.ref("revoked/busybox")
    pull = (f"repository:{ref.repository}:pull",)
    async with client_for(registry) as client:
        await push_sample(client, ref, image)
        await client.get_manifest(ref)
        # The registry will refuse this cached token (the issuer never signed it), as it
        # would an expired or revoked one: the client must fetch a new one and go on.
        now = asyncio.get_running_loop().time()
        client._http._tokens.put(registry.address, pull[0], "not.a.token", 300, now)
        assert (await client.get_manifest(ref)).digest == image.digest
    assert [s for _, s in registry.issuer.requests if s == pull] == [pull, pull]


@pytest.mark.parametrize("mode", MODES)
async def test_missing_tag_and_blob_are_404s_naming_them(
        mode: str, registries: dict[str, RunningRegistry], images: dict[str, BuiltImage]) -> None:
    registry = registries[mode]
    ref = registry.ref("missing/busybox", "v1")
    async with client_for(registry) as client:
        await push_sample(client, ref, images["amd64"])
        with pytest.raises(RegistryError, match=rf"image {ref.with_tag('nope')} not found on "
                           rf"registry {registry.address} \(HTTP 404: MANIFEST_UNKNOWN"):
            await client.get_manifest(ref.with_tag("nope"))
        absent = sha256_digest(b"never pushed")
        with pytest.raises(RegistryError, match=rf"blob {absent} of {registry.address}/missing/"
                           r"busybox not found"):
            await client.get_blob(ref, absent)
        assert not await client.has_blob(ref, absent)


async def test_a_manifest_over_the_size_cap_is_refused(
        registries: dict[str, RunningRegistry], images: dict[str, BuiltImage]) -> None:
    registry, image = registries["none"], images["amd64"]
    ref = registry.ref("capped/busybox")
    async with client_for(registry) as client:
        await push_sample(client, ref, image)
    cap = len(image.manifest) - 1
    async with client_for(registry, max_manifest_bytes=cap) as client:
        with pytest.raises(RegistryError, match=rf"manifest of image {ref} is "
                           rf"{len(image.manifest)} bytes, over the {cap}-byte limit"):
            await client.get_manifest(ref)


async def test_a_blob_corrupted_in_the_registry_storage_is_detected(
        registries: dict[str, RunningRegistry], images: dict[str, BuiltImage]) -> None:
    registry, image = registries["none"], images["amd64"]
    ref = registry.ref("corrupt/busybox")
    async with client_for(registry) as client:
        await push_sample(client, ref, image)
        stored = registry.blob_path(image.layers[0].digest)
        data = bytearray(stored.read_bytes())
        data[1000] ^= 0xFF  # same size, one bit pattern changed: a lying disk
        stored.write_bytes(data)
        with pytest.raises(RegistryError, match=rf"blob {image.layers[0].digest} of "
                           rf"{registry.address}/corrupt/busybox from registry .* does not "
                           "match its digest"):
            await client.get_blob(ref, image.layers[0].digest)


def test_the_fixture_fails_naming_the_package_when_the_registry_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testbed, "REGISTRY_BIN", str(tmp_path / "no-such-binary"))
    with pytest.raises(AssertionError, match="docker-registry is not installed: apt-get install "
                       "docker-registry"), running_registry(tmp_path, "none"):
        pass


async def test_an_unreachable_registry_is_named() -> None:
    sock = listen_socket("127.0.0.1", 0)
    address = f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    async with RegistryClient(credentials=lambda _: None, retry=FAST_RETRY) as client:
        with pytest.raises(RegistryError, match=rf"registry {address} unreachable for image "
                           rf"{address}/app:v1: .* \(through 3 attempts\)"):
            await client.get_manifest(ImageRef(address, "app", "v1"))


# -- a hostile registry ----------------------------------------------------------------------


class Hostile:
    """Serves one manifest body and one blob body as told, and counts requests."""

    def __init__(self) -> None:
        self.manifest = b""
        self.content_type = OCI_MANIFEST
        self.digest_header: str | None = None
        self.chunked = False
        self.blob = b""
        self.range_start_shift: int | None = None  # None: ignore Range and send it all
        self.statuses: list[int] = []  # answered first, one per request, before the bodies
        self.retry_after: str | None = None
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/{name:.+}/manifests/{reference}", self._manifest)
        app.router.add_get("/v2/{name:.+}/blobs/{digest}", self._blob)
        return app

    def _status(self) -> web.Response | None:
        self.requests += 1
        if not self.statuses:
            return None
        headers = {"Retry-After": self.retry_after} if self.retry_after else {}
        body = json.dumps({"errors": [{"code": "TOOMANY", "message": "slow down"}]})
        return web.Response(status=self.statuses.pop(0), text=body, headers=headers)

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        if (early := self._status()) is not None:
            return early
        headers = {"Content-Type": self.content_type}
        if self.digest_header:
            headers["Docker-Content-Digest"] = self.digest_header
        if not self.chunked:
            return web.Response(body=self.manifest, headers=headers)
        response = web.StreamResponse(headers=headers)
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(self.manifest), 1 << 20):
            await response.write(self.manifest[start:start + (1 << 20)])
        await response.write_eof()
        return response

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        if (early := self._status()) is not None:
            return early
        if request.http_range.start is None or self.range_start_shift is None:
            return web.Response(body=self.blob)
        start = request.http_range.start + self.range_start_shift
        end = start + request.http_range.stop - request.http_range.start
        return web.Response(status=206, body=self.blob[start:end], headers={
            "Content-Range": f"bytes {start}-{end - 1}/{len(self.blob)}"})


@pytest.fixture
async def hostile() -> AsyncIterator[tuple[Hostile, ImageRef]]:
    server = Hostile()
    runner = web.AppRunner(server.app())
    await runner.setup()
    sock = listen_socket("127.0.0.1", 0)
    await web.SockSite(runner, sock).start()
    try:
        yield server, ImageRef(f"127.0.0.1:{sock.getsockname()[1]}", "evil/app", "v1")
    finally:
        await runner.cleanup()


def hostile_client() -> RegistryClient:
    return RegistryClient(credentials=lambda _: None, retry=FAST_RETRY)


async def test_an_unknown_manifest_media_type_is_refused(
        hostile: tuple[Hostile, ImageRef], images: dict[str, BuiltImage]) -> None:
    server, ref = hostile
    server.manifest = images["amd64"].manifest.replace(OCI_MANIFEST.encode(),
                                                       b"application/vnd.evil+json")
    server.content_type = "application/vnd.evil+json"
    async with hostile_client() as client:
        with pytest.raises(RegistryError, match=rf"image {ref} on registry {ref.registry} "
                           r"refused: unsupported manifest media type 'application/vnd.evil"):
            await client.get_manifest(ref)


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_manifest_over_4_mib_is_refused(hostile: tuple[Hostile, ImageRef],
                                                chunked: bool) -> None:
    server, ref = hostile
    server.manifest = b'{"schemaVersion": 2, "pad": "' + b"x" * (5 << 20) + b'"}'
    server.chunked = chunked
    async with hostile_client() as client:
        with pytest.raises(RegistryError, match=rf"manifest of image {ref} .*over the "
                           r"4194304-byte limit: refused"):
            await client.get_manifest(ref)


async def test_manifest_bytes_must_match_the_digest_asked_for_or_announced(
        hostile: tuple[Hostile, ImageRef], images: dict[str, BuiltImage]) -> None:
    server, ref = hostile
    image = images["amd64"]
    server.manifest = images["arm64"].manifest
    async with hostile_client() as client:
        pinned = ref.with_digest(image.digest)
        with pytest.raises(RegistryError, match=rf"manifest of image {pinned} from registry "
                           rf"{ref.registry} does not match its digest: its bytes hash to "
                           rf"{images['arm64'].digest}"):
            await client.get_manifest(pinned)
        server.digest_header = image.digest
        with pytest.raises(RegistryError, match=rf"but the registry says {image.digest}"):
            await client.get_manifest(ref)


async def test_a_served_blob_that_misses_its_digest_is_detected(
        hostile: tuple[Hostile, ImageRef], images: dict[str, BuiltImage]) -> None:
    server, ref = hostile
    image = images["amd64"]
    server.blob = image.layers[0].read()[:-1] + bytes([image.layers[0].read()[-1] ^ 1])
    async with hostile_client() as client:
        with pytest.raises(RegistryError, match="does not match its digest"):
            await client.get_blob(ref, image.layers[0].digest)
        with pytest.raises(RegistryError, match="does not match its digest"):
            async for _ in client.stream_blob(ref, image.layers[0].digest):
                pass


async def test_a_range_answered_wrongly_is_refused(
        hostile: tuple[Hostile, ImageRef], images: dict[str, BuiltImage]) -> None:
    server, ref = hostile
    image = images["amd64"]
    server.blob = image.layers[0].read()
    view = memoryview(bytearray(1000))
    async with hostile_client() as client:
        with pytest.raises(RegistryError, match=r"answered HTTP 200 for blob .* where HTTP 206 "
                           "was expected"):
            await client.read_blob_range(ref, image.layers[0].digest, 5000, view)
        server.range_start_shift = 1
        with pytest.raises(RegistryError, match=r"answered a range of blob .* from byte '5001', "
                           "not 5000"):
            await client.read_blob_range(ref, image.layers[0].digest, 5000, view)
        server.range_start_shift = 0
        await client.read_blob_range(ref, image.layers[0].digest, 5000, view)
        assert bytes(view) == image.layers[0].read()[5000:6000]


async def test_5xx_and_429_are_retried_then_reported(
        hostile: tuple[Hostile, ImageRef], images: dict[str, BuiltImage]) -> None:
    server, ref = hostile
    image = images["amd64"]
    server.blob = image.config
    async with hostile_client() as client:
        server.statuses = [503, 429]
        server.retry_after = "0"
        assert await client.get_blob(ref, sha256_digest(image.config)) == image.config
        assert server.requests == 3
        server.requests, server.statuses = 0, [429] * 5
        with pytest.raises(RegistryError, match=rf"registry {ref.registry} kept rate-limiting "
                           r"requests for blob .* through 3 attempts: try again later"):
            await client.get_blob(ref, sha256_digest(image.config))
        assert server.requests == 3
        server.requests, server.statuses = 0, [500] * 5
        with pytest.raises(RegistryError, match=rf"failed on image {ref} with HTTP 500"):
            await client.get_manifest(ref)
        assert server.requests == 3
        server.requests, server.statuses = 0, [403]
        with pytest.raises(RegistryError, match=rf"denied access to image {ref}"):
            await client.get_manifest(ref)
        assert server.requests == 1
