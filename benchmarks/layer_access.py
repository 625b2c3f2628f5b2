"""Random access into one gzip image layer: a zran index over the original bytes
against a re-encoded seekable copy, with a full extract as the baseline.

Given a layer as registries store it (a tar compressed with gzip), it measures:

- the layer: compressed and uncompressed bytes, sha256 of both (digest and
  diff_id), entries, and the tar table of contents (member -> offset of its data
  in the uncompressed stream, size, type) that every option needs;
- option A, zran (as AWS SOCI): access points about every SPAN uncompressed
  bytes over the untouched gzip, built twice, each in one pass that also reads
  the TOC: by indexed_gzip (its format: a raw 32 KiB window per point; also
  measured zstd-compressed) and by rapidgzip (`chunk_size=SPAN`, gztool format:
  compressed sparse windows). Cold reads of sampled files from the nearest
  point: indexed_gzip `pread` (it restarts at the point on every call) and
  rapidgzip on a fresh reader per read (opening it is timed apart), then on one
  long-lived reader whose chunk cache is on, as a FUSE server would hold it;
  sequential reads of 1 MiB and of 128 KiB (the kernel's default FUSE read);
- option B, converted (as eStargz, zstd:chunked, Nydus): the same tar stream cut
  into independent frames, gzip members or zstd frames, either one per tar entry
  (big entries split at CHUNK) or every CHUNK bytes; conversion time, size
  against the original, the same cold reads, done in Python with zlib or
  zstandard. The uncompressed stream stays byte-identical (the diff_id does not
  change; the compressed digest does), checked by piping each copy through
  `gzip -dc` / `zstd -dc`, the tools a runtime uses;
- for every option: whole-layer sequential decode from Python (1 MiB reads), and
  which 4 MiB chunks of the compressed blob a read needs (what a lazy node must
  fetch from the swarm before it can answer), for the sample and for the
  startup set `--hot` (absolute paths, in first-access order, e.g. from strace);
- baseline: `gzip -dc LAYER | tar -x` into a scratch directory.

Times are wall seconds on a shared machine; CPU seconds (user + system of this
process, or of the children for the command-line tools) move less with load.
MB = 1e6 bytes. Only one heavy step runs at a time. Prints one JSON line.

    python layer_access.py LAYER.tar.gz [--spans 1,4,8] [--chunks 1,4] [--files 200]
                           [--hot PATHS] [--seed 1] [--workdir DIR] [--no-extract]
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import io
import json
import os
import posixpath
import random
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import indexed_gzip.indexed_gzip as igz
import rapidgzip
import zstandard

from p2p.units import MiB

MB = 1e6
READ_BYTES = 1 * MiB
RAPIDGZIP_CHUNK = 4 * MiB  # rapidgzip's default chunk_size
FUSE_READ_BYTES = 128 * 1024  # what the kernel sends a FUSE server by default
SMALL_READS_BYTES = 32 * MiB  # how far the 128 KiB-read runs go: slow ones are very slow
STORE_CHUNK = 4 * MiB  # the agent's default chunk: the unit fetched from peers
GZIP_LEVEL = 6
ZSTD_LEVEL = 3
MAX_LINKS = 40


@dataclass(frozen=True, slots=True)
class Member:
    name: str
    kind: str  # "file", "dir", "symlink", "hardlink", "other"
    offset: int  # of the data in the uncompressed stream
    size: int
    header: int  # offset of the first header block of the entry
    link: str


@dataclass(frozen=True, slots=True)
class Frame:
    raw_offset: int
    raw_size: int
    offset: int  # in the compressed blob
    size: int


@dataclass(frozen=True, slots=True)
class Span:
    """What one read costs: bytes decoded and the compressed range it needs."""

    decoded: int
    start: int
    end: int


class Clock:
    """Wall and CPU seconds of a block: this process, or its finished children."""

    def __init__(self, children: bool = False) -> None:
        self._who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF

    def _cpu(self) -> float:
        usage = resource.getrusage(self._who)
        return usage.ru_utime + usage.ru_stime

    def __enter__(self) -> Self:
        self.wall, self.cpu = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *_: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, self._cpu() - self.cpu


Timing = tuple[float, float]  # wall seconds, CPU seconds


def timed(action: Callable[[], bytes], size: int) -> Timing:
    wall, cpu = time.perf_counter(), time.process_time()
    data = action()
    timing = (time.perf_counter() - wall, time.process_time() - cpu)
    assert len(data) == size, (len(data), size)
    return timing


def say(text: str) -> None:
    if sys.stderr.isatty():
        print(f"  {text}", file=sys.stderr, flush=True)


# -- the layer and its table of contents ---------------------------------------------

def kind_of(info: tarfile.TarInfo) -> str:
    if info.isreg():
        return "file"
    if info.isdir():
        return "dir"
    if info.issym():
        return "symlink"
    return "hardlink" if info.islnk() else "other"


def read_toc(stream: object) -> list[Member]:
    with tarfile.open(fileobj=stream, mode="r:") as tar:  # type: ignore[call-overload]
        return [Member(clean(i.name), kind_of(i),
                       i.offset_data, i.size, i.offset, i.linkname) for i in tar]


def gunzip_all(path: Path) -> tuple[bytes, Clock]:
    """The uncompressed tar in memory, decoded with zlib in 1 MiB reads."""
    parts, inflater = [], zlib.decompressobj(wbits=31)
    with open(path, "rb") as f, Clock() as clock:
        while block := f.read(READ_BYTES):
            parts.append(inflater.decompress(block))
            while inflater.eof and inflater.unused_data:  # a multi-member gzip
                rest, inflater = inflater.unused_data, zlib.decompressobj(wbits=31)
                parts.append(inflater.decompress(rest))
        data = b"".join(parts)
    return data, clock


def clean(name: str) -> str:
    return posixpath.normpath(name).lstrip("/")


def resolve(path: str, by_name: dict[str, Member]) -> Member | None:
    """Follow symlinks (and a final hard link) inside the layer to a regular file."""
    parts, done, hops = [p for p in path.split("/") if p not in ("", ".")], "", 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            done = posixpath.dirname(done)
            continue
        here = posixpath.join(done, part) if done else part
        member = by_name.get(here)
        if member is None or hops > MAX_LINKS:
            return None
        if member.kind == "symlink":
            hops += 1
            done = "" if member.link.startswith("/") else done
            parts = [p for p in member.link.split("/") if p not in ("", ".")] + parts
            continue
        done = here
    found = by_name.get(done)
    if found is not None and found.kind == "hardlink":
        found = by_name.get(clean(found.link))
    return found if found is not None and found.kind == "file" else None


# -- option A: access points over the original gzip -----------------------------------

def points_of(reader: igz.IndexedGzipFile) -> list[tuple[int, int]]:
    return [(int(u), int(c)) for u, c in reader.seek_points()]


def zran_build(path: Path, span: int,
               out: Path) -> tuple[list[Member], Clock, list[tuple[int, int]]]:
    """One pass: the TOC from tarfile, the access points as the pass goes by."""
    with Clock() as clock:
        reader = igz.IndexedGzipFile(str(path), spacing=span, drop_handles=False,
                                     buffer_size=READ_BYTES)
        toc = read_toc(reader)
        reader.build_full_index()
        reader.export_index(str(out))
        points = points_of(reader)
        reader.close()
    return toc, clock, points


def zran_cost(points: list[tuple[int, int]], offset: int, size: int) -> Span:
    """Decoded bytes and compressed range of a read served from the nearest point."""
    keys = [u for u, _ in points]
    at = max(bisect.bisect_right(keys, offset) - 1, 0)
    after = bisect.bisect_left(keys, offset + size)
    end = points[after][1] if after < len(points) else None
    return Span(offset + size - points[at][0], points[at][1], end if end is not None else -1)


def rapidgzip_build(path: Path, out: Path, threads: int,
                    span: int = RAPIDGZIP_CHUNK) -> tuple[Clock, list[tuple[int, int]]]:
    """rapidgzip's own pass (TOC too): points about every `span` bytes, sparse windows."""
    with Clock() as clock, rapidgzip.RapidgzipFile(
            str(path), parallelization=threads, chunk_size=span) as reader:
        read_toc(reader)
        reader.seek(0, os.SEEK_END)
        reader.export_index(str(out), index_format=rapidgzip.IndexFormat.GZTOOL)
        offsets = reader.block_offsets()  # compressed offset in bits -> uncompressed offset
    return clock, sorted((int(u), int(c) // 8) for c, u in offsets.items())


def rapidgzip_read(path: Path, index: Path, member: Member, span: int) -> tuple[float, Timing]:
    """Seconds to open a fresh reader and import the index, then the read's own timing."""
    began = time.perf_counter()
    with rapidgzip.RapidgzipFile(str(path), parallelization=1, chunk_size=span) as reader:
        reader.import_index(str(index))
        opened = time.perf_counter() - began

        def seek_read() -> bytes:
            reader.seek(member.offset)
            return bytes(reader.read(member.size))

        return opened, timed(seek_read, member.size)


# -- option B: a converted copy of independent frames ----------------------------------

def cuts(toc: list[Member], total: int, chunk: int, per_entry: bool) -> list[int]:
    """Frame starts in the uncompressed tar: at entry headers, or every `chunk` bytes."""
    if not per_entry:
        return list(range(0, total, chunk))
    heads = sorted({m.header for m in toc} | {0})
    starts: list[int] = []
    for here, after in zip(heads, [*heads[1:], total], strict=True):
        starts.extend(range(here, after, chunk))
    return starts


def gzip_frame(raw: bytes) -> bytes:
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    return packer.compress(raw) + packer.flush()


def zstd_frame(raw: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(raw)


ENCODERS: dict[str, Callable[[bytes], bytes]] = {"gzip": gzip_frame, "zstd": zstd_frame}
DECODERS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda blob: zlib.decompress(blob, wbits=31),
    "zstd": lambda blob: zstandard.ZstdDecompressor().decompress(blob),
}


def convert(path: Path, toc: list[Member], codec: str, chunk: int, per_entry: bool,
            out: Path) -> tuple[list[Frame], Clock]:
    """Decode the original, cut it, encode each frame; the TOC would ride along."""
    encode, frames, at = ENCODERS[codec], [], 0
    with Clock() as clock, open(out, "wb") as f:
        raw, _ = gunzip_all(path)
        starts = cuts(toc, len(raw), chunk, per_entry)
        for here, after in zip(starts, [*starts[1:], len(raw)], strict=True):
            blob = encode(raw[here:after])
            f.write(blob)
            frames.append(Frame(here, after - here, at, len(blob)))
            at += len(blob)
    return frames, clock


class FrameReader:
    """Reads any range of the tar stream from the frames that cover it."""

    def __init__(self, path: Path, frames: list[Frame], codec: str) -> None:
        self._fd, self._frames, self._decode = os.open(path, os.O_RDONLY), frames, DECODERS[codec]
        self._starts = [f.raw_offset for f in frames]

    def covering(self, offset: int, size: int) -> list[Frame]:
        first = bisect.bisect_right(self._starts, offset) - 1
        last = bisect.bisect_left(self._starts, offset + max(size, 1))
        return self._frames[first:last]

    def read(self, offset: int, size: int) -> bytes:
        parts = []
        for frame in self.covering(offset, size):
            raw = self._decode(os.pread(self._fd, frame.size, frame.offset))
            parts.append(raw[max(offset - frame.raw_offset, 0):offset + size - frame.raw_offset])
        return b"".join(parts)

    def cost(self, offset: int, size: int) -> Span:
        frames = self.covering(offset, size)
        end = frames[-1].offset + frames[-1].size
        return Span(sum(f.raw_size for f in frames), frames[0].offset, end)

    def close(self) -> None:
        os.close(self._fd)


def toc_bytes(toc: list[Member]) -> int:
    """The TOC as eStargz would ship it: JSON, compressed."""
    entries = [[m.name, m.kind, m.offset, m.size, m.link] for m in toc]
    return len(zstd_frame(json.dumps(entries, separators=(",", ":")).encode()))


# -- figures ------------------------------------------------------------------------

def sample(toc: list[Member], count: int, seed: int) -> list[Member]:
    """Files drawn uniformly by count, so the draw follows the layer's many small files."""
    files = sorted((m for m in toc if m.kind == "file" and m.size > 0), key=lambda m: m.offset)
    return random.Random(seed).sample(files, min(count, len(files)))


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def latency(timings: list[Timing]) -> dict[str, float]:
    walls, cpus = [w for w, _ in timings], [c for _, c in timings]
    return {"mean_ms": round(statistics.fmean(walls) * 1e3, 3),
            "p50_ms": round(statistics.median(walls) * 1e3, 3),
            "p99_ms": round(p99(walls) * 1e3, 3),
            "cpu_mean_ms": round(statistics.fmean(cpus) * 1e3, 3),
            "cpu_p99_ms": round(p99(cpus) * 1e3, 3)}


def union_bytes(spans: list[Span], blob_size: int) -> int:
    """Compressed bytes the reads need, overlaps counted once."""
    total, reach = 0, 0
    for start, end in sorted((s.start, blob_size if s.end < 0 else s.end) for s in spans):
        total += max(end - max(start, reach), 0)
        reach = max(reach, end)
    return total


def chunks_needed(spans: list[Span], blob_size: int, chunk: int = STORE_CHUNK) -> set[int]:
    needed: set[int] = set()
    for span in spans:
        end = blob_size if span.end < 0 else span.end
        needed.update(range(span.start // chunk, (end - 1) // chunk + 1))
    return needed


def fetch_mb(spans: list[Span], blob_size: int, chunk: int) -> float:
    return round(min(len(chunks_needed(spans, blob_size, chunk)) * chunk, blob_size) / MB, 1)


def read_figures(read: Callable[[Member], Timing], cost: Callable[[Member], Span],
                 files: list[Member], hot: list[Member], blob_size: int) -> dict[str, object]:
    """Cold reads of the sample, decode rate, and what the sample and hot set must fetch.

    Decoded bytes are counted the zran way (from the access point or frame start to
    the end of the file), for every reader, so the rates compare decoders.
    """
    timings = [read(m) for m in files]
    spans = [cost(m) for m in files]
    decoded = sum(s.decoded for s in spans)
    figures: dict[str, object] = {
        **latency(timings),
        "decoded_per_read_kb": round(decoded / len(files) / 1e3, 1),
        "decode_mbps": round(decoded / sum(w for w, _ in timings) / MB, 1),
        "decode_mbps_cpu": round(decoded / max(sum(c for _, c in timings), 1e-9) / MB, 1),
        "store_chunks_per_read": round(statistics.fmean(
            len(chunks_needed([s], blob_size)) for s in spans), 2),
    }
    if hot:
        hot_timings = [read(m) for m in hot]
        hot_spans = [cost(m) for m in hot]
        figures |= {
            "hot_read_s": round(sum(w for w, _ in hot_timings), 3),
            "hot_cpu_s": round(sum(c for _, c in hot_timings), 3),
            "hot_needed_mb": round(union_bytes(hot_spans, blob_size) / MB, 1),
            "hot_fetch_mb_4m": fetch_mb(hot_spans, blob_size, STORE_CHUNK),
            "hot_fetch_mb_1m": fetch_mb(hot_spans, blob_size, MiB),
        }
    return figures


def sequential(read_into: Callable[[memoryview], int], total: int,
               read_bytes: int = READ_BYTES) -> dict[str, float]:
    """Read `total` bytes from the start in `read_bytes` calls (the kernel's FUSE reads)."""
    buffer, seen = memoryview(bytearray(read_bytes)), 0
    with Clock() as clock:
        while seen < total and (got := read_into(buffer[:min(read_bytes, total - seen)])) > 0:
            seen += got
    assert seen == total, (seen, total)
    return rate(total, clock)


def rate(total: int, clock: Clock) -> dict[str, float]:
    return {"mbps": round(total / clock.wall / MB, 1), "cpu_s": round(clock.cpu, 2)}


def piped_sha256(command: list[str]) -> tuple[str, Clock]:
    digest = hashlib.sha256()
    with Clock(children=True) as clock:
        child = subprocess.Popen(command, stdout=subprocess.PIPE)
        assert child.stdout is not None
        while block := child.stdout.read(READ_BYTES):
            digest.update(block)
        assert child.wait() == 0, command
    return digest.hexdigest(), clock


def extract(path: Path, into: Path) -> Clock:
    into.mkdir()
    with Clock(children=True) as clock:
        subprocess.run(f"gzip -dc '{path}' | tar --numeric-owner -xf - -C '{into}'",
                       shell=True, check=True)
    subprocess.run(["rm", "-rf", str(into)], check=True)
    return clock


def rounded(clock: Clock) -> dict[str, float]:
    return {"s": round(clock.wall, 2), "cpu_s": round(clock.cpu, 2)}


# -- the runs -----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Layer:
    path: Path
    size: int
    raw_size: int
    toc: list[Member]
    files: list[Member]  # the sample
    hot: list[Member]  # the startup set, in first-access order


def describe(layer: Layer, digest: str, diff_id: str, zlib_clock: Clock) -> dict[str, object]:
    kinds = [m.kind for m in layer.toc]
    sizes = sorted(m.size for m in layer.files)
    return {
        "gz_bytes": layer.size, "tar_bytes": layer.raw_size,
        "ratio": round(layer.raw_size / layer.size, 2),
        "entries": len(kinds), "files": kinds.count("file"), "digest": digest, "diff_id": diff_id,
        "sample_files": len(sizes), "sample_median_bytes": statistics.median(sizes),
        "sample_max_bytes": sizes[-1], "hot_files": len(layer.hot),
        "hot_bytes": sum(m.size for m in layer.hot), "toc_bytes_zstd": toc_bytes(layer.toc),
        "zlib_seq": rate(layer.raw_size, zlib_clock),
    }


def option_a(layer: Layer, span: int, work: Path) -> dict[str, object]:
    index, gztool = work / f"zran-{span // MiB}.igz", work / f"zran-{span // MiB}.gztool"
    say(f"A: indexed_gzip and rapidgzip builds, span {span // MiB} MiB")
    _, build, points = zran_build(layer.path, span, index)
    rg_build, rg_points = rapidgzip_build(layer.path, gztool, 1, span)
    ig = igz._IndexedGzipFile(str(layer.path), drop_handles=False, index_file=str(index))

    def ig_read(member: Member) -> Timing:
        return timed(lambda: ig.pread(member.size, member.offset), member.size)

    def cost(member: Member) -> Span:
        return zran_cost(points, member.offset, member.size)

    say("A: indexed_gzip reads")
    ig_figures = read_figures(ig_read, cost, layer.files, layer.hot, layer.size)
    ig.seek(0)
    ig_figures["seq"] = sequential(ig.readinto, layer.raw_size)
    ig.seek(0)
    ig_figures["seq_128k"] = sequential(ig.readinto, SMALL_READS_BYTES, FUSE_READ_BYTES)
    ig.close()
    say("A: rapidgzip reads")
    opens: list[float] = []

    def rg_read(member: Member) -> Timing:
        opened, timing = rapidgzip_read(layer.path, gztool, member, span)
        opens.append(opened)
        return timing

    def rg_cost(member: Member) -> Span:
        return zran_cost(rg_points, member.offset, member.size)

    rg_figures = read_figures(rg_read, rg_cost, layer.files, layer.hot, layer.size)
    rg_figures |= {"points": len(rg_points), "build": rounded(rg_build),
                   "index_bytes_gztool": os.path.getsize(gztool),
                   "open_import_ms": round(statistics.median(opens) * 1e3, 2)}
    rg_figures |= rapidgzip_shared(layer, gztool, rg_cost, span)
    return {
        "span_mib": span // MiB, "points": len(points), "build": rounded(build),
        "index_bytes": os.path.getsize(index),
        "index_bytes_zstd": len(zstd_frame(index.read_bytes())),
        "indexed_gzip": ig_figures, "rapidgzip": rg_figures,
    }


def rapidgzip_shared(layer: Layer, index: Path, cost: Callable[[Member], Span],
                     span: int) -> dict[str, object]:
    """One long-lived reader, as a FUSE server keeps: its chunk cache and prefetch on."""
    with rapidgzip.RapidgzipFile(str(layer.path), parallelization=1, chunk_size=span) as reader:
        reader.import_index(str(index))

        def read(member: Member) -> Timing:
            def seek_read() -> bytes:
                reader.seek(member.offset)
                return bytes(reader.read(member.size))
            return timed(seek_read, member.size)

        shared = read_figures(read, cost, layer.files, layer.hot, layer.size)
    with rapidgzip.RapidgzipFile(str(layer.path), parallelization=1, chunk_size=span) as reader:
        reader.import_index(str(index))  # a fresh reader: nothing cached yet
        seq = sequential(reader.readinto, SMALL_READS_BYTES, FUSE_READ_BYTES)
    keep = ("mean_ms", "p99_ms", "cpu_mean_ms", "hot_read_s", "hot_cpu_s")
    return {"shared_reader": {k: shared[k] for k in keep}, "seq_128k": seq}


def rapidgzip_whole(layer: Layer, work: Path) -> dict[str, object]:
    """rapidgzip building its own index (4 MiB compressed chunks), and decoding with 1-2 threads."""
    index, figures = work / "rapidgzip.gztool", dict[str, object]()
    for threads in (1, 2):
        say(f"A: rapidgzip build and sequential, {threads} thread(s)")
        figures[f"build_p{threads}"] = rounded(rapidgzip_build(layer.path, index, threads)[0])
        with rapidgzip.RapidgzipFile(str(layer.path), parallelization=threads) as reader:
            reader.import_index(str(index))
            figures[f"seq_p{threads}"] = sequential(reader.readinto, layer.raw_size)
    figures["index_bytes_gztool"] = os.path.getsize(index)
    return figures


def option_b(layer: Layer, codec: str, chunk: int, per_entry: bool, work: Path,
             diff_id: str) -> dict[str, object]:
    name = f"{codec}-{'entry' if per_entry else 'fixed'}-{chunk // MiB}"
    copy = work / f"{name}.tar.{'gz' if codec == 'gzip' else 'zst'}"
    say(f"B: convert {name}")
    frames, clock = convert(layer.path, layer.toc, codec, chunk, per_entry, copy)
    reader = FrameReader(copy, frames, codec)

    def read(member: Member) -> Timing:
        return timed(lambda: reader.read(member.offset, member.size), member.size)

    def cost(member: Member) -> Span:
        return reader.cost(member.offset, member.size)

    figures = read_figures(read, cost, layer.files, layer.hot, os.path.getsize(copy))
    with Clock() as seq:
        seen = sum(len(reader.read(f.raw_offset, f.raw_size)) for f in frames)
    assert seen == layer.raw_size
    reader.close()
    tool = ["gzip", "-dc", str(copy)] if codec == "gzip" else ["zstd", "-dcq", str(copy)]
    same, _ = piped_sha256(tool)
    size = os.path.getsize(copy)
    copy.unlink()
    return {
        "variant": name, "frames": len(frames), "convert": rounded(clock), "bytes": size,
        "overhead_pct": round((size - layer.size) / layer.size * 100, 1),
        "toc_bytes": toc_bytes(layer.toc) + 16 * len(frames), "diff_id_same": same == diff_id,
        "reads": figures, "seq": rate(layer.raw_size, seq),
    }


def load(path: Path, files: int, seed: int,
         hot_list: Path | None) -> tuple[Layer, dict[str, object]]:
    say("layer: digest, zlib decode, TOC")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    raw, zlib_clock = gunzip_all(path)
    diff_id = hashlib.sha256(raw).hexdigest()
    toc = read_toc(io.BytesIO(raw))
    by_name = {m.name: m for m in toc}
    wanted = hot_list.read_text().split() if hot_list else []
    hot = [m for m in (resolve(p, by_name) for p in wanted) if m is not None and m.size > 0]
    hot = list({m.name: m for m in hot}.values())
    layer = Layer(path, path.stat().st_size, len(raw), toc, sample(toc, files, seed), hot)
    return layer, describe(layer, digest, diff_id, zlib_clock)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layer", type=Path, help="a gzip-compressed tar layer")
    parser.add_argument("--spans", default="1,4,8", help="option A access-point spans, MiB")
    parser.add_argument("--chunks", default="1,4", help="option B frame sizes, MiB")
    parser.add_argument("--files", type=int, default=200, help="files in the random sample")
    parser.add_argument("--hot", type=Path, help="startup paths in first-access order")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="scratch space (default: a temporary one)")
    parser.add_argument("--no-extract", action="store_true", help="skip the full-extract baseline")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, work: Path) -> dict[str, object]:
    layer, facts = load(args.layer, args.files, args.seed, args.hot)
    result: dict[str, object] = {"load_1m_start": os.getloadavg()[0], "layer": facts}
    if not args.no_extract:
        say("baseline: gzip -dc | tar -x")
        result["extract"] = rounded(extract(layer.path, work / "rootfs"))
    _, gzip_cli = piped_sha256(["gzip", "-dc", str(layer.path)])
    result["gzip_cli_seq"] = rate(layer.raw_size, gzip_cli)
    spans = [int(s) * MiB for s in args.spans.split(",")]
    result["zran"] = [option_a(layer, span, work) for span in spans]
    result["rapidgzip_native"] = rapidgzip_whole(layer, work)
    chunks = [int(c) * MiB for c in args.chunks.split(",")]
    result["converted"] = [
        option_b(layer, codec, chunk, per_entry, work, str(facts["diff_id"]))
        for codec in ("gzip", "zstd") for per_entry in (True, False) for chunk in chunks
    ]
    result["load_1m_end"] = os.getloadavg()[0]
    return result


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not args.layer.is_file():
        print(f"layer_access: no such layer file: {args.layer}", file=sys.stderr)
        return 2
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = run(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="layer-access-") as scratch:
            result = run(args, Path(scratch))
    print(json.dumps(result, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
