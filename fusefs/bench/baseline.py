"""The full-pull baseline: what starting a container costs without lazy loading.

`full_pull(ref, workdir)` does what a node does today before a job can
start, with the standard tools, and times each half:

1. copy: `skopeo copy docker://REF oci:WORKDIR/oci:bootseer` downloads the
   manifest, the config and every layer blob into an OCI layout directory;
2. unpack: `umoci unpack --image WORKDIR/oci:bootseer WORKDIR/bundle`
   decompresses and extracts every layer, applying whiteouts, into
   `WORKDIR/bundle/rootfs`.

`PullResult.bytes` is the size of the layout's blobs (what crossed the
network). The benchmark sets `seconds_copy + seconds_unpack` beside the
lazy path's time to first command. A plain-HTTP registry (the loopback
test registry) needs `plain_http=True` (skopeo's `--src-tls-verify=false`,
which also allows plain HTTP). Any tool missing or failing is a `ToolError`
with the tool's own last words.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from fusefs.image.tool import ToolError, run_tool

LAYOUT_TAG = "bootseer"


@dataclass(frozen=True, slots=True)
class PullResult:
    rootfs: Path
    seconds_copy: float
    seconds_unpack: float
    bytes: int  # blob bytes downloaded


def skopeo_copy_args(ref: str, layout: Path, *, plain_http: bool,
                     creds: str | None) -> list[str]:
    """The skopeo command line that copies `ref` into the OCI layout at `layout`."""
    args = ["skopeo", "--insecure-policy", "copy"]
    if plain_http:
        args.append("--src-tls-verify=false")
    if creds is not None:
        args.append(f"--src-creds={creds}")
    return [*args, f"docker://{ref}", f"oci:{layout}:{LAYOUT_TAG}"]


async def full_pull(ref: str, workdir: Path, *, plain_http: bool = False,
                    creds: str | None = None) -> PullResult:
    """Copy `ref` with skopeo and unpack it with umoci under `workdir` (see above).

    `workdir` must not yet hold `oci` or `bundle`; `creds` is "USER:PASSWORD".
    """
    layout, bundle = workdir / "oci", workdir / "bundle"
    if layout.exists() or bundle.exists():
        raise ToolError(f"{workdir} already holds a pull; use an empty directory")
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    await run_tool(skopeo_copy_args(ref, layout, plain_http=plain_http, creds=creds),
                   f"skopeo copy of {ref}")
    copied = time.monotonic()
    await run_tool(["umoci", "unpack", "--image", f"{layout}:{LAYOUT_TAG}", str(bundle)],
                   f"umoci unpack of {ref}")
    unpacked = time.monotonic()
    return PullResult(bundle / "rootfs", copied - started, unpacked - copied,
                      _blob_bytes(layout))


def _blob_bytes(layout: Path) -> int:
    return sum(p.stat().st_size for p in (layout / "blobs").rglob("*") if p.is_file())
