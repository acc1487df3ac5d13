"""A process group's shared directory outlives a parent killed outright (SIGKILL, the OOM
killer), which cannot remove it; the next group's start removes such directories, and
nothing else: not a live group's, not another user's, not a link, not one in use."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gateway.api.processes import (
    ABANDONED_AFTER_S,
    SharedDir,
    _gone,
    _start_of,
    sweep_abandoned,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="Linux /proc")


def gone_process() -> tuple[int, str]:
    """A pid no process has now (near the top of Linux's range, rarely reached), and a
    start time: a parent that is gone."""
    pid = next(p for p in range(4_000_000, 3_000_000, -1) if not Path(f"/proc/{p}").exists())
    return pid, "123456"


def aged(path: Path) -> Path:
    """Untouched for longer than a live group ever leaves its directory (made if absent)."""
    if not path.exists() and not path.is_symlink():
        path.mkdir()
    past = time.time() - ABANDONED_AFTER_S - 5
    os.utime(path, (past, past), follow_symlinks=False)
    return path


def group_dir(where: Path, pid: int, started: str, name: str = "x1") -> Path:
    path = where / f"gateway-serve-{pid}-{started}-{name}"
    path.mkdir()
    (path / "limits.db").write_bytes(b"state")
    return path


def test_only_directories_of_parents_that_are_gone_are_removed(tmp_path: Path) -> None:
    pid, started = gone_process()
    here, here_started = os.getpid(), _start_of(os.getpid())
    assert here_started is not None
    abandoned = aged(group_dir(tmp_path, pid, started, "a"))
    reused = aged(group_dir(tmp_path, here, str(int(here_started) + 1), "b"))  # pid reused
    live = aged(group_dir(tmp_path, here, here_started, "c"))
    in_use = group_dir(tmp_path, pid, started, "d")  # written to lately: another namespace's?
    unnamed = tmp_path / "gateway-serve-k2j4_x"  # an earlier release's
    unnamed.mkdir()
    aged(unnamed)
    target = aged(tmp_path / "elsewhere")  # what the link leads to is old as well
    link = tmp_path / f"gateway-serve-{pid}-{started}-link"
    link.symlink_to(target, target_is_directory=True)
    aged(link)
    a_file = tmp_path / f"gateway-serve-{pid}-{started}-file"
    a_file.write_text("not a directory")
    aged(a_file)

    removed = sweep_abandoned(tmp_path)

    assert sorted(removed) == sorted([abandoned, reused])
    assert not abandoned.exists() and not reused.exists()
    for kept in (live, in_use, unnamed, link, target, a_file):
        assert kept.exists() or kept.is_symlink(), kept


def test_a_group_names_its_directory_by_its_parent_and_sweeps_before_it_makes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    pid, started = gone_process()
    abandoned = aged(group_dir(tmp_path, pid, started))

    shared = SharedDir.make()

    assert not abandoned.exists()
    assert shared.root.parent == tmp_path
    assert shared.root.name.startswith(f"gateway-serve-{os.getpid()}-{_start_of(os.getpid())}-")
    aged(shared.root)
    assert sweep_abandoned(tmp_path) == []  # its own parent is alive
    shared.touch()
    assert shared.root.stat().st_mtime > time.time() - 60


def test_another_users_directories_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid, started = gone_process()
    abandoned = aged(group_dir(tmp_path, pid, started))
    monkeypatch.setattr(os, "getuid", lambda: abandoned.stat().st_uid + 1)
    assert sweep_abandoned(tmp_path) == []
    assert abandoned.exists()


def test_a_parent_whose_process_cannot_be_read_counts_as_alive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    here, started = os.getpid(), _start_of(os.getpid())
    assert started is not None
    assert not _gone(here, started)
    assert _gone(here, started + "0")  # the pid is another process's now
    assert _gone(*gone_process())

    def refused(self: Path, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_text", refused)
    assert not _gone(*gone_process())
