"""`bootseer dev registry` and `bootseer dev image` (see p2p.testing.dev)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

from p2p.errors import UserError

if TYPE_CHECKING:
    from p2p.origin.oci_ref import ImageRef

DEV_DIR = Path("/tmp/bootseer-dev")


def add_commands(kinds: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = kinds.add_parser("registry", help="run a real OCI registry (docker-registry) on "
                                          "127.0.0.1 until stopped")
    p.add_argument("--port", type=int, default=5000, help="TCP port; 0 picks a free one")
    p.add_argument("--dir", type=Path, default=DEV_DIR / "registry",
                   help="where its blobs, config and log are kept")
    p.set_defaults(run=_run_registry)

    p = kinds.add_parser("image", help="build a test image and push it to a registry")
    p.add_argument("ref", metavar="REF", help="where to push, e.g. 127.0.0.1:5000/dev/python:3")
    p.add_argument("--busybox", action="store_true",
                   help="a tiny busybox image (seconds) instead of Debian bookworm with "
                        "python3 (debootstrap: minutes the first time, cached after)")
    p.set_defaults(run=_run_image)


def _run_registry(args: argparse.Namespace) -> int:
    from fusefs.testing.registry import RegistryStartError, local_registry
    from p2p.testing.dev import wait_for_stop

    try:
        with local_registry(args.dir.absolute(), port=args.port or None) as registry:
            print(json.dumps({"event": "listening", "registry": registry.address,
                              "log": str(registry.log_path)}), flush=True)
            wait_for_stop()
    except RegistryStartError as exc:
        raise UserError(str(exc)) from None
    return 0


def _run_image(args: argparse.Namespace) -> int:
    from fusefs.image.tool import ToolError
    from p2p.origin.oci_http import RegistryError
    from p2p.origin.oci_ref import ImageRefError, parse_reference

    try:
        ref = parse_reference(args.ref)
    except ImageRefError as exc:
        raise UserError(str(exc)) from None
    try:
        digest = asyncio.run(_build_and_push(ref, args.busybox))
    except ToolError as exc:
        raise UserError(f"cannot build the image: {exc}") from None
    except RegistryError as exc:
        raise UserError(f"cannot push {args.ref}: {exc}") from None
    print(json.dumps({"image": args.ref, "digest": digest}))
    return 0


async def _build_and_push(ref: ImageRef, busybox: bool) -> str:
    from fusefs.testing.sample import busybox_image, push_sample, python3_image
    from p2p.origin.oci import RegistryClient

    image = busybox_image() if busybox else await python3_image(top_layer=False)
    async with RegistryClient() as client:
        return await push_sample(client, ref, image)
