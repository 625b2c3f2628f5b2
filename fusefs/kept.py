"""A mount's FUSE device, kept across the death of the process that serves it.

A FUSE mount lives as long as some process holds its /dev/fuse descriptor:
the kernel queues the readers' requests meanwhile, and they wait. A mount
server (`fusefs.server`) keeps each hosted mount's descriptor beside the
host that serves it (`fusefs.hostlink`); if the host dies, a new one gets
the descriptor back and serves the same tree on it (`fusefs.kernelfs`):

- no INIT comes again: the new host takes what the first one negotiated
  (`KeptDevice.state`);
- node ids are the tree's inode numbers, the same for the same tree;
- requests the dead host had read but not answered are lost to it; the new
  one asks the kernel to queue them again (FUSE_NOTIFY_RESEND, Linux 6.9);
- files opened through the dead host stay open, each inode in the mode its
  first open gave it (passthrough with a backing id, or cached), and the
  kernel refuses an open in the other mode or with another backing file. So
  every change of an inode's open files is written to a journal the server
  keeps with the descriptor (`OpenJournal`, a memfd: one write per OPEN and
  RELEASE of a file, none with no-open), and the new host reads it back.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

RECORD = struct.Struct("<QiI")  # inode, backing id (0: cached mode), open files


class OpenJournal:
    """The open files of a mount by inode, as a log of changes in a memfd."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls) -> OpenJournal:
        return cls(os.memfd_create("bootseer-opens", os.MFD_CLOEXEC))

    def note(self, inode: int, backing_id: int | None, count: int) -> None:
        """Inode `inode` now has `count` open files, in the mode `backing_id` says."""
        os.write(self.fd, RECORD.pack(inode, backing_id or 0, count))

    def replay(self) -> dict[int, tuple[int, int | None]]:
        """Inodes with open files: (open files, backing id or None); the journal is then
        rewritten with just these."""
        size = os.fstat(self.fd).st_size
        data = os.pread(self.fd, size - size % RECORD.size, 0)
        table: dict[int, tuple[int, int | None]] = {}
        for inode, backing_id, count in RECORD.iter_unpack(data):
            if count:
                table[inode] = (count, backing_id or None)
            else:
                table.pop(inode, None)
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        for inode, (count, backing_id) in table.items():
            self.note(inode, backing_id, count)
        return table

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class KeptDevice:
    """A mounted /dev/fuse descriptor, its open-files journal, and what INIT settled."""

    fd: int
    journal: OpenJournal
    state: dict[str, Any]
