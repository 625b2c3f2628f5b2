"""The tracker's document views: manifests, and names for contents.

    PUT  /v1/manifests/{content_id}    publish a manifest (201 new, 200 same, 409 other)
    GET  /v1/manifests/{content_id}    fetch a manifest; the body is MAC'd
    PUT  /v1/names/{name}              name a published content (see tracker.names)
    GET  /v1/names/{name}              resolve a name; the body is MAC'd

Both are write-once documents (tracker.store): the first writer wins, the
same bytes again are a no-op, other bytes a 409. A manifest must be the one
its URL names, and is stored in its canonical spelling (tracker.state); a
name may only point at a published manifest. Publishing a held id again with
the same kind and other origins adds those origins (tracker.origins says
who may and why it is safe); a GET serves the manifest with every origin.
A GET's body carries a MAC made with the cluster secret, which the client
checks. tracker.app routes here and maps failures to status codes.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from p2p.auth import BODY_MAC_HEADER, sign_body
from p2p.content import MAX_ORIGINS, ContentId, Manifest, ManifestError
from tracker import names, origins, payload
from tracker.guard import MANIFEST_BODY_LIMIT, BadRequest
from tracker.state import TRACKER, Tracker, canonical
from tracker.store import Conflict

log = logging.getLogger("bootseer.tracker")


def _signed(t: Tracker, body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json",
                        headers={BODY_MAC_HEADER: sign_body(t.secret, body)})


def _url_content_id(request: web.Request) -> ContentId:
    return payload.content_id(request.match_info["content_id"], "the URL's content id")


def _url_name(request: web.Request) -> str:
    try:
        return names.check_name(request.match_info["name"])
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


async def put_manifest(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    content_id = _url_content_id(request)
    raw = payload.json_object(await t.guard.authenticate(request, MANIFEST_BODY_LIMIT))
    try:
        manifest = Manifest.from_dict(raw)
    except ManifestError as exc:
        raise BadRequest(f"bad manifest: {exc}") from None
    if manifest.content_id != content_id:
        raise BadRequest(f'manifest "content_id" {manifest.content_id!r} does not match the '
                         f"URL's {content_id!r}")
    try:
        created = await t.manifests.put(content_id, canonical(manifest))
    except Conflict as exc:
        return await _add_origins(t, Manifest.from_dict(json.loads(exc.held)), manifest)
    if created:
        log.info("published manifest %s (%d chunks)", content_id, manifest.chunks)
    return payload.reply({"ok": True, "created": created}, status=201 if created else 200)


async def _add_origins(t: Tracker, held: Manifest, offered: Manifest) -> web.Response:
    """The id is held: the bytes are the same (the id pins them), so what differs is the
    kind or where the bytes live. New origins are added; another kind is a 409."""
    if offered.kind != held.kind:
        return payload.reply({"error": (
            f"{held.content_id} is already published with kind {held.kind!r}, not "
            f"{offered.kind!r}; publish it with kind {held.kind!r} to add an origin")},
            status=409)
    slots = await _extra_origins(t, held.content_id)
    known = {held.origin, *held.origins, *slots.values()}
    added: list[str] = []
    for url in dict.fromkeys(u for u in offered.sources if u not in known):
        full = len(known) + len(added) >= MAX_ORIGINS
        if full or await _claim_slot(t, held.content_id, url, slots) is None:
            return payload.reply({"error": (
                f"{held.content_id} already has {len(known) + len(added)} origins, the "
                "most a content may have; an operator can remove one from the tracker's "
                "state dir"), "added": added}, status=409)
        added.append(url)
    if added:
        log.info("added origins %s to %s", ", ".join(added), held.content_id)
    return payload.reply({"ok": True, "created": False, "added": added}, status=200)


async def _extra_origins(t: Tracker, content_id: ContentId) -> dict[int, str]:
    """The origins added after the first publisher's, by slot."""
    found = {}
    for slot in origins.SLOTS:
        body = await t.origins.get(origins.key(content_id, slot))
        if body is None:
            break  # slots are claimed in order, so the first free one ends the list
        found[slot] = origins.parse(body)[1]
    return found


async def _claim_slot(t: Tracker, content_id: ContentId, url: str,
                      slots: dict[int, str]) -> int | None:
    """Write `url` into the first free slot (another replica may take one meanwhile)."""
    for slot in origins.SLOTS:
        if slot in slots:
            continue
        try:
            await t.origins.put(origins.key(content_id, slot), origins.canonical(content_id, url))
        except Conflict as exc:
            slots[slot] = origins.parse(exc.held)[1]
            if slots[slot] == url:
                return slot
            continue
        slots[slot] = url
        return slot
    return None


async def get_manifest(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    content_id = _url_content_id(request)
    await t.guard.authenticate(request)
    body = await t.manifests.get(content_id)
    if body is None:
        return payload.reply({"error": f"no manifest is published as {content_id}"}, status=404)
    extra = await _extra_origins(t, content_id)
    if extra:
        manifest = Manifest.from_dict(json.loads(body))
        room = MAX_ORIGINS - len(manifest.sources)
        body = canonical(manifest.with_origins(tuple(extra.values())[:room]))
    return _signed(t, body)


async def put_name(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    name = _url_name(request)
    body = payload.json_object(await t.guard.authenticate(request))
    content_id = payload.content_id(payload.field(body, "content_id", str), 'field "content_id"')
    if await t.manifests.get(content_id) is None:
        return payload.reply({"error": f"no manifest is published as {content_id}; publish it "
                              "before naming it"}, status=404)
    try:
        created = await t.names.put(names.file_key(name), names.canonical(name, content_id))
    except Conflict as exc:
        holder = names.parse(exc.held)[1]
        return payload.reply({"error": f"the name {name!r} already names {holder}; names are "
                              "never changed", "content_id": holder}, status=409)
    if created:
        log.info("named %s %r", content_id, name)
    return payload.reply({"ok": True, "created": created}, status=201 if created else 200)


async def get_name(request: web.Request) -> web.Response:
    t = request.app[TRACKER]
    t.guard.check_headers(request)
    name = _url_name(request)
    await t.guard.authenticate(request)
    body = await t.names.get(names.file_key(name))
    if body is None:
        return payload.reply({"error": f"no content is named {name!r}"}, status=404)
    return _signed(t, body)
