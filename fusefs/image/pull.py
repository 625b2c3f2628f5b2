"""`bootseer image pull`: every layer of an image into the local store, with progress.

The layers are fetched whole through the local agent (`ensure`), all at once;
while they come, a terminal shows one line of progress (bytes held, and how
many came from peers and from the registry), refreshed twice a second. With
`--json`, or when stderr is not a terminal, only the final JSON line is
printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from fusefs.image.catalog import open_image
from p2p.agentclient import AgentClient
from p2p.origin.oci import RegistryClient
from p2p.origin.oci_ref import ImageRef
from p2p.tracker_client import TrackerClient

REFRESH_S = 0.5
MB = 1e6


async def pull_image(ref: ImageRef, args: argparse.Namespace, secret: bytes,
                     quiet: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    plain = (ref.registry,) if args.plain_http else ()
    async with RegistryClient(plain_http=plain) as registry, \
            TrackerClient(args.tracker, secret) as tracker, \
            AgentClient(args.api_socket) as agent:
        image = await open_image(registry, tracker, agent, ref)
        contents = [layer.content_id for layer in image.layers]
        show = not quiet and sys.stderr.isatty()
        fetch = asyncio.gather(*(agent.ensure(c) for c in contents))
        while show and not fetch.done():
            await asyncio.wait([fetch], timeout=REFRESH_S)
            _show(str(image.ref), totals(await agent.status(), contents))
        await fetch
        held = totals(await agent.status(), contents)
    if show:
        sys.stderr.write("\n")
    return {"image": image.digest, "layers": len(contents),
            "seconds": round(time.monotonic() - started, 3), **held}


def totals(status: dict[str, Any], contents: Sequence[str]) -> dict[str, int]:
    out = {"bytes": 0, "have_bytes": 0, "peer_bytes": 0, "origin_bytes": 0}
    for content in contents:
        info = status["contents"].get(content, {})
        size, chunks = info.get("size", 0), max(info.get("chunks", 1), 1)
        out["bytes"] += size
        out["have_bytes"] += size if info.get("complete") else size * info.get("have", 0) // chunks
        out["peer_bytes"] += info.get("peer_bytes", 0)
        out["origin_bytes"] += info.get("origin_bytes", 0)
    return out


def _show(name: str, t: dict[str, int]) -> None:
    sys.stderr.write(f"\r{name}: {t['have_bytes'] / MB:,.1f} of {t['bytes'] / MB:,.1f} MB "
                     f"(from peers {t['peer_bytes'] / MB:,.1f} MB, from the registry "
                     f"{t['origin_bytes'] / MB:,.1f} MB)  ")
    sys.stderr.flush()
