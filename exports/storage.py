"""Export objects in the "exports" storage (Django's storage API, ``STORAGES["exports"]``).

Keys are derived from the export id, so every attempt of one export aims at one final
object. An attempt writes a temporary object under ``tmp/<export id>/``; publishing makes
the final key appear complete or not at all, and never replaces an existing object:

- a local file system (any storage with ``path()``): the temporary file is written with
  ``O_EXCL``, fsynced, then hard-linked to the final name (``link`` fails if the name
  exists: a conditional put) and the directory is fsynced. A crash leaves either no final
  object or a complete one.
- other storages (S3 through django-storages): the final object is written from the
  temporary one only when it does not exist yet; an S3 PUT or completed multipart upload
  is atomic, so readers never see a partial object. The operations ledger (one publish
  operation per export, fenced by the lease) is what keeps two attempts from racing here.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
from dataclasses import dataclass
from typing import IO, cast

from django.core.files.storage import Storage, storages

DIGEST_CHUNK = 1024 * 1024


class ObjectExists(Exception):
    """The final key already holds an object; publishing never replaces one."""


class ObjectMissing(Exception):
    """The key holds no object (it was never written, or storage lost or deleted it)."""


@dataclass(frozen=True)
class Digest:
    sha256: str
    size: int


def output_key_for(export_id: int) -> str:
    return f"exports/{export_id}/export-{export_id}.csv"


def temp_prefix_for(export_id: int) -> str:
    return f"tmp/{export_id}"


def temp_key_for(export_id: int, lease_token: int) -> str:
    # The lease token names the attempt; the random part keeps a re-run of the same attempt apart.
    return f"{temp_prefix_for(export_id)}/{lease_token}-{secrets.token_hex(4)}.csv.part"


class ExportStore:
    """The few object operations an export needs, on top of one Django storage."""

    def __init__(self, storage: Storage | None = None) -> None:
        self.storage = storage if storage is not None else storages["exports"]
        try:
            self.storage.path("probe")
            self.local = True
        except NotImplementedError:
            self.local = False

    # -- writing -------------------------------------------------------------------------
    def open_temp(self, key: str) -> IO[bytes]:
        """A new temporary object for writing; never an existing one."""
        if not self.local:
            return cast(IO[bytes], self.storage.open(key, "wb"))
        path = self.storage.path(key)
        _private_dirs(os.path.dirname(path))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        # Buffered: a write either lands whole or raises (a raw write may stop short on ENOSPC).
        return os.fdopen(fd, "wb")

    def seal(self, handle: IO[bytes]) -> None:
        """Make the written bytes durable before anything refers to them."""
        if self.local:
            handle.flush()
            os.fsync(handle.fileno())
        handle.close()

    def publish(self, temp_key: str, final_key: str) -> None:
        """Make ``final_key`` hold the temporary object's bytes, atomically; ObjectExists if it is taken."""
        if self.local:
            temp_path, final_path = self.storage.path(temp_key), self.storage.path(final_key)
            _private_dirs(os.path.dirname(final_path))
            try:
                os.link(temp_path, final_path)
            except FileExistsError:
                raise ObjectExists(final_key) from None
            _fsync_directory(os.path.dirname(final_path))
            self.delete(temp_key)
            return
        if self.storage.exists(final_key):
            raise ObjectExists(final_key)
        with self.storage.open(temp_key, "rb") as source:
            saved = self.storage.save(final_key, source)
        if saved != final_key:
            # The backend chose another name rather than overwrite (a concurrent writer won).
            self.storage.delete(saved)
            raise ObjectExists(final_key)
        self.delete(temp_key)

    # -- reading and cleaning --------------------------------------------------------------
    def digest(self, key: str) -> Digest | None:
        """sha256 and size of an object, or None if there is none."""
        hasher = hashlib.sha256()
        size = 0
        try:
            handle = self.storage.open(key, "rb")
        except FileNotFoundError:
            return None
        with handle:
            while chunk := handle.read(DIGEST_CHUNK):
                hasher.update(chunk)
                size += len(chunk)
        return Digest(sha256=hasher.hexdigest(), size=size)

    def exists(self, key: str) -> bool:
        return self.storage.exists(key)

    def delete(self, key: str) -> None:
        try:
            self.storage.delete(key)
        except FileNotFoundError:
            pass

    def temp_keys(self, export_id: int) -> list[str]:
        prefix = temp_prefix_for(export_id)
        try:
            _, files = self.storage.listdir(prefix)
        except FileNotFoundError:
            return []
        return [f"{prefix}/{name}" for name in files]

    def open_final(self, key: str) -> IO[bytes]:
        """The published object, open for reading; ObjectMissing when storage no longer has it."""
        if not self.local and not self.storage.exists(key):
            # A remote storage's open() is lazy (S3 fetches on the first read, in the middle of
            # the response): ask first, so a missing object is an answer, not a broken download.
            raise ObjectMissing(key)
        try:
            return cast(IO[bytes], self.storage.open(key, "rb"))
        except FileNotFoundError:
            raise ObjectMissing(key) from None


def _private_dirs(path: str) -> None:
    """Create missing folders owner-only at every level (makedirs applies its mode to the last one)."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass  # created meanwhile by a concurrent attempt


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems cannot fsync a directory; the link is still atomic
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)
