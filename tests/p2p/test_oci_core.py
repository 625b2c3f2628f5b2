"""The registry client's no-I/O parts: references, challenges, credentials, manifests, retries."""

from __future__ import annotations

import base64
import json
import re

import pytest

from p2p.origin.base import OriginError
from p2p.origin.oci_auth import (
    Credentials,
    TokenCache,
    credentials_from_config,
    find_credentials,
    parse_challenge,
    repository_scope,
    token_from_answer,
)
from p2p.origin.oci_http import Failure, RetryPolicy, error_for_status, parse_retry_after
from p2p.origin.oci_manifest import (
    DOCKER_MANIFEST,
    OCI_INDEX,
    OCI_MANIFEST,
    ImageIndex,
    ImageManifest,
    ManifestError,
    Platform,
    manifest_media_type,
    parse_manifest,
    parse_platform,
    pick_platform,
)
from p2p.origin.oci_origin import blob_url, parse_blob_url
from p2p.origin.oci_ref import ImageRef, ImageRefError, parse_reference

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64


@pytest.mark.parametrize("text, registry, repository, tag, digest", [
    ("busybox", "docker.io", "library/busybox", "latest", None),
    ("user/app:1.0", "docker.io", "user/app", "1.0", None),
    ("localhost/app", "localhost", "app", "latest", None),
    ("127.0.0.1:5000/a/b-c_d.e:v1", "127.0.0.1:5000", "a/b-c_d.e", "v1", None),
    (f"ghcr.io/o/r@{D1}", "ghcr.io", "o/r", None, D1),
    (f"ghcr.io/o/r:t@{D1}", "ghcr.io", "o/r", "t", D1),
    ("[::1]:5000/app:x", "[::1]:5000", "app", "x", None),
])
def test_references_parse_by_the_documented_rules(text: str, registry: str, repository: str,
                                                   tag: str | None, digest: str | None) -> None:
    ref = parse_reference(text)
    assert ref == ImageRef(registry, repository, tag, digest)
    assert ref.reference == (digest or tag)
    assert parse_reference(str(ref)) == ref


def test_docker_hub_is_reached_on_its_api_host() -> None:
    assert parse_reference("busybox").endpoint == "registry-1.docker.io"
    assert parse_reference("127.0.0.1:5000/x").endpoint == "127.0.0.1:5000"


@pytest.mark.parametrize("text, says", [
    ("", "empty"),
    (" busybox", "spaces"),
    ("Busybox", "repository"),
    ("a//b", "repository"),
    ("a/b:", "tag"),
    ("a/b:-x", "tag"),
    ("a/b@sha256:abc", "64 lower-case hex"),
    (f"a/b@md5:{'a' * 64}", "no other algorithm"),
    (f"a/b@sha256:{'A' * 64}", "64 lower-case hex"),
    ("bad_host.io:x/app", "registry"),
])
def test_malformed_references_are_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(ImageRefError, match=says):
        parse_reference(text)


def test_bearer_and_basic_challenges_parse() -> None:
    header = ('Bearer realm="https://auth.example/token",service="registry.example",'
              'scope="repository:a/b:pull,push",error="insufficient_scope"')
    challenge = parse_challenge(header)
    assert challenge is not None and challenge.scheme == "bearer"
    assert challenge.param("realm") == "https://auth.example/token"
    assert challenge.param("scope") == "repository:a/b:pull,push"
    assert challenge.param("error") == "insufficient_scope"
    basic = parse_challenge('Basic realm="my \\"realm\\""')
    assert basic is not None and basic.scheme == "basic" and basic.param("realm") == 'my "realm"'
    assert parse_challenge("Negotiate abc") is None and parse_challenge(None) is None


def test_scopes_and_token_answers() -> None:
    assert repository_scope("a/b", push=False) == "repository:a/b:pull"
    assert repository_scope("a/b", push=True) == "repository:a/b:pull,push"
    assert token_from_answer(b'{"token": "t", "expires_in": 300}') == ("t", 300.0)
    assert token_from_answer(b'{"access_token": "t"}') == ("t", 60.0)
    with pytest.raises(ValueError, match="no token"):
        token_from_answer(b'{"expires_in": 3}')


