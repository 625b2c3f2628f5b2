"""Find, load and publish snapshots: the tracker's names, the origin's files.

A snapshot is published in an order that never shows half of it:

1. its packs and its tree manifest are written into the origin directory
   under their content ids (each by rename; see `capture`);
2. their manifests are registered with the tracker (an id pins its bytes,
   so registering the same pack twice is harmless);
3. with an origin directory, the key record `keys/<key>.json` (the tree and
   every manifest) is linked into it, unless one is there already, whose
   tree then wins (`record`: this is also how a node finds a snapshot that
   its tracker does not know);
4. the name `depsnap/<key>` is bound to the tree's content id. Names are
   write-once and this is the last step, so a node that finds the name finds
   a complete snapshot.

Two nodes that create the same key at once both get to step 4; the tracker
takes the first name write and refuses the second (409). The loser then
reads the winner's id and reports it: one published snapshot per key. Its
own packs stay in the origin directory, unnamed (a pack that is the same in
both, like numpy's, is one file anyway).

`load_snapshot` goes the other way: name -> tree id (tracker-signed) ->
tree bytes (through the agent, verified chunk by chunk against the manifest
that the id pins) -> `Snapshot.from_json` (paths and links checked), and the
tree must say it is the snapshot of the key asked for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from depsnap.capture import publish_file, scan, write_packs
from depsnap.key import KeyInputs, key_name
from depsnap.record import adopt, write_record
from depsnap.snapshot import KIND, Snapshot, SnapshotError
from p2p.agentclient import AgentClient, AgentError
from p2p.content import ContentId, Manifest
from p2p.errors import UserError
from p2p.tracker_client import TrackerClient, TrackerError

log = logging.getLogger("bootseer.depsnap")
TREES = "trees"
PACKED_KIND = "depsnap-packed-tree"


class SnapshotNotFound(UserError):
    """No snapshot is published for a key."""


@dataclass(frozen=True, slots=True)
class Published:
    key: str
    tree: ContentId  # the tree the key's name points at (the winner's, if we lost)
    won: bool  # False: another node published this key first
    files: int
    file_bytes: int
    pack_bytes: int  # stored (compressed) bytes of the packs
    new_pack_bytes: int  # pack bytes not in the origin directory before
    packs: int


async def find_snapshot(tracker: TrackerClient, key: str, origin_url: str = ""
                        ) -> ContentId | None:
    """The tree of `key`: the tracker's name, else the origin's key record (`record`)."""
    try:
        return await tracker.get_name(key_name(key))
    except TrackerError as exc:
        if exc.status != 404:
            raise
    return await adopt(tracker, origin_url, key) if origin_url else None


async def load_snapshot(tracker: TrackerClient, agent: AgentClient, key: str,
                        origin_url: str = "") -> tuple[ContentId, Snapshot]:
    tree = await find_snapshot(tracker, key, origin_url)
    if tree is None:
        raise SnapshotNotFound(f"no snapshot is published for key {key}")
    manifest = await tracker.get_manifest(tree)
    try:
        # ensure, then read: a read of a chunk no peer has yet goes to the origin at once
        # (the lazy rule), so nodes starting together would each fetch the tree there;
        # ensure leaves the origin to the tracker's appointed fetchers.
        await agent.ensure(tree)
        data = await agent.read(tree, 0, manifest.size)
    except AgentError as exc:
        raise SnapshotError(f"cannot read the tree {tree} of key {key}: {exc}") from None
    snapshot = Snapshot.from_json(data)
    if snapshot.key != key:
        raise SnapshotError(f"the tree {tree} published for key {key} is the snapshot of "
                            f"key {snapshot.key}; refusing it")
    return tree, snapshot


async def load_packed_tree(tracker: TrackerClient, agent: AgentClient, snapshot: Snapshot
                           ) -> bytes | None:
    """The bytes of the snapshot's packed mount tree, through the agent (verified against
    the manifest its id pins); None if it has none or it cannot be had (the mount then
    builds the tree itself: slower, never wrong)."""
    if not snapshot.packed_tree:
        return None
    content = ContentId(snapshot.packed_tree)
    try:
        manifest = await tracker.get_manifest(content)
        await agent.ensure(content)
        return bytes(await agent.read(content, 0, manifest.size))
    except (AgentError, TrackerError) as exc:
        log.warning("the packed tree %s of key %s cannot be read (%s); building the tree",
                    content, snapshot.key, exc)
        return None


def capture(prefix: Path, key: str, inputs: KeyInputs, resolved: tuple[str, ...],
            origin_dir: Path, origin_url: str) -> tuple[Snapshot, list[Manifest], int]:
    """Scan `prefix`, write its packs and tree into `origin_dir`: the snapshot, the
    manifests to register (tree last) and the pack bytes that were new."""
    from depsnap.mounttree import packed_tree

    entries = scan(prefix)
    written = write_packs(prefix, entries, origin_dir / "packs", origin_url)
    snapshot = Snapshot(key, str(prefix), inputs.interpreter.executable, tuple(entries),
                        written.packs, inputs.describe(), resolved)
    packed = publish_file(packed_tree(snapshot), origin_dir, origin_url, PACKED_KIND, TREES)
    snapshot = replace(snapshot, packed_tree=packed.content_id)
    tree = publish_file(snapshot.to_json(), origin_dir, origin_url, KIND, TREES)
    return snapshot, [*written.manifests, packed, tree], written.new_bytes


async def publish(tracker: TrackerClient, snapshot: Snapshot, manifests: list[Manifest],
                  new_bytes: int, origin_dir: Path | None = None) -> Published:
    """Write the key record into `origin_dir` (if given; an earlier record wins), register
    the manifests, then bind the key's name to the tree (the last one)."""
    ours = manifests[-1].content_id
    if origin_dir is not None:
        manifests = write_record(origin_dir, snapshot.key, manifests)
    for manifest in manifests:
        await tracker.put_manifest(manifest)
    tree = manifests[-1].content_id
    name = key_name(snapshot.key)
    try:
        await tracker.put_name(name, tree)
        winner, won = tree, True
    except TrackerError as exc:
        if exc.status != 409:
            raise
        winner, won = await tracker.get_name(name), False
    return Published(snapshot.key, winner, (won or winner == tree) and winner == ours,
                     sum(e.kind == "file" for e in snapshot.entries), snapshot.file_bytes,
                     sum(p.stored_size for p in snapshot.packs), new_bytes, len(snapshot.packs))
