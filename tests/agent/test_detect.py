"""What an agent detects: the machine narrowed by CPU affinity and cgroup limits. The
cgroup cases read a directory of cgroup files written here (as a container's would be);
the last test runs a real agent under taskset and reads what the broker says it offers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.conftest import wait_until
from zres.agent import detect
from zres.core.resources import CPU

GB = 10**9


def fake_root(tmp_path: Path, cgroup: str, files: dict[str, str]) -> Path:
    """A file system root holding /proc/self/cgroup = CGROUP and FILES under it."""
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(cgroup)
    for name, text in files.items():
        path = tmp_path / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return tmp_path


def test_docker_cpus_4_memory_8g_on_cgroup_v2(tmp_path):
    # docker run --cpus 4 --memory 8g: a cgroup namespace, the limits at its root
    root = fake_root(tmp_path, "0::/\n", {"/sys/fs/cgroup/cpu.max": "400000 100000",
                                          "/sys/fs/cgroup/memory.max": str(8 * 1024**3)})
    assert detect.cpus(root, affinity=set(range(16)), machine=16) == (
        4, "cgroup /sys/fs/cgroup/cpu.max (400000 100000)")
    assert detect.memory(root, physical=64 * GB) == (8 * 1024**3,
                                                      "cgroup /sys/fs/cgroup/memory.max")


def test_a_fractional_quota_rounds_up_and_max_is_no_limit(tmp_path):
    root = fake_root(tmp_path, "0::/\n", {"/sys/fs/cgroup/cpu.max": "150000 100000",
                                          "/sys/fs/cgroup/memory.max": "max"})
    assert detect.cpus(root, affinity=set(range(8)), machine=8)[0] == 2  # 1.5 CPUs: Dask says 2
    assert detect.memory(root, physical=64 * GB) == (64 * GB, "the machine's memory")
    (root / "sys/fs/cgroup/cpu.max").write_text("max 100000\n")
    assert detect.cpus(root, affinity=set(range(8)), machine=8) == (
        8, "the machine's CPU count")


def test_the_process_s_own_cgroup_and_those_above_it_count(tmp_path):
    # No cgroup namespace (systemd, Slurm): the limits are under the process's path, and
    # a limit set on a parent applies too.
    root = fake_root(tmp_path, "0::/slurm/job_42/step_0\n", {
        "/sys/fs/cgroup/cpu.max": "max 100000",
        "/sys/fs/cgroup/slurm/job_42/cpu.max": "300000 100000",
        "/sys/fs/cgroup/slurm/job_42/step_0/cpu.max": "max 100000",
        "/sys/fs/cgroup/slurm/memory.max": str(20 * GB),
        "/sys/fs/cgroup/slurm/job_42/step_0/memory.max": str(30 * GB)})
    assert detect.cpus(root, affinity=set(range(64)), machine=64) == (
        3, "cgroup /sys/fs/cgroup/slurm/job_42/cpu.max (300000 100000)")
    assert detect.memory(root, physical=512 * GB) == (
        20 * GB, "cgroup /sys/fs/cgroup/slurm/memory.max")


def test_cgroup_v1_quota_and_memory_limit(tmp_path):
    root = fake_root(tmp_path, "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n", {
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
        "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": str(6 * GB),
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712"})
    assert detect.cpus(root, affinity=set(range(32)), machine=32) == (
        3, "cgroup /sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us (250000/100000)")
    assert detect.memory(root, physical=128 * GB) == (
        6 * GB, "cgroup /sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes")
    # v1's "no quota" is -1; "unlimited" memory is a huge number: neither limits anything
    (root / "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    (root / "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes").write_text(
        "9223372036854771712\n")
    assert detect.cpus(root, affinity={0, 1}, machine=2) == (2, "the machine's CPU count")
    assert detect.memory(root, physical=128 * GB) == (128 * GB, "the machine's memory")


def test_affinity_narrows_the_count_and_a_quota_narrows_it_further(tmp_path):
    root = fake_root(tmp_path, "0::/\n", {"/sys/fs/cgroup/cpu.max": "100000 100000"})
    assert detect.cpus(tmp_path / "nothing", affinity={0, 1}, machine=8) == (
        2, "the process's CPU affinity")
    assert detect.cpus(root, affinity={0, 1}, machine=8) == (
        1, "cgroup /sys/fs/cgroup/cpu.max (100000 100000)")


def test_unreadable_or_malformed_files_are_no_limit(tmp_path):
    root = fake_root(tmp_path, "garbage\n", {"/sys/fs/cgroup/cpu.max": "lots",
                                             "/sys/fs/cgroup/memory.max": "-5"})
    assert detect.cpus(root, affinity={0, 1, 2}, machine=4) == (
        3, "the process's CPU affinity")
    assert detect.memory(root, physical=GB) == (GB, "the machine's memory")


def test_this_machine_s_detection_agrees_with_its_affinity():
    count, why = detect.cpus()
    assert count <= len(os.sched_getaffinity(0))
    assert count >= 1 and why


def test_an_agent_under_taskset_offers_one_cpu(make_cluster, make_client, spawn):
    cluster = make_cluster([])
    client = make_client(cluster.address, keys=cluster.keys)
    spawn(["taskset", "-c", "0", sys.executable, "-m", "zres", "agent", cluster.address,
           "--keys", cluster.keys, "--name", "pinned", "--no-detect"])
    agents = wait_until(lambda: [a for a in client.status()["agents"]
                                 if a["name"] == "pinned"], message="the agent registers")
    assert [s["total"][CPU] for s in agents[0]["slots"]] == [1.0]
