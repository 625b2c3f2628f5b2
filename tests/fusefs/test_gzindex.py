"""The gzip layer index and reader, on real gzip layers made with tar/gzip and with Python.

Every file the index lists is read through `LayerReader` and compared with what
`tarfile` extracts; bad blobs and tampered index files must raise `LayerError`
naming the layer, and a corrupted compressed byte must fail a span's check
instead of returning wrong bytes.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import subprocess
import tarfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgpack
import pytest

from fusefs.image.gzindex import LayerError, LayerIndex, build_index
from fusefs.image.layerreader import HEADER_BYTES, LayerReader
from fusefs.tree import Kind, TreeError, build_tree
from p2p.units import MiB


def digest_of(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def build(path: Path) -> LayerIndex:
    with path.open("rb") as blob:
        return build_index(blob, digest_of(path))


def gzip_file(path: Path, tar_bytes: bytes) -> Path:
    path.write_bytes(gzip.compress(tar_bytes, compresslevel=6, mtime=0))
    return path


def make_tree(root: Path) -> None:
    """Many small files, three 3 MiB incompressible ones, a compressible log, links, a FIFO."""
    rng = random.Random(1)
    for i in range(400):
        folder = root / f"dir{i % 25}"
        folder.mkdir(exist_ok=True)
        size = rng.choice([0, 10, 700, 3000, 9000])
        (folder / f"file{i}.txt").write_bytes(rng.randbytes(size // 2) * 2)
    (root / "big").mkdir()
    for i in range(3):
        (root / "big" / f"random{i}.bin").write_bytes(os.urandom(3 * MiB))
    (root / "log.txt").write_bytes(b"".join(b"line %d of the log\n" % i for i in range(250_000)))
    os.symlink("dir0/file0.txt", root / "link")
    os.link(root / "dir1" / "file1.txt", root / "hard")
    os.mkfifo(root / "fifo")
    (root / "dir3" / "file3.txt").chmod(0o4755)


@pytest.fixture(scope="module")
def cli_layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(layer.tar.gz, layer.tar) made with the tar and gzip command line."""
    work = tmp_path_factory.mktemp("cli")
    (work / "root").mkdir()
    make_tree(work / "root")
    tar = work / "layer.tar"
    subprocess.run(["tar", "--numeric-owner", "--format=pax", "-C", str(work / "root"), "-cf",
                    str(tar), "."], check=True)
    subprocess.run(["gzip", "-6", "-k", str(tar)], check=True)
    return work / "layer.tar.gz", tar


