"""Files written in a folder that others may be able to write: exclusively, never through a link.

:func:`open_own` opens a file to write in it, :func:`create_beside` makes a temporary one under a
name nobody can guess, :func:`write_atomically` replaces a file through one, :func:`make_folder`
makes a folder. Each is its owner's alone (:data:`FILE_MODE`, :data:`FOLDER_MODE`) unless the
folder it is made in is shared with its group (:func:`shared_with_group`): then the group may read it.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

FILE_MODE = 0o600  # whatever a task prints (a token, a path) is its owner's to read alone
FOLDER_MODE = 0o700
SHARED_FILE_MODE = 0o640  # in a folder shared with its group: the group reads, nobody else
SHARED_FOLDER_MODE = 0o2750  # set-group-ID: what is made inside keeps the folder's group


# How a file is opened for writing in a run folder: never through a link, never held by a child
# process, never waiting on a FIFO planted in its place (a regular file ignores O_NONBLOCK).
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL  # with open_own: made here and now, or not at all
OWN_TRIES = 8  # names open_own removes in a row before it gives up (someone keeps planting them)


def shared_with_group(folder: Path | str) -> bool:
    """Whether ``folder`` is shared with its group: set-group-ID and readable by the group."""
    mode = os.stat(folder).st_mode
    return bool(mode & stat.S_ISGID) and bool(mode & stat.S_IRGRP)


def file_mode(folder: Path | str) -> int:
    """The mode of a new file in ``folder``: its owner's alone, or also its group's to read."""
    return SHARED_FILE_MODE if shared_with_group(folder) else FILE_MODE


def make_folder(path: Path | str) -> None:
    """Make ``path`` and any missing parent, each its owner's alone, or the group's to read too
    where its parent is shared with its group (the group comes with set-group-ID)."""
    path = Path(path)
    if path.is_dir():
        return
    if not path.parent.is_dir():
        make_folder(path.parent)
    mode = SHARED_FOLDER_MODE if shared_with_group(path.parent) else FOLDER_MODE
    try:
        os.mkdir(path, mode & 0o777)
    except FileExistsError:
        if not path.is_dir():
            raise
        return
    os.chmod(path, mode, follow_symlinks=False)  # the umask took nothing it should not, and S_ISGID is kept


def open_own(path: Path | str, flags: int, mode: int | None = None) -> int:
    """A descriptor on ``path`` opened with ``flags``, never through a link: a symbolic link, a
    file that is not regular, another user's file or a file with a second name (a hard link to
    one elsewhere) found at ``path`` was planted there, and is removed and the file made anew,
    exclusively. With ``O_EXCL`` in ``flags`` a name found there at all is removed first.

    ``mode`` None: :func:`file_mode` of the file's folder. A run folder is its user's
    (:data:`FOLDER_MODE`), so the user may remove any name in it."""
    if mode is None:
        mode = file_mode(os.path.dirname(path) or ".")
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
                _keep_group_read(fd, info.st_mode, mode)
                return fd
            os.close(fd)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        flags |= os.O_CREAT | os.O_EXCL
    raise FileExistsError(errno.EEXIST, "a name kept reappearing where tflaunch creates a file", str(path))


def _keep_group_read(fd: int, has: int, wanted: int) -> None:
    """Give the group the read a shared folder's file should have, which a umask (077) took away."""
    if wanted & stat.S_IRGRP and not has & stat.S_IRGRP:
        os.fchmod(fd, wanted)


def create_beside(path: Path, label: str, mode: int | None = None) -> tuple[int, Path]:
    """(descriptor, path) of a new empty file beside ``path``, ``.<name>.<label>-<random>``: made
    exclusively under a name nobody can plant beforehand, to be renamed over ``path`` or removed.
    ``mode`` None: :func:`file_mode` of its folder."""
    if mode is None:
        mode = file_mode(path.parent)
    while True:
        spare = path.with_name(f".{path.name}.{label}-{secrets.token_hex(8)}")
        try:
            fd = os.open(spare, NEW_FILE | _NO_LINK, mode)
            _keep_group_read(fd, 0, mode)
            return fd, spare
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


def swappable_by_others(path: Path | str) -> str | None:
    """Why another user could rename or replace a folder made at ``path`` (or anything on its way
    from /), in a few words naming the folder that lets them; None when nobody but this user and
    root can. A folder on the way must be this user's or root's, and writable by nobody else unless
    sticky (then others may remove their own names only); a group-writable one is allowed when its
    group is this user's own (a user private group). A link on the way must be this user's or root's."""
    me = os.geteuid()
    given = Path(os.path.abspath(path))
    while not os.path.lexists(given) and given != given.parent:
        given = given.parent  # what does not exist yet, this user will make, as its own
    folders = [*reversed(given.parents), given]
    real = Path(os.path.realpath(given))
    folders += [*reversed(real.parents), real]
    seen: set[tuple[int, int]] = set()
    for folder in folders:
        link = os.lstat(folder)
        if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
            return f"{str(folder)!r} is a link of another user's (uid {link.st_uid})"
        info = os.stat(folder)
        if (info.st_dev, info.st_ino) in seen or not stat.S_ISDIR(info.st_mode):
            continue
        seen.add((info.st_dev, info.st_ino))
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (me, 0):
            return f"{str(folder)!r} belongs to another user (uid {info.st_uid})"
        if mode & stat.S_ISVTX:
            continue
        if mode & stat.S_IWOTH:
            return f"{str(folder)!r} is writable by every user (mode {mode:04o}) and has no sticky bit"
        if mode & stat.S_IWGRP and not _own_group(info.st_gid):
            return f"{str(folder)!r} is writable by its group (mode {mode:04o}) and has no sticky bit"
    return None


def _own_group(gid: int) -> bool:
    """Whether ``gid`` is this user's private group: named as the user, no other member."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(os.geteuid()).pw_name, grp.getgrgid(gid)
    except KeyError:
        return False
    return group.gr_name == user and set(group.gr_mem) <= {user}


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
