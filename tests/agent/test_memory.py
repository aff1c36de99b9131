"""The agent's memory limits, piece by piece, with plain data: where its cgroup is (from the
mount table and /proc/self/cgroup texts of pure v2, hybrid and container hosts), how an OOM
kill is counted, which processes a tree holds (and which were made since), what the node
has available (a directory of cgroup files written here, as in test_detect), what the
guard stops first, and how cores are handed out. The end-to-end tests
(tests/e2e/test_limits.py) run the real thing."""

from __future__ import annotations

from pathlib import Path

from tests.agent.test_detect import fake_root
from zres.agent.cpus import CoreBinder
from zres.agent.memory import node, procs
from zres.agent.memory.cgroups import cgroup_dir, parse_oom_kills
from zres.agent.memory.guard import Candidate, choose
from zres.core.resources import UNIT

V2 = ("30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 "
      "cgroup2 rw,nsdelegate,memory_recursiveprot\n")
HYBRID = ("35 26 0:30 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw\n"
          "38 26 0:33 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory\n"
          "39 26 0:34 / /sys/fs/cgroup/cpu\\040set rw,relatime - cgroup cgroup rw,cpuset\n")


def test_the_agents_cgroup_is_found_on_v2_hybrid_and_container_hosts():
    own = "0::/system.slice/zres-agent.service\n"
    assert cgroup_dir(V2, own, "cgroup2", "") == "/sys/fs/cgroup/system.slice/zres-agent.service"
    assert cgroup_dir(V2, own, "cgroup", "memory") is None  # (no v1 memory line)
    hybrid = "4:memory:/process_api/abc\n1:cpuset:/\n0::/\n"
    assert cgroup_dir(HYBRID, hybrid, "cgroup2", "") == "/sys/fs/cgroup/unified/"
    assert cgroup_dir(HYBRID, hybrid, "cgroup", "memory") == \
        "/sys/fs/cgroup/memory/process_api/abc"
    assert cgroup_dir(HYBRID, hybrid, "cgroup", "cpuset") == "/sys/fs/cgroup/cpu set/"
    # A container without a cgroup namespace: its own cgroup mounted at the root.
    docker = ("50 40 0:26 /docker/c0ffee /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert cgroup_dir(docker, "0::/docker/c0ffee/job\n", "cgroup2", "") == "/sys/fs/cgroup/job"
    assert cgroup_dir(docker, "0::/elsewhere\n", "cgroup2", "") is None


def test_an_oom_kill_is_counted_from_v2_and_v1_files():
    events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n"
    assert parse_oom_kills(events) == 2
    assert parse_oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n") == 1
    assert parse_oom_kills("max 12\n") == 0


def test_a_tree_is_its_descendants_and_its_sessions_processes():
    # pid: (parent, session). 10 leads a session: 13, whose parent died, is still its own.
    table = {10: (1, 10), 11: (10, 10), 12: (11, 10), 13: (1, 10), 20: (1, 20),
             30: (11, 30)}
    assert procs.members(10, table) == {10, 11, 12, 13, 30}
    assert procs.members(11, table) == {11, 12, 30}  # (not a session leader)
    assert procs.members(99, table) == set()


def test_the_processes_made_since_are_read_by_the_ids_handed_out_since(tmp_path,
                                                                       monkeypatch):
    """Those after the last id then, up to the last id now, wrapping at pid_max (a thread's
    id reads as a process; an id with nothing there, none)."""
    monkeypatch.setattr(procs, "PROC", str(tmp_path))
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/ns_last_pid").write_text("3\n")
    (tmp_path / "sys/kernel/pid_max").write_text("10\n")
    for pid, parent, session in [(2, 9, 9), (3, 2, 9), (5, 1, 5), (9, 1, 9)]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a (b) c) S {parent} {pid} "
                                                  f"{session} 0 -1\n")
    assert procs.last_pid() == 3
    assert procs.since(1, 3) == {2: (9, 9), 3: (2, 9)}
    assert procs.since(3, 3) == {}
    assert procs.since(8, 2) == {9: (1, 9), 2: (9, 9)}  # (wrapped past 9)
    (tmp_path / "sys/kernel/ns_last_pid").unlink()
    assert procs.last_pid() is None


def test_available_memory_is_the_nodes_or_its_cgroups_whichever_is_less(tmp_path):
    gib = 1 << 30
    root = fake_root(tmp_path, "0::/agent\n", {
        "/proc/meminfo": f"MemTotal: {64 * gib // 1024} kB\nMemAvailable: "
                         f"{40 * gib // 1024} kB\n",
        "/sys/fs/cgroup/agent/memory.max": str(8 * gib),
        "/sys/fs/cgroup/agent/memory.current": str(6 * gib),
        "/sys/fs/cgroup/agent/memory.stat": f"anon 100\ninactive_file {gib}\n"})
    assert node.available(root) == 3 * gib   # 8 - 6, and 1 of page cache it can drop
    assert node.default_reserve(root) == int(8 * gib * node.RESERVE_SHARE)
    Path(root, "sys/fs/cgroup/agent/memory.max").write_text("max\n")
    assert node.available(root) == 40 * gib


def test_the_guard_stops_the_newest_task_of_the_lowest_priority_unlimited_first():
    old_low = Candidate(1, "task", -5, began=1.0, asked=False, own=False)
    new_low = Candidate(2, "job", -5, began=2.0, asked=False, own=True)
    high = Candidate(3, "task", 5, began=3.0, asked=False, own=False)
    limited = Candidate(4, "task", -10, began=4.0, asked=True, own=True)
    assert choose([old_low, new_low, high, limited]) == new_low
    assert choose([high, limited]) == high      # (one within what it asked for goes last)
    assert choose([limited]) == limited and choose([]) is None


def test_cores_are_split_between_slots_and_the_least_busy_handed_out():
    binder = CoreBinder(2, cores=[0, 1, 2, 3])
    assert binder.cores == [[0, 1], [2, 3]]
    assert binder.take(0, 1, UNIT) == [0]
    assert binder.take(0, 2, UNIT // 2) == [1]       # (a fraction takes a core)
    assert binder.take(0, 3, 2 * UNIT) == [0, 1]     # (both busy: shared)
    binder.give(1)
    assert binder.take(0, 4, UNIT) == [0]
    assert binder.take(1, 5, 8 * UNIT) == [2, 3] and binder.take(1, 6, 0) == []
    assert CoreBinder(3, cores=[0, 1]).cores == [[0], [1], [0]]