def test_token_cache_expires_before_the_issuer_says() -> None:
    cache = TokenCache()
    cache.put("r", "s", "tok", lifetime_s=60, now=100)
    assert cache.get("r", "s", now=149) == "tok"
    assert cache.get("r", "s", now=150) is None  # renewed 10 s early
    assert cache.get("r", "other", now=100) is None
    cache.put("r", "s", "new", lifetime_s=60, now=100)
    cache.drop("r", "s", "tok")  # an older token refused: the newer one stays
    assert cache.get("r", "s", now=100) == "new"
    cache.drop("r", "s", "new")
    assert cache.get("r", "s", now=100) is None


def test_credentials_from_a_docker_config() -> None:
    auth = base64.b64encode(b"alice:pa:ss").decode()
    config = json.dumps({"auths": {"reg.example:5000": {"auth": auth},
                                   "https://index.docker.io/v1/": {"username": "bob",
                                                                   "password": "pw"}}})
    assert credentials_from_config(config, "reg.example:5000", "f") == Credentials("alice",
                                                                                   "pa:ss")
    assert credentials_from_config(config, "docker.io", "f") == Credentials("bob", "pw")
    assert credentials_from_config(config, "other.example", "f") is None
    with pytest.raises(ValueError, match="not base64"):
        credentials_from_config('{"auths": {"r": {"auth": "%%%"}}}', "r", "f")
    with pytest.raises(ValueError, match="docker-style"):
        credentials_from_config("nope", "r", "f")
    assert "pa:ss" not in repr(Credentials("alice", "pa:ss"))


def test_credentials_from_the_environment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"auths": {"r:1": {"username": "u", "password": "p"}}}))
    env = {"BOOTSEER_REGISTRY_AUTH_FILE": str(path)}
    assert find_credentials("r:1", env) == Credentials("u", "p")
    assert find_credentials("r:1", {**env, "BOOTSEER_REGISTRY_AUTH": "x:y"}) == Credentials("x",
                                                                                          "y")
    with pytest.raises(ValueError, match="user:password"):
        find_credentials("r:1", {"BOOTSEER_REGISTRY_AUTH": "nocolon"})
    with pytest.raises(ValueError, match="cannot read"):
        find_credentials("r:1", {"BOOTSEER_REGISTRY_AUTH_FILE": str(tmp_path / "missing")})


def _manifest(**over: object) -> bytes:
    doc: dict[str, object] = {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": D1,
                   "size": 10},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": D2,
                    "size": 20}],
    }
    doc.update(over)
    return json.dumps(doc).encode()


def _index(*platforms: tuple[str, str, str | None], media_type: str = OCI_MANIFEST) -> bytes:
    entries = [{"mediaType": media_type, "digest": f"sha256:{n:064x}", "size": 1,
                "platform": {"os": o, "architecture": a, **({"variant": v} if v else {})}}
               for n, (o, a, v) in enumerate(platforms)]
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode()


def test_manifests_parse_and_media_types_are_checked() -> None:
    body = _manifest()
    assert manifest_media_type(body, "application/vnd.oci.image.manifest.v1+json") == OCI_MANIFEST
    parsed = parse_manifest(body, OCI_MANIFEST)
    assert isinstance(parsed, ImageManifest)
    assert [layer.digest for layer in parsed.layers] == [D2] and parsed.config.size == 10
    no_field = json.dumps({k: v for k, v in json.loads(body).items() if k != "mediaType"})
    assert manifest_media_type(no_field.encode(), DOCKER_MANIFEST) == DOCKER_MANIFEST
    with pytest.raises(ManifestError, match="unsupported manifest media type"):
        manifest_media_type(_manifest(mediaType="application/vnd.example+json"), None)
    with pytest.raises(ManifestError, match="served as"):
        manifest_media_type(body, DOCKER_MANIFEST)
    with pytest.raises(ManifestError, match="not valid JSON"):
        manifest_media_type(b"\xff{", None)


@pytest.mark.parametrize("over, says", [
    ({"schemaVersion": 1}, "schemaVersion"),
    ({"layers": {}}, "not a list"),
    ({"config": {"mediaType": "x", "digest": "sha256:12", "size": 1}}, "bad digest"),
    ({"config": {"mediaType": "x", "digest": D1, "size": -1}}, "bad size"),
    ({"config": {"mediaType": "x", "digest": D1, "size": True}}, "bad size"),
    ({"config": {"digest": D1, "size": 1}}, "no mediaType"),
])
def test_malformed_manifests_are_refused(over: dict[str, object], says: str) -> None:
    with pytest.raises(ManifestError, match=says):
        parse_manifest(_manifest(**over), OCI_MANIFEST)


