"""A disk whose power a test can cut: ext4 on a loop device over an image file.

The loop device writes what the file system submits to it into the image
file; what the file system still holds in its own page cache (data written
but not yet synced or written back) is not in the image. A copy of the image
file, taken while the file system is mounted, is therefore the disk as a
power loss at that instant would leave it, and mounting the copy replays the
journal as the next boot would. Two limits: the copy takes a few
milliseconds, so it is consistent only if nothing is written meanwhile
(stop the writers first), and a real disk with a volatile cache can also
lose or reorder what it was sent but not told to flush, which this does not
model.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType

__all__ = ["LoopDisk"]


def _run(*argv: str) -> str:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip()


class LoopDisk:
    """ext4 in ``image`` (made fresh unless ``existing``), mounted at ``mountpoint``.

    Only the loop device and the mount this object made are removed.
    """

    def __init__(self, image: Path, mountpoint: Path, *, size_mib: int = 48, existing: bool = False) -> None:
        self.image = image
        self.mountpoint = mountpoint
        self.size_mib = size_mib
        self.existing = existing
        self.device: str | None = None
        self._mounted = False

    def __enter__(self) -> LoopDisk:
        if not self.existing:
            with open(self.image, "wb") as image:
                image.truncate(self.size_mib << 20)
            _run("mkfs.ext4", "-q", "-F", str(self.image))
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.device = _run("losetup", "--find", "--show", str(self.image))
        try:
            _run("mount", "-t", "ext4", self.device, str(self.mountpoint))
            self._mounted = True
        except BaseException:
            self.close()
            raise
        return self

    def crash_image(self, copy: Path) -> Path:
        """The disk as a power loss now would leave it, copied to ``copy``."""
        shutil.copyfile(self.image, copy)
        return copy

    def close(self) -> None:
        """Unmount (waiting for the last files to be closed) and detach; idempotent."""
        if self._mounted:
            for _ in range(100):
                if subprocess.run(["umount", str(self.mountpoint)], check=False,
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.1)  # a process that was killed still closing its files
            else:
                _run("umount", "--lazy", str(self.mountpoint))
            self._mounted = False
        if self.device is not None:
            _run("losetup", "--detach", self.device)
            self.device = None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
