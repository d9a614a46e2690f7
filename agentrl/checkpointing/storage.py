"""Where a run's checkpoints and results are kept: ``run.storage`` (docs/operating.md, "Storage").

A ``Storage`` is a folder on a ``pyarrow.fs`` filesystem: a local path or a shared mount (a
plain path, or ``file://``), or a URI pyarrow understands, e.g. ``s3://bucket/prefix``. S3 takes
its endpoint and credentials from the AWS SDK's usual sources (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``~/.aws``, an instance role) on
every node that reads or writes, or from the URI itself: ``s3://KEY:SECRET@bucket/prefix?
endpoint_override=HOST:PORT&scheme=http&region=R``. It is pickled as its URI, so Ray actors
rebuild the filesystem on their own node.

Every writer (each learner rank, the driver) stages its files locally and puts them into the
storage (``upload``), hashing them as it reads them; the driver collects the parts (relative
path, size, sha256) and writes ``manifest.json`` last (``write_manifest``). A folder is complete
when its manifest exists and every part it lists exists with its size (``complete``); readers
check every part's sha256 too (``download``, ``verify``), and a mismatch is a ``ChecksumError``
naming the part.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs as pafs

from agentrl.common.files import atomic_write, fsync_path

MANIFEST = "manifest.json"
CHUNK = 8 << 20


class ChecksumError(ValueError):
    """A part whose size or sha256 is not the one its manifest lists."""


class Storage:
    """A folder on a pyarrow filesystem, named by a local path or a URI (see the module docstring)."""

    def __init__(self, uri: str | Path):
        self.uri = str(uri)
        if "://" in self.uri:
            self.fs, root = pafs.FileSystem.from_uri(self.uri)
        else:
            self.fs, root = pafs.LocalFileSystem(), os.path.abspath(self.uri)
        self.root = root.rstrip("/") or "/"

    def __reduce__(self):
        return Storage, (self.uri,)

    def __str__(self) -> str:  # credentials in the URI are not printed
        parts = urlsplit(self.uri)
        if "://" not in self.uri or "@" not in parts.netloc:
            return self.uri
        return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2], query=""))

    def child(self, name: str) -> Storage:
        if "://" not in self.uri:
            return Storage(os.path.join(self.uri, name))
        parts = urlsplit(self.uri)
        return Storage(urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + name)))

    @property
    def local(self) -> bool:
        """On this node's filesystem (a local path or a mount): readable in place."""
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, rel: str = "") -> str:
        return f"{self.root}/{rel}" if rel else self.root

    # ---------------------------------------------------------------- writing
    def upload(self, local_dir: str | Path, sub: str = "", move: bool = False) -> list[dict]:
        """Put every file under ``local_dir`` at ``sub/<its relative path>``; returns the parts
        (path relative to this folder, size, sha256 of what was read). ``move``: on a local
        filesystem, rename instead of copying where possible."""
        parts = []
        for src in sorted(p for p in Path(local_dir).rglob("*") if p.is_file()):
            rel = "/".join(filter(None, [sub.strip("/"), src.relative_to(local_dir).as_posix()]))
            parts.append({"path": rel, **self._put(src, self.path(rel), move)})
        return parts

    def _put(self, src: Path, dst: str, move: bool) -> dict:
        h, size = hashlib.sha256(), 0
        if self.local:
            Path(dst).parent.mkdir(parents=True, exist_ok=True)
            if move:
                size, sha = _sha_file(src)
                try:
                    os.replace(src, dst)
                except OSError:  # another filesystem
                    shutil.copyfile(src, dst)
                fsync_path(dst)
                return {"size": size, "sha256": sha}
        with open(src, "rb") as fin, self._output(dst) as fout:
            while chunk := fin.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
                fout.write(chunk)
            if self.local:
                fout.flush()
                os.fsync(fout.fileno())
        return {"size": size, "sha256": h.hexdigest()}

    def _output(self, dst: str):
        return open(dst, "wb") if self.local else self.fs.open_output_stream(dst)

    def put_file(self, src: str | Path, rel: str) -> None:
        self._put(Path(src), self.path(rel), move=False)

    def write_bytes(self, rel: str, data: bytes) -> None:
        """``rel`` holds ``data`` or what it held before (local: ``atomic_write``; an object
        store's PUT is atomic)."""
        if not self.local:
            with self.fs.open_output_stream(self.path(rel)) as out:
                out.write(data)
            return
        dst = Path(self.path(rel))
        dst.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(dst, data)

    def write_manifest(self, parts: list[dict], **meta) -> dict:
        """Write ``manifest.json`` listing ``parts``, after checking that every one is in place
        with its size (a part a writer put elsewhere, e.g. on its own node's disk, is an error)."""
        paths = [p["path"] for p in parts]
        if twice := sorted({p for p in paths if paths.count(p) > 1}):
            raise RuntimeError(f"{self}: parts written by more than one writer: {', '.join(twice)}")
        if missing := self.missing(parts):
            raise RuntimeError(f"{self}: parts not in place after their writers put them there: {', '.join(missing)} "
                               "(a writer on another node wrote to its own disk? set run.storage to a shared mount "
                               "or an object store)")
        manifest = {"format": 1, **meta, "time": time.time(), "parts": sorted(parts, key=lambda p: p["path"])}
        self.write_bytes(MANIFEST, json.dumps(manifest, indent=1).encode())
        return manifest

    def delete(self, rel: str = "") -> None:
        """Delete ``rel`` (a folder: its manifest first, so it is never complete while half gone)."""
        target = self.path(rel)
        info = self.fs.get_file_info(target)
        if info.type == pafs.FileType.File:
            self.fs.delete_file(target)
        elif info.type == pafs.FileType.Directory:
            manifest = self.fs.get_file_info(f"{target}/{MANIFEST}")
            if manifest.type == pafs.FileType.File:
                self.fs.delete_file(manifest.path)
            self.fs.delete_dir(target)

    # ---------------------------------------------------------------- reading
    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self.path(rel)) as fh:
                return fh.read()
        except (FileNotFoundError, IsADirectoryError):
            return None

    def manifest(self) -> dict | None:
        data = self.read_bytes(MANIFEST)
        try:
            return json.loads(data) if data is not None else None
        except ValueError:
            return None

    def sizes(self) -> dict[str, int]:
        """Every file under this folder: relative path -> size (one listing)."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True, allow_not_found=True))
        return {i.path[len(self.root) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}

    def missing(self, parts: list[dict]) -> list[str]:
        """The parts that are not here with their size."""
        sizes = self.sizes()
        return [p["path"] for p in parts if sizes.get(p["path"]) != p["size"]]

    def complete(self) -> dict | None:
        """The manifest, when it exists and every part it lists is here with its size; else None."""
        manifest = self.manifest()
        if not isinstance(manifest, dict) or not isinstance(manifest.get("parts"), list) or self.missing(manifest["parts"]):
            return None
        return manifest

    def download(self, parts: list[dict], local_dir: str | Path) -> None:
        """Copy ``parts`` into ``local_dir`` (same relative paths), checking size and sha256."""
        for part in parts:
            dst = Path(local_dir) / part["path"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            h, size = hashlib.sha256(), 0
            with self.fs.open_input_stream(self.path(part["path"])) as fin, open(dst, "wb") as fout:
                while chunk := fin.read(CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    fout.write(chunk)
            self._check(part, size, h.hexdigest())

    def verify(self, parts: list[dict]) -> None:
        """Check the parts' sizes and sha256 in place (a local folder)."""
        for part in parts:
            self._check(part, *_sha_file(self.path(part["path"])))

    def _check(self, part: dict, size: int, sha: str) -> None:
        if size != part["size"] or sha != part["sha256"]:
            raise ChecksumError(f"{self}/{part['path']}: {size} bytes with sha256 {sha[:16]}, but the manifest lists "
                                f"{part['size']} bytes with sha256 {part['sha256'][:16]}: the part is corrupt")

    # ---------------------------------------------------------------- numbered folders (checkpoints)
    def numbered(self, prefix: str) -> list[int]:
        """The k of every ``<prefix><k>`` folder here, ascending."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        names = [i.base_name for i in infos if i.type == pafs.FileType.Directory and i.base_name.startswith(prefix)]
        return sorted(int(n[len(prefix):]) for n in names if n[len(prefix):].isdigit())

    def complete_numbered(self, prefix: str) -> list[int]:
        return [k for k in self.numbered(prefix) if self.child(f"{prefix}{k}").complete() is not None]

    def prune(self, prefix: str, keep: int, complete: list[int] | None = None) -> list[int]:
        """Delete all but the newest ``keep`` complete ``<prefix><k>`` folders (0: keep them all),
        and every incomplete one older than the newest complete one (left by a writer that died);
        returns the deleted k."""
        complete = self.complete_numbered(prefix) if complete is None else complete
        if not complete:
            return []
        kept = set(complete[-keep:] if keep else complete)
        old = [k for k in self.numbered(prefix) if k < complete[-1] and k not in kept]
        for k in old:
            self.delete(f"{prefix}{k}")
        return old


def _sha_file(path: str | Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()
