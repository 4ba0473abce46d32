"""The benchmarks' provenance: which commit a result came from."""
import shutil
import subprocess

import pytest

from benchmarks.timing import git_commit, host_cpu

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                   check=True, capture_output=True)


def test_a_tree_that_differs_from_its_head_is_marked_dirty(tmp_path):
    """A results file names the commit it ran; a tree whose tracked files differ from HEAD (the
    GPU machine's copy carries a stale .git) reads "<HEAD>+dirty", a clean one the bare short
    hash, and a directory outside any repository "unknown"."""
    assert git_commit(str(tmp_path)) == "unknown"
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-qm", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout.strip()
    assert git_commit(str(tmp_path)) == head
    (tmp_path / "b.py").write_text("untracked\n")  # untracked files are not the commit's
    assert git_commit(str(tmp_path)) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_commit(str(tmp_path)) == head + "+dirty"


def test_host_cpu_names_the_model_and_its_last_level_cache(tmp_path):
    """Results from hosts of one kind differ with their caches, so the provenance names the
    CPU's model and L3 as the kernel reports them, and "unknown" for a part it cannot read."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t: avx\n")
    l3 = tmp_path / "size"
    l3.write_text("307200K\n")
    assert host_cpu(str(cpuinfo), str(l3)) == "Test CPU 9000, L3 307200K"
    assert host_cpu(str(cpuinfo), str(tmp_path / "none")) == "Test CPU 9000, L3 unknown"
    assert host_cpu(str(tmp_path / "none"), str(l3)) == "unknown, L3 307200K"
