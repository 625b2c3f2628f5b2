"""`bootseer image pull`: every layer of an image into the local store, with progress.

The layers are fetched whole through the local agent (`ensure`), all at once;
while they come, a terminal shows one line of progress (bytes held, and how
many came from peers and from the registry: p2p.progress). With `--json`, or
when stderr is not a terminal, only the final JSON line is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from fusefs.image.catalog import open_image
from p2p.agentclient import AgentClient
from p2p.origin.oci import RegistryClient
from p2p.origin.oci_ref import ImageRef
from p2p.progress import totals, while_fetching
from p2p.tracker_client import TrackerClient


async def pull_image(ref: ImageRef, args: argparse.Namespace, secret: bytes,
                     quiet: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    plain = (ref.registry,) if args.plain_http else ()
    async with RegistryClient(plain_http=plain) as registry, \
            TrackerClient(args.tracker, secret) as tracker, \
            AgentClient(args.api_socket) as agent:
        image = await open_image(registry, tracker, agent, ref)
        contents = [layer.content_id for layer in image.layers]
        fetch = asyncio.gather(*(agent.ensure(c) for c in contents))
        await while_fetching(agent, str(image.ref), contents, fetch,
                             show=not quiet and sys.stderr.isatty())
        held = totals(await agent.status(), contents)
    return {"image": image.digest, "layers": len(contents),
            "seconds": round(time.monotonic() - started, 3), **held}