def test_an_index_resolves_to_the_asked_platform() -> None:
    index = parse_manifest(_index(("linux", "amd64", None), ("linux", "arm64", "v8"),
                                  ("unknown", "unknown", None)), OCI_INDEX)
    assert isinstance(index, ImageIndex)
    assert pick_platform(index, Platform("linux", "amd64")).digest == f"sha256:{0:064x}"
    assert pick_platform(index, parse_platform("linux/arm64")).digest == f"sha256:{1:064x}"
    assert pick_platform(index, parse_platform("linux/arm64/v8")).digest == f"sha256:{1:064x}"
    with pytest.raises(ManifestError, match=r"linux/arm64/v7 \(available: linux/amd64, "
                                            r"linux/arm64/v8, unknown/unknown\)"):
        pick_platform(index, parse_platform("linux/arm64/v7"))
    nested = parse_manifest(_index(("linux", "amd64", None), media_type=OCI_INDEX), OCI_INDEX)
    assert isinstance(nested, ImageIndex)
    with pytest.raises(ManifestError, match="nested"):
        pick_platform(nested, Platform("linux", "amd64"))
    with pytest.raises(ManifestError, match="os/arch"):
        parse_platform("linux")


def test_retry_policy_backs_off_boundedly_and_honours_retry_after() -> None:
    policy = RetryPolicy(attempts=4, first_delay_s=0.5, max_delay_s=3.0)
    assert [policy.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, None]
    assert policy.delay(1, retry_after_s=2.5) == 2.5
    assert policy.delay(1, retry_after_s=3600) == 3.0
    assert policy.delay(4, retry_after_s=0) is None
    assert parse_retry_after("7", now_epoch_s=0) == 7.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:30 GMT", now_epoch_s=10) == 20.0
    assert parse_retry_after("soon", now_epoch_s=0) is None
    assert parse_retry_after(None, now_epoch_s=0) is None


@pytest.mark.parametrize("failure, says", [
    (Failure("image r:1/a:t", "r:1", 401), "requires credentials for image r:1/a:t .* none "
                                           "are configured: set BOOTSEER_REGISTRY_AUTH"),
    (Failure("image r:1/a:t", "r:1", 401, sent_credentials="u"),
     "registry r:1 refused the credentials of user 'u' for image r:1/a:t"),
    (Failure("image r:1/a:t", "r:1", 401, sent_credentials="u", push=True,
             insufficient_scope=True), "denied access to image r:1/a:t .* not allowed to push"),
    (Failure("image r:1/a:t", "r:1", 403, sent_credentials="u"), "not allowed to pull"),
    (Failure("image r:1/a:t", "r:1", 404, ": MANIFEST_UNKNOWN manifest unknown"),
     "image r:1/a:t not found on registry r:1 .*MANIFEST_UNKNOWN"),
    (Failure("image r:1/a:t", "r:1", 429, attempts=4), "rate-limiting .* through 4 attempts"),
    (Failure("image r:1/a:t", "r:1", 502, attempts=4), "failed on image r:1/a:t with HTTP 502"),
    (Failure("image r:1/a:t", "r:1", 418), "answered HTTP 418 for image r:1/a:t"),
])
def test_each_failure_has_a_plain_message(failure: Failure, says: str) -> None:
    error = error_for_status(failure)
    assert error.status == failure.status
    assert isinstance(error, OriginError)
    assert re.search(says, str(error)), str(error)


def test_blob_urls_round_trip_and_bad_ones_are_origin_errors() -> None:
    ref = ImageRef("127.0.0.1:5000", "a/b")
    url = blob_url(ref, D1)
    assert url == f"oci://127.0.0.1:5000/a/b@{D1}"
    assert parse_blob_url(url) == (ref, D1)
    assert parse_blob_url(blob_url(ImageRef("reg", "x"), D2, plain_http=True)) == (
        ImageRef("reg", "x"), D2)
    for bad in (f"oci://r/a:tag@{D1}", "oci://r/a:tag", f"http://r/a@{D1}", f"oci:///a@{D1}",
                f"oci://r/a@{D1}?x=1"):
        with pytest.raises(OriginError, match="bad registry blob URL"):
            parse_blob_url(bad)