def pax_tar() -> bytes:
    """Xattrs, a fractional mtime, a long name, a device node and a hard link, in PAX."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add_file(tar, "etc/conf", b"x=1\n", pax={"SCHILY.xattr.user.origin": "bootseer",
                                                 "SCHILY.xattr.security.capability": "\x01\x02",
                                                 "mtime": "1700000000.123456789"})
        add_file(tar, "deep/" + "n" * 200 + "/name.txt", b"long name\n")
        dev = tarfile.TarInfo("dev/null")
        dev.type, dev.devmajor, dev.devminor, dev.mode = tarfile.CHRTYPE, 1, 3, 0o666
        tar.addfile(dev)
        link = tarfile.TarInfo("etc/conf.hard")
        link.type, link.linkname = tarfile.LNKTYPE, "etc/conf"
        tar.addfile(link)
    return out.getvalue()


def add_file(tar: tarfile.TarFile, name: str, data: bytes, pax: dict[str, str] | None = None,
             mtime: int = 1_600_000_000) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.pax_headers = len(data), mtime, dict(pax or {})
    tar.addfile(info, io.BytesIO(data))


def gnu_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        add_file(tar, "a/" + "x" * 300, b"gnu long name\n")
        link = tarfile.TarInfo("a/short")
        link.type, link.linkname = tarfile.SYMTYPE, "y" * 200
        tar.addfile(link)
    return out.getvalue()


@pytest.fixture(scope="module")
def cli_index(cli_layer: tuple[Path, Path]) -> LayerIndex:
    return build(cli_layer[0])


def reader(index: LayerIndex, path: Path, **kw: Any) -> LayerReader:
    return LayerReader(index, lambda: path.open("rb"), **kw)


def expected_files(blob: Path) -> dict[str, bytes]:
    with tarfile.open(blob) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isreg()}


# ---- reading --------------------------------------------------------------------------


def test_every_file_reads_as_tarfile_extracts(cli_layer: tuple[Path, Path],
                                              cli_index: LayerIndex) -> None:
    files = [m for m in cli_index.members if m.kind is Kind.FILE]
    expected = expected_files(cli_layer[0])
    assert len(cli_index.spans) > 10 and {m.path for m in files} == set(expected)
    with reader(cli_index, cli_layer[0]) as r:
        for member in files:
            assert r.read(member.data_offset, member.size) == expected[member.path], member.path
        assert r.decoded_spans == len(cli_index.spans)  # each span decoded once


@pytest.mark.parametrize("make", [pax_tar, gnu_tar])
def test_python_made_layers(tmp_path: Path, make: Callable[[], bytes]) -> None:
    blob = gzip_file(tmp_path / "layer.tar.gz", make())
    index = build(blob)
    expected = expected_files(blob)
    with reader(index, blob) as r:
        got = {m.path: r.read(m.data_offset, m.size) for m in index.members
               if m.kind is Kind.FILE}
    assert got == expected


def test_multi_member_gzip_and_empty_tar(tmp_path: Path) -> None:
    tar = pax_tar()
    blob = tmp_path / "multi.gz"
    blob.write_bytes(gzip.compress(tar[:3000], mtime=0) + gzip.compress(tar[3000:], mtime=0))
    index = build(blob)
    with reader(index, blob) as r:
        assert r.read(0, len(tar)) == tar
    empty = build(gzip_file(tmp_path / "empty.gz", bytes(10240)))
    assert (empty.members, empty.tar_bytes, len(empty.spans)) == ((), 10240, 1)


def test_closed_reader_refuses(cli_layer: tuple[Path, Path], cli_index: LayerIndex) -> None:
    r = reader(cli_index, cli_layer[0])
    r.close()
    with pytest.raises(ValueError, match="closed"):
        r.read(0, 10)


def test_pax_metadata(tmp_path: Path) -> None:
    index = build(gzip_file(tmp_path / "layer.tar.gz", pax_tar()))
    by_path = {m.path: m for m in index.members}
    conf = by_path["etc/conf"]
    assert conf.mtime_ns == 1_700_000_000_123_456_789
    assert dict(conf.xattrs) == {"user.origin": b"bootseer", "security.capability": b"\1\2"}
    assert by_path["dev/null"].kind is Kind.DEVICE
    assert (by_path["etc/conf.hard"].kind, by_path["etc/conf.hard"].target) == \
        (Kind.HARDLINK, "etc/conf")
    assert by_path["deep/" + "n" * 200 + "/name.txt"].size == 10


def test_toc_matches_tarfile(cli_layer: tuple[Path, Path], cli_index: LayerIndex) -> None:
    with tarfile.open(cli_layer[1]) as tar:
        infos = tar.getmembers()
    assert len(infos) == len(cli_index.members)
    kinds = {"link": Kind.SYMLINK, "hard": Kind.HARDLINK, "fifo": Kind.DEVICE, ".": Kind.DIR}
    for info, member in zip(infos, cli_index.members, strict=True):
        assert member.path == (info.name.removeprefix("./") or ".")
        assert (member.mode, member.uid, member.gid) == (info.mode, info.uid, info.gid)
        assert member.mtime_ns // 10**9 == int(info.mtime)
        if info.isreg():
            assert (member.kind, member.size, member.data_offset) == \
                (Kind.FILE, info.size, info.offset_data)
        else:
            assert member.kind is kinds.get(member.path, Kind.DIR)
    by_path = {m.path: m for m in cli_index.members}
    assert by_path["link"].target == "dir0/file0.txt"
    assert by_path["hard"].target == "dir1/file1.txt"
    assert by_path["dir3/file3.txt"].mode == 0o4755


def test_entries_build_a_tree(cli_index: LayerIndex) -> None:
    tree = build_tree([cli_index.layer("c1-layer")])
    node = tree.resolve("big/random1.bin")
    assert node is not None and node.size == 3 * MiB
    assert tree.contents() == ["c1-layer"]
    hard, target = tree.resolve("hard"), tree.resolve("dir1/file1.txt")
    assert hard is not None and target is not None and hard.inode == target.inode
    assert tree.resolve("fifo") is None


def test_reads_cross_span_boundaries(cli_layer: tuple[Path, Path],
                                     cli_index: LayerIndex) -> None:
    tar = cli_layer[1].read_bytes()
    with reader(cli_index, cli_layer[0], cache_bytes=1) as r:
        for span in cli_index.spans[1:]:
            at = span.tar_offset
            assert r.read(at - 100, 200) == tar[at - 100:at + 100]
        assert r.read(0, len(tar) + 10) == tar  # every span, clipped at the end
        assert r.read(len(tar) - 5, 100) == tar[-5:]
        assert r.read(len(tar), 10) == b""


def test_cache_bounded(cli_layer: tuple[Path, Path], cli_index: LayerIndex) -> None:
    with reader(cli_index, cli_layer[0], cache_bytes=2 * MiB) as r:
        for _ in range(2):
            for span in cli_index.spans:
                r.read(span.tar_offset, 1)
        assert r.decoded_spans == 2 * len(cli_index.spans)  # a span or two fit, not all


def test_kept_spans_stay_until_shrunk(cli_layer: tuple[Path, Path],
                                      cli_index: LayerIndex) -> None:
    spans = range(len(cli_index.spans))
    with reader(cli_index, cli_layer[0], cache_bytes=1) as r:
        kept = sum(r.keep(span) for span in spans)
        assert kept == cli_index.tar_bytes and r.decoded_spans == len(spans)
        assert r.keep(0) == 0  # already there: nothing decoded twice
        for span in spans:
            r.read(cli_index.spans[span].tar_offset, 1)
        assert r.decoded_spans == len(spans)  # every read found its span decoded
        r.shrink(1)
        r.read(cli_index.spans[0].tar_offset, 1)
        assert r.decoded_spans == len(spans) + 1  # the cache is back to one span


def test_spans_reading_are_those_whose_chunks_were_all_read(cli_index: LayerIndex) -> None:
    chunk = 64 * 1024
    ranges = [cli_index.span_blob_range(s) for s in range(len(cli_index.spans))]
    needs = [range(a // chunk, (b - 1) // chunk + 1) for a, b in ranges]
    assert len(cli_index.spans) >= 4
    want = [3, 1]  # a launch read span 3, then span 1
    rank = {c: i for i, span in enumerate(want) for c in reversed(needs[span])}
    got = cli_index.spans_reading(chunk, rank)
    assert got == sorted(got)
    ranks = {span: r for r, span in got}
    assert ranks[3] < ranks[1]  # in the launch's order
    for _, span in got:  # nothing listed whose decode reads a chunk the launch did not
        assert all(c in rank for c in needs[span])
    assert cli_index.spans_reading(chunk, {}) == []


def test_threads_read_the_same_bytes(cli_layer: tuple[Path, Path],
                                     cli_index: LayerIndex) -> None:
    tar = cli_layer[1].read_bytes()
    faults: list[str] = []

    def work(seed: int, r: LayerReader) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            at, n = rng.randrange(len(tar)), rng.randrange(1, 300_000)
            if r.read(at, n) != tar[at:at + n]:
                faults.append(f"{at}+{n}")

    with reader(cli_index, cli_layer[0], cache_bytes=4 * MiB) as r:
        threads = [threading.Thread(target=work, args=(seed, r)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert faults == []


class CountingFile(io.RawIOBase):
    """A plain file that logs the byte ranges read from it."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._file: BinaryIO = path.open("rb")
        self.reads: list[tuple[int, int]] = []

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def readinto(self, buffer: Any) -> int:
        at = self._file.tell()
        n = self._file.readinto(buffer)  # type: ignore[attr-defined]
        self.reads.append((at, at + n))
        return int(n)

    def close(self) -> None:
        self._file.close()
        super().close()


