"""Files written in a folder that others may be able to write: exclusively, never through a link.

:func:`open_own` opens a file to write in it, :func:`create_beside` makes a temporary one under a
name nobody can guess, :func:`write_atomically` replaces a file through one.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path


# How a file is opened for writing in a run folder: never through a link, never held by a child
# process, never waiting on a FIFO planted in its place (a regular file ignores O_NONBLOCK).
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # with open_own: made here and now, or not at all
OWN_TRIES = 8  # names open_own removes in a row before it gives up (someone keeps planting them)


def open_own(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """A descriptor on ``path`` opened with ``flags``, never through a link: a symbolic link, a
    file that is not regular, another user's file or a file with a second name (a hard link to
    one elsewhere) found at ``path`` was planted there, and is removed and the file made anew,
    exclusively. With ``O_EXCL`` in ``flags`` a name found there at all is removed first.

    A run folder is its user's (:data:`launcher.records.folder.FOLDER_MODE`), so the user may
    remove any name in it."""
    for _ in range(OWN_TRIES):
        try:
            fd = os.open(path, flags | _NO_LINK, mode)
        except FileExistsError:
            pass
        except OSError as exc:
            # ELOOP: a symbolic link; ENXIO: a FIFO nobody reads; EISDIR: a folder (left as it is).
            if exc.errno not in (errno.ELOOP, errno.ENXIO):
                raise
        else:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink <= 1:
                return fd
            os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        flags |= os.O_CREAT | os.O_EXCL
    raise FileExistsError(errno.EEXIST, "a name kept reappearing where tflaunch creates a file", str(path))


def create_beside(path: Path, label: str, mode: int = 0o644) -> tuple[int, Path]:
    """(descriptor, path) of a new empty file beside ``path``, ``.<name>.<label>-<random>``: made
    exclusively under a name nobody can plant beforehand, to be renamed over ``path`` or removed."""
    while True:
        spare = path.with_name(f".{path.name}.{label}-{secrets.token_hex(8)}")
        try:
            return os.open(spare, NEW_FILE | _NO_LINK, mode), spare
        except FileExistsError:
            continue  # 64 random bits taken: drawn again


def write_atomically(path: Path, text: str, sync_folder: bool = False) -> None:
    """Replace ``path`` through a temporary file (:func:`create_beside`) and a rename: readers never
    see half a file, and nothing is written through a link.

    The new file's data reaches the disk before the rename: otherwise a crash (power, kernel) can
    leave the renamed file empty on filesystems that write data after metadata, losing the old
    copy too. ``sync_folder`` also makes the rename itself durable; without it a crash may bring
    back the previous copy, which is whole.
    """
    fd, tmp = create_beside(path, "tmp")
    try:
        with open(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise
    if sync_folder:
        sync_directory(path.parent)


def sync_directory(path: Path) -> None:
    """fsync a folder, so that the names created or renamed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # a filesystem that cannot sync folders has nothing to sync
            raise
    finally:
        os.close(fd)
