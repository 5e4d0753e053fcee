"""taskd.worker.resume_dir: the trainers' resume folders go to disk, never to a memory filesystem."""

from __future__ import annotations

import os

from taskd.worker import resume_dir


def test_a_memory_filesystem_is_told_by_the_longest_mount_that_holds_the_path(tmp_path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw 0 0\nnone /mnt/r\\040am ramfs rw 0 0\n"
                      "/dev/vdb /dev/shm/disk ext4 rw 0 0\n")
    assert resume_dir.memory_filesystem("/dev/shm/a/b", str(mounts)) == "tmpfs"  # a folder not made yet too
    assert resume_dir.memory_filesystem("/dev/shm", str(mounts)) == "tmpfs"
    assert resume_dir.memory_filesystem("/dev/shm/disk/x", str(mounts)) is None
    assert resume_dir.memory_filesystem("/dev/shmx", str(mounts)) is None
    assert resume_dir.memory_filesystem("/mnt/r am/x", str(mounts)) == "ramfs"
    assert resume_dir.memory_filesystem("/work", str(tmp_path / "absent")) is None


def test_a_rank_folder_is_dropped_with_its_parent_once_empty(tmp_path) -> None:
    ranks = [resume_dir.rank_folder(str(tmp_path), r) for r in (0, 1)]
    assert ranks[0] == os.path.join(str(tmp_path), "taskd-resume", "rank0")
    for folder in ranks:
        os.makedirs(folder)
        (open(os.path.join(folder, "step=5.ckpt"), "w")).close()
    resume_dir.drop(ranks[0])
    assert os.listdir(tmp_path / "taskd-resume") == ["rank1"]
    resume_dir.drop(ranks[1])
    resume_dir.drop(ranks[1])  # twice: nothing to do
    assert os.listdir(tmp_path) == []