def test_compressed_range_covers_every_read(cli_layer: tuple[Path, Path],
                                            cli_index: LayerIndex) -> None:
    counting = CountingFile(cli_layer[0])
    rng = random.Random(7)
    tar_bytes = cli_index.tar_bytes
    with LayerReader(cli_index, lambda: counting, cache_bytes=1) as r:
        assert all(end <= HEADER_BYTES for _, end in counting.reads)
        ranges = [(m.data_offset, m.size) for m in cli_index.members if m.size][::7]
        ranges += [(s.tar_offset - 10, 20) for s in cli_index.spans[1:]]
        ranges += [(rng.randrange(tar_bytes), rng.randrange(1, 3 * MiB)) for _ in range(30)]
        read_bytes = 0
        for at, n in ranges:
            counting.reads.clear()
            r.read(at, n)
            start, end = r.compressed_range(at, n)
            assert all(start <= a and b <= end for a, b in counting.reads), (at, n)
            read_bytes += sum(b - a for a, b in counting.reads)
        assert read_bytes > cli_index.blob_bytes  # the reads did decode


# ---- the index file ------------------------------------------------------------------


def test_round_trip_and_determinism(cli_layer: tuple[Path, Path],
                                    cli_index: LayerIndex) -> None:
    data = cli_index.to_bytes()
    assert LayerIndex.from_bytes(data, "test index", cli_index.layer_digest) == cli_index
    assert build(cli_layer[0]).to_bytes() == data


