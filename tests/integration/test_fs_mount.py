"""`metaflow-fs` mounted for real (FUSE, /dev/fuse) over a real standalone
agent (``--via``; the mount over the fabric is in tests/e2e), with ordinary
tools on it: tar x of a source tree checked
with diff -r, git, find, du, ls -lR, rsync -a, mv of directories, fs_mark
and postmark; the errors a file system owes for what it does not keep;
what a second mount sees, and when; fsync that survives a kill -9 of the
mount, and entries that survive one while their directory's times are
still owed; and clean unmounts by SIGTERM and by fusermount3 -u."""

from __future__ import annotations

import errno
import os
import secrets
import signal
import socket
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import os_ken
import pytest

from mininet_scenarios.daemons import AgentProcess
from mininet_scenarios.fs_mount import FuseMount, mounted

SOURCE = Path(os_ken.__file__).parent
"""A real source tree (os-ken's: 1,430 files, 93 directories, 21 MB without
its bytecode), installed in every venv here."""


@pytest.fixture(scope="module")
def via(standalone_agent: AgentProcess) -> str:
    return f"{standalone_agent.host}:{standalone_agent.port}"


@pytest.fixture
def mount(tmp_path: Path, via: str) -> Iterator[FuseMount]:
    """A mount of a file system of its own (a fresh root inode)."""
    with FuseMount(tmp_path / "mnt", via=via, root=secrets.randbits(62) | 2,
                   log_path=tmp_path / "fs.log") as fs:
        yield fs


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    out = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{argv}: {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return out.stdout


def test_tar_x_of_a_source_tree_then_diff_r(mount: FuseMount, tmp_path: Path) -> None:
    archive = tmp_path / "src.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(SOURCE, arcname="src", filter=lambda i: None if "__pycache__" in i.name else i)
    _run("tar", "xf", archive, "-C", mount.path)
    _run("diff", "-r", "--exclude=__pycache__", SOURCE, mount.path / "src")
    files = [p for p in SOURCE.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(files) > 1400
    assert (mount.path / "src" / "__init__.py").stat().st_mtime == (SOURCE / "__init__.py").stat().st_mtime


def test_git_init_add_commit_log(mount: FuseMount) -> None:
    repo = mount.path / "repo"
    _run("cp", "-r", SOURCE / "lib" / "packet", repo)
    git = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t"]
    _run(*git, "init", "-q", cwd=repo)
    _run(*git, "add", "-A", cwd=repo)
    _run(*git, "commit", "-qm", "first", cwd=repo)
    (repo / "new.txt").write_text("second\n")
    _run(*git, "add", "new.txt", cwd=repo)
    _run(*git, "commit", "-qm", "second", cwd=repo)
    assert _run(*git, "log", "--format=%s", cwd=repo).split() == ["second", "first"]
    assert _run(*git, "status", "--porcelain", cwd=repo) == ""
    _run(*git, "fsck", "--no-progress", cwd=repo)


def test_find_du_ls_rsync_and_mv_of_directories(mount: FuseMount) -> None:
    tree = SOURCE / "lib" / "packet"
    _run("rsync", "-a", f"{tree}/", mount.path / "gen")
    _run("diff", "-r", tree, mount.path / "gen")
    found = _run("find", mount.path / "gen", "-type", "f").split()
    assert len(found) == sum(1 for p in tree.rglob("*") if p.is_file())
    assert int(_run("du", "-s", "--block-size=1", mount.path / "gen").split()[0]) > 0
    assert "__init__.py" in _run("ls", "-lR", mount.path)
    (mount.path / "deep" / "er").mkdir(parents=True)
    _run("mv", mount.path / "gen", mount.path / "deep" / "er" / "gen2")
    assert not (mount.path / "gen").exists()
    _run("diff", "-r", tree, mount.path / "deep" / "er" / "gen2")
    _run("rsync", "-a", "--delete", f"{mount.path / 'deep'}/", mount.path / "copy")
    _run("diff", "-r", mount.path / "deep", mount.path / "copy")


def test_fs_mark_and_postmark_run(mount: FuseMount, tmp_path: Path) -> None:
    (mount.path / "fsm").mkdir()   # fs_mark wants its directory made
    out = _run("fs_mark", "-d", "fsm", "-n", "100", "-s", "4096", "-t", "2", "-k",   # a path under 40 bytes
               cwd=mount.path)
    rows = [line.split() for line in out.splitlines() if line.strip() and line.split()[0].isdigit()]
    assert rows and float(rows[-1][3]) > 0            # files/s
    assert len(list((mount.path / "fsm").rglob("*"))) >= 200
    (mount.path / "pm").mkdir()
    config = tmp_path / "pm.cfg"
    config.write_text(f"set location {mount.path / 'pm'}\nset number 100\nset transactions 200\n"
                      "set size 512 16384\nrun\nquit\n")
    report = _run("postmark", config)
    assert "transactions" in report and "deleted" in report
    assert list((mount.path / "pm").iterdir()) == []   # postmark removes what it made


def test_what_is_not_kept_gets_a_clear_errno(mount: FuseMount) -> None:
    target = mount.path / "f"
    target.write_bytes(b"data")
    here = mount.path
    for what, call, code in [("link of a directory", lambda: os.link(here, here / "g"), errno.EPERM),
                             ("long name", lambda: (mount.path / ("x" * 256)).touch(), errno.ENAMETOOLONG),
                             ("getxattr", lambda: os.getxattr(target, "user.a"), errno.ENODATA),
                             ("big xattr", lambda: os.setxattr(target, "user.a", b"v" * 65537), errno.E2BIG),
                             ("rmdir", lambda: os.rmdir(target), errno.ENOTDIR)]:
        with pytest.raises(OSError) as failed:
            call()
        assert failed.value.errno == code, (what, failed.value)
    assert os.listxattr(target) == []
    (mount.path / "d").mkdir()
    (mount.path / "d" / "x").write_text("x")
    with pytest.raises(OSError) as busy:
        os.rmdir(mount.path / "d")
    assert busy.value.errno == errno.ENOTEMPTY
    assert target.read_bytes() == b"data"


def test_fallocate_grows_a_file_and_punches_holes_that_read_as_zeros(mount: FuseMount) -> None:
    target = mount.path / "sparse"
    data = os.urandom(600_000)   # three chunks: a hole over a whole one and parts of two
    target.write_bytes(data)
    _run("fallocate", "--punch-hole", "--offset", "100000", "--length", "400000", target)
    assert target.stat().st_size == len(data)
    assert target.read_bytes() == data[:100_000] + bytes(400_000) + data[500_000:]
    _run("fallocate", "--zero-range", "--offset", "590000", "--length", "20000", target)   # grows it
    assert target.read_bytes() == data[:100_000] + bytes(400_000) + data[500_000:590_000] + bytes(20_000)
    with open(target, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, 1_000_000)   # mode 0: the size, nothing reserved
        assert os.fstat(f.fileno()).st_size == 1_000_000
    assert target.stat().st_size == 1_000_000 and target.read_bytes()[610_000:] == bytes(390_000)
    collapse = subprocess.run(["fallocate", "--collapse-range", "--offset", "0", "--length", "4096",
                               str(target)], capture_output=True, text=True)
    assert collapse.returncode != 0 and "not supported" in collapse.stderr


def test_setxattr_honours_create_and_replace(mount: FuseMount) -> None:
    target = mount.path / "x"
    target.write_bytes(b"")
    with pytest.raises(OSError) as missing:
        os.setxattr(target, "user.a", b"1", os.XATTR_REPLACE)
    assert missing.value.errno == errno.ENODATA
    os.setxattr(target, "user.a", b"1", os.XATTR_CREATE)
    with pytest.raises(OSError) as exists:
        os.setxattr(target, "user.a", b"2", os.XATTR_CREATE)
    assert exists.value.errno == errno.EEXIST
    os.setxattr(target, "user.a", b"3", os.XATTR_REPLACE)
    assert os.getxattr(target, "user.a") == b"3" and os.listxattr(target) == ["user.a"]


def test_o_trunc_and_shell_redirection_cut_an_existing_file(mount: FuseMount) -> None:
    target = mount.path / "f"
    target.write_bytes(b"a longer first version")
    mount.run("sh", "-c", f"echo short > {target}")
    assert target.read_bytes() == b"short\n"
    os.close(os.open(target, os.O_WRONLY | os.O_TRUNC))
    assert target.stat().st_size == 0 and target.read_bytes() == b""


def test_hard_links_from_tar_and_rsync_share_one_inode(mount: FuseMount, tmp_path: Path) -> None:
    """tar keeps hard links as links (one inode, the count) and rsync -H
    copies them as links; a change through one name shows through the other."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "a").write_bytes(b"one inode, two names")
    os.link(source / "a", source / "b")
    archive = tmp_path / "links.tar"
    _run("tar", "cf", archive, "-C", source, ".")
    _run("tar", "xf", archive, "-C", mount.path)
    a, b = (mount.path / "a").stat(), (mount.path / "b").stat()
    assert a.st_ino == b.st_ino and a.st_nlink == b.st_nlink == 2
    _run("rsync", "-aH", f"{mount.path}/", tmp_path / "copy")
    assert (tmp_path / "copy" / "a").stat().st_ino == (tmp_path / "copy" / "b").stat().st_ino
    with open(mount.path / "b", "ab") as appending:
        appending.write(b", grown")
    assert (mount.path / "a").read_bytes() == b"one inode, two names, grown"
    (mount.path / "a").unlink()
    assert (mount.path / "b").stat().st_nlink == 1 and (mount.path / "b").read_bytes().endswith(b"grown")


def test_extended_attributes_through_the_kernel_and_cp_preserving_them(mount: FuseMount) -> None:
    target = mount.path / "f"
    target.write_bytes(b"data")
    os.setxattr(target, "user.checksum", b"\x00sha256\xff")
    os.setxattr(target, "user.empty", b"")
    assert sorted(os.listxattr(target)) == ["user.checksum", "user.empty"]
    assert os.getxattr(target, "user.checksum") == b"\x00sha256\xff"
    mount.run("cp", "--preserve=xattr", str(target), str(mount.path / "copy"))
    assert os.getxattr(mount.path / "copy", "user.checksum") == b"\x00sha256\xff"
    os.removexattr(target, "user.empty")
    assert os.listxattr(target) == ["user.checksum"]


def test_fifos_sockets_and_device_nodes_are_kept_and_the_kernel_does_their_io(mount: FuseMount) -> None:
    """Only their inodes are the mount's: a FIFO carries bytes between two
    opens through the kernel's pipe, a UNIX socket bound here accepts a
    connection, and a device node keeps its number."""
    fifo, sock, device = mount.path / "fifo", mount.path / "sock", mount.path / "null"
    os.mkfifo(fifo, 0o640)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    with open(fifo, "wb") as writer:
        writer.write(b"through the pipe")
    assert reader.communicate(timeout=10)[0] == b"through the pipe"
    with socket.socket(socket.AF_UNIX) as server, socket.socket(socket.AF_UNIX) as client:
        server.bind(str(sock))
        server.listen()
        client.connect(str(sock))
        server.accept()[0].close()
    os.mknod(device, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    kinds = {p.name: stat.S_IFMT(p.lstat().st_mode) for p in mount.path.iterdir()}
    assert kinds == {"fifo": stat.S_IFIFO, "sock": stat.S_IFSOCK, "null": stat.S_IFCHR}
    assert device.lstat().st_rdev == os.makedev(1, 3) and stat.S_IMODE(fifo.lstat().st_mode) == 0o640
    for path in (fifo, sock, device):
        path.unlink()
    assert list(mount.path.iterdir()) == []


def test_a_second_mount_sees_changes_within_its_cache_timeouts(tmp_path: Path, via: str) -> None:
    """Without caching, another mount's changes show at once; with the
    default 1 s timeouts, within a second."""
    root = secrets.randbits(62) | 2
    with FuseMount(tmp_path / "a", via=via, root=root, attr_timeout=0, entry_timeout=0) as a, \
            FuseMount(tmp_path / "b", via=via, root=root, attr_timeout=0, entry_timeout=0) as b:
        (a.path / "f").write_text("one")
        assert (b.path / "f").read_text() == "one"
        os.rename(a.path / "f", a.path / "g")
        assert not (b.path / "f").exists() and (b.path / "g").read_text() == "one"
        os.chmod(a.path / "g", 0o600)
        assert (b.path / "g").stat().st_mode & 0o777 == 0o600
    with FuseMount(tmp_path / "a", via=via, root=root) as a, \
            FuseMount(tmp_path / "b", via=via, root=root) as b:
        assert (b.path / "g").stat().st_mode & 0o777 == 0o600
        os.chmod(a.path / "g", 0o640)
        time.sleep(1.2)
        assert (b.path / "g").stat().st_mode & 0o777 == 0o640


def test_fsync_survives_a_kill_9_of_the_mount(tmp_path: Path, via: str) -> None:
    root = secrets.randbits(62) | 2
    first = FuseMount(tmp_path / "mnt", via=via, root=root, log_path=tmp_path / "fs.log").start()
    try:
        fd = os.open(first.path / "synced", os.O_WRONLY | os.O_CREAT, 0o644)
        os.write(fd, b"s" * 300_000)
        os.fsync(fd)
        first.kill()     # the mount dies with the file open: no flush, no release
        with pytest.raises(OSError) as gone:
            os.close(fd)
        assert gone.value.errno == errno.ENOTCONN
    finally:
        first.kill()
    assert not mounted(first.path)
    with FuseMount(tmp_path / "mnt", via=via, root=root) as second:
        assert (second.path / "synced").read_bytes() == b"s" * 300_000


def test_a_kill_9_while_directory_times_are_owed_loses_those_times_never_an_entry(tmp_path: Path,
                                                                                  via: str) -> None:
    """A directory's times are written up to 10 ms after the change that
    owes them (`MountOperations.push_times`); the entry itself is written
    before the change returns. Kill the mount right after a burst of
    creates, with times still owed: every create that returned is there
    for the next mount, and the directory shows no time newer than the
    dead mount showed."""
    root = secrets.randbits(62) | 2
    first = FuseMount(tmp_path / "mnt", via=via, root=root, attr_timeout=0, entry_timeout=0,
                      log_path=tmp_path / "fs.log").start()
    made: list[str] = []
    try:
        directory = first.path / "d"
        directory.mkdir()
        for i in range(300):
            name = f"f{i:03d}"
            os.close(os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            made.append(name)
        shown = directory.stat()
        first.kill()   # at once: the last creates' directory times are still owed
    finally:
        first.kill()
    assert not mounted(first.path)
    with FuseMount(tmp_path / "mnt", via=via, root=root, attr_timeout=0, entry_timeout=0) as second:
        directory = second.path / "d"
        assert sorted(os.listdir(directory)) == made
        assert all(stat.S_ISREG((directory / name).stat().st_mode) for name in made)
        after = directory.stat()
        assert after.st_mtime_ns <= shown.st_mtime_ns and after.st_ctime_ns <= shown.st_ctime_ns


def test_sigterm_and_fusermount_unmount_cleanly_and_push_what_is_buffered(tmp_path: Path, via: str) -> None:
    root = secrets.randbits(62) | 2
    mount = FuseMount(tmp_path / "mnt", via=via, root=root).start()
    held = open(mount.path / "open-at-unmount", "wb")   # noqa: SIM115 - open across the unmount
    held.write(b"buffered")
    held.flush()   # to the mount's buffer (FUSE write), not yet to the servers
    mount.proc.send_signal(signal.SIGTERM)   # type: ignore[union-attr]
    assert mount.proc.wait(30) == 0 and not mounted(mount.path)   # type: ignore[union-attr]
    with pytest.raises(OSError):
        held.close()
    mount = FuseMount(tmp_path / "mnt", via=via, root=root).start()
    assert (mount.path / "open-at-unmount").read_bytes() == b"buffered"
    _run("fusermount3", "-u", mount.path)
    assert mount.proc.wait(30) == 0 and not mounted(mount.path)   # type: ignore[union-attr]


def test_the_same_mount_with_its_records_in_one_central_redis(tmp_path: Path, redis_server: str) -> None:
    """The baseline the benchmarks compare with: the same FUSE client, its
    records in one redis-server instead of MetaFlow."""
    central = redis_server.removeprefix("redis://")
    with FuseMount(tmp_path / "mnt", "--central-redis", central, root=secrets.randbits(62) | 2,
                   log_path=tmp_path / "fs.log") as mount:
        tree = SOURCE / "services"
        _run("rsync", "-a", f"{tree}/", mount.path / "copy")
        _run("diff", "-r", tree, mount.path / "copy")
        os.rename(mount.path / "copy", mount.path / "moved")
        assert len(_run("find", mount.path / "moved", "-type", "f").split()) == \
            sum(1 for p in tree.rglob("*") if p.is_file())
