"""A file system in memory (FUSE, through fusepy) whose files cannot be locked, as on NFS without its
lock daemon: every lock request fails with ENOLCK. Files and folders can be made, read, written
and removed. Run ``python nolockfs.py MOUNTPOINT``: it serves in the foreground until unmounted
(``fusermount -u MOUNTPOINT``)."""

import errno
import stat
import sys
import time

from fuse import FUSE, FuseOSError, Operations


def _entry(mode: int, links: int) -> dict:
    now = time.time()
    return dict(st_mode=mode, st_nlink=links, st_size=0, st_uid=0, st_gid=0, st_ctime=now, st_mtime=now,
                st_atime=now)


class NoLocks(Operations):
    def __init__(self):
        self.entries = {"/": _entry(stat.S_IFDIR | 0o755, 2)}
        self.data: dict[str, bytes] = {}
        self.handles = 0

    def getattr(self, path, fh=None):
        if path not in self.entries:
            raise FuseOSError(errno.ENOENT)
        return self.entries[path]

    def readdir(self, path, fh):
        parent = path.rstrip("/")
        return [".", ".."] + [p.rsplit("/", 1)[1] for p in self.entries if p != "/" and p.rsplit("/", 1)[0] == parent]

    def mkdir(self, path, mode):
        self.entries[path] = _entry(stat.S_IFDIR | mode, 2)

    def chmod(self, path, mode):
        self.entries[path]["st_mode"] = (self.entries[path]["st_mode"] & ~0o7777) | mode

    def chown(self, path, uid, gid):
        pass

    def create(self, path, mode, fi=None):
        self.entries[path] = _entry(stat.S_IFREG | mode, 1)
        self.data[path] = b""
        return self.open(path, 0)

    def open(self, path, flags):
        self.handles += 1
        return self.handles

    def read(self, path, size, offset, fh):
        return self.data[path][offset:offset + size]

    def write(self, path, data, offset, fh):
        old = self.data[path]
        self.data[path] = old[:offset].ljust(offset, b"\0") + data + old[offset + len(data):]
        self.entries[path]["st_size"] = len(self.data[path])
        return len(data)

    def truncate(self, path, length, fh=None):
        self.data[path] = self.data[path][:length].ljust(length, b"\0")
        self.entries[path]["st_size"] = length

    def unlink(self, path):
        del self.entries[path]
        self.data.pop(path, None)

    def rmdir(self, path):
        del self.entries[path]

    def lock(self, path, fh, cmd, lock):
        raise FuseOSError(errno.ENOLCK)


if __name__ == "__main__":
    FUSE(NoLocks(), sys.argv[1], foreground=True, nothreads=True, default_permissions=True)