def test_index_is_small(cli_layer: tuple[Path, Path], cli_index: LayerIndex) -> None:
    toc = msgpack.packb(msgpack.unpackb(cli_index.to_bytes())["toc"])
    assert len(toc) < 30 * len(cli_index.members)
    assert len(cli_index.to_bytes()) < 0.02 * cli_layer[0].stat().st_size


def tampered(data: bytes, **changes: Any) -> bytes:
    raw = msgpack.unpackb(data)
    raw.update(changes)
    return msgpack.packb(raw)


def test_tampered_index_is_refused(cli_index: LayerIndex) -> None:
    data = cli_index.to_bytes()
    raw = msgpack.unpackb(data)
    starts, bits = raw["span_tar_offsets"], raw["span_blob_bits"]
    bad = [data[:len(data) // 2], data[:-1], data + b"\0", b"", b"\xc1", msgpack.packb([1]),
           tampered(data, version=2), tampered(data, layer="sha256:" + "0" * 63),
           tampered(data, tar_bytes=-1), tampered(data, span_sha256=raw["span_sha256"][:-1]),
           tampered(data, span_tar_offsets=[starts[1], *starts[1:]]),
           tampered(data, span_blob_bits=[*bits[:-1], 8 * raw["blob_bytes"]]),
           tampered(data, span_tar_offsets=[0, 10**9, *starts[2:]]),
           tampered(data, toc={**raw["toc"], "kind": raw["toc"]["kind"][:-1]}),
           tampered(data, toc={**raw["toc"], "path_keep": [10**6] * len(raw["toc"]["kind"])}),
           tampered(data, toc={**raw["toc"], "gap_blocks": [10**9] * len(raw["toc"]["size"])}),
           tampered(data, toc={**raw["toc"], "uid": [[0], [-1]]}), tampered(data, zran=None)]
    for i, blob in enumerate(bad):
        with pytest.raises(LayerError, match="test index"):
            LayerIndex.from_bytes(blob, "test index")
            pytest.fail(f"tampered index {i} was accepted")
    with pytest.raises(LayerError, match="not sha256"):
        LayerIndex.from_bytes(data, "test index", "sha256:" + "0" * 64)


def test_flipped_span_digest_fails_the_read(cli_layer: tuple[Path, Path],
                                            cli_index: LayerIndex) -> None:
    raw = msgpack.unpackb(cli_index.to_bytes())
    digests = bytearray(raw["span_sha256"])
    digests[3 * 32 + 5] ^= 1
    index = LayerIndex.from_bytes(tampered(cli_index.to_bytes(), span_sha256=bytes(digests)),
                                  "test index")
    with reader(index, cli_layer[0]) as r:
        assert r.read(0, 100) == cli_layer[1].read_bytes()[:100]
        with pytest.raises(LayerError, match=rf"{index.layer_digest}: span 3 .*sha256"):
            r.read(index.spans[3].tar_offset, 1)


def test_zran_of_another_layer_is_refused(tmp_path: Path, cli_layer: tuple[Path, Path],
                                          cli_index: LayerIndex) -> None:
    other = build(gzip_file(tmp_path / "other.tar.gz", pax_tar()))
    index = LayerIndex.from_bytes(tampered(cli_index.to_bytes(), zran=other.zran), "x")
    with pytest.raises(LayerError, match="zran index"):
        reader(index, cli_layer[0])


def test_corrupt_compressed_byte_fails_its_span(tmp_path: Path, cli_layer: tuple[Path, Path],
                                                cli_index: LayerIndex) -> None:
    good = cli_layer[0].read_bytes()
    tar = cli_layer[1].read_bytes()
    for n, span in enumerate(cli_index.spans[1:-1:3]):
        bad = bytearray(good)
        bad[span.blob_bit // 8 + 20_000] ^= 0x40
        path = tmp_path / f"bad{n}.gz"
        path.write_bytes(bad)
        opened = [path, cli_layer[0]]  # the first open sees the corrupt copy, a reopen the good
        with LayerReader(cli_index, lambda opened=opened: opened.pop(0).open("rb")) as r:
            with pytest.raises(LayerError, match=rf"{cli_index.layer_digest}: span \d+"):
                r.read(span.tar_offset, 300_000)
            assert r.read(span.tar_offset, 300_000) == tar[span.tar_offset:][:300_000]


# ---- bad layers ----------------------------------------------------------------------


def raises_naming_layer(blob: Path, match: str) -> LayerError:
    digest = digest_of(blob)
    with pytest.raises(LayerError, match=match) as caught:
        build(blob)
    assert digest in str(caught.value)
    return caught.value


def test_wrong_digest(cli_layer: tuple[Path, Path]) -> None:
    wanted = "sha256:" + "a" * 64
    with cli_layer[0].open("rb") as blob, pytest.raises(LayerError, match=f"{wanted}: the blob"):
        build_index(blob, wanted)


@pytest.mark.parametrize("cut", [0.5, -8, -1])
def test_truncated_gzip(tmp_path: Path, cli_layer: tuple[Path, Path], cut: float) -> None:
    data = cli_layer[0].read_bytes()
    blob = tmp_path / "cut.gz"
    blob.write_bytes(data[:int(len(data) * cut) if cut > 0 else int(cut)])
    raises_naming_layer(blob, "truncated|corrupt|gzip")


def test_corrupt_gzip(tmp_path: Path, cli_layer: tuple[Path, Path]) -> None:
    data = bytearray(cli_layer[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    data[-5] ^= 0xFF  # the CRC too, in case the flip lands in stored bytes
    blob = tmp_path / "flip.gz"
    blob.write_bytes(data)
    raises_naming_layer(blob, "gzip|tar")


def test_not_gzip(tmp_path: Path) -> None:
    blob = tmp_path / "junk"
    blob.write_bytes(random.Random(3).randbytes(5000))
    raises_naming_layer(blob, "gzip")


def test_truncated_tar(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        add_file(tar, "small", b"s" * 100)
        add_file(tar, "large", b"l" * 20_000)
    data = out.getvalue()
    members_end = -(-len(data.rstrip(b"\0")) // 512) * 512
    for cut, match in [(1024 + 5000, "in or after member 'large': corrupt or truncated tar"),
                       (1024 + 100, "member 'small'.*(truncated|corrupt header)"),
                       (members_end, "after member 'large': .*no end-of-archive marker")]:
        raises_naming_layer(gzip_file(tmp_path / "t.gz", data[:cut]), match)


def test_corrupt_tar_header(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(5):
            add_file(tar, f"f{i}", b"data %d\n" % i)
    data = bytearray(out.getvalue())
    data[3 * 1024 + 10] ^= 0x20  # the name in member f3's header: its checksum fails
    raises_naming_layer(gzip_file(tmp_path / "t.gz", bytes(data)),
                        "after member 'f2'.*corrupt header")


def test_empty_gzip_is_no_tar(tmp_path: Path) -> None:
    raises_naming_layer(gzip_file(tmp_path / "empty.gz", b""), "tar")


def test_sparse_member(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    with (root / "holes").open("wb") as f:
        f.seek(4 * MiB)
        f.write(b"end")
    tar = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "--format=gnu", "-C", str(root), "-cf", str(tar),
                    "holes"], check=True)
    raises_naming_layer(gzip_file(tmp_path / "s.gz", tar.read_bytes()), "'holes'.*sparse")


def test_unsupported_member_type(tmp_path: Path) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        label = tarfile.TarInfo("volume")
        label.type = b"V"  # a GNU volume label
        tar.addfile(label)
    raises_naming_layer(gzip_file(tmp_path / "v.gz", out.getvalue()), "'volume'.*unsupported")


@pytest.mark.parametrize("names, match", [(["/etc/passwd"], "absolute"),
                                          (["a/../../etc"], r"'\.\.'"),
                                          (["a", "./a"], "listed twice")])
def test_unsafe_paths_reach_build_tree(tmp_path: Path, names: list[str], match: str) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            add_file(tar, name, b"x")
    blob = gzip_file(tmp_path / "p.gz", out.getvalue())
    index = build(blob)
    assert [m.path for m in index.members] == [n.removeprefix("./") for n in names]
    with pytest.raises(TreeError, match=match) as caught:
        build_tree([index.layer("c1-x")])
    assert index.layer_digest in str(caught.value)


def test_a_plain_tar_layer_is_indexed_without_spans(tmp_path: Path) -> None:
    members = {"a.txt": b"alpha\n" * 100, "dir/b.bin": os.urandom(3 * 1024 * 1024 + 7)}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    blob = buf.getvalue()
    digest = "sha256:" + hashlib.sha256(blob).hexdigest()
    index = build_index(io.BytesIO(blob), digest, compressed=False)
    assert not index.compressed and index.spans == () and index.tar_bytes == len(blob)
    for entry in index.entries("c1-" + "0" * 64):
        if entry.path in members:
            (extent,) = entry.extents
            assert blob[extent.offset:extent.offset + extent.length] == members[entry.path]
    assert index.compressed_range(10, 100) == (10, 110)
    again = LayerIndex.from_bytes(index.to_bytes(), "plain", digest)
    assert again == index
    with pytest.raises(LayerError, match="digest"):
        build_index(io.BytesIO(blob), "sha256:" + "0" * 64, compressed=False)
    with pytest.raises(LayerError, match=r"truncated|corrupt"):
        cut = blob[:len(blob) // 2]
        build_index(io.BytesIO(cut), "sha256:" + hashlib.sha256(cut).hexdigest(),
                    compressed=False)
