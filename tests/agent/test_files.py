"""An agent's own files (``zres.agent.files``): one running agent per state directory,
nothing made through a link, no two names sharing a directory. The end-to-end cases (a
directory open to others refused, a killed agent's files removed by its restart, a
planted link where a job's log goes) are in tests/e2e/test_jobs.py and test_faults.py."""

from __future__ import annotations

import os
import stat

import pytest

from zres.agent.files import AgentFiles, JobLogs, UnsafeDirectory, safe_name
from zres.core.errors import ZresError

pytestmark = pytest.mark.timeout(30)


def test_a_second_agent_with_the_same_state_directory_is_refused_naming_the_first(tmp_path):
    state = tmp_path / "state"
    first = AgentFiles(str(state))
    try:
        with pytest.raises(ZresError, match=rf"another agent \(pid {os.getpid()}\) runs "
                                            rf"with the state directory {state}:"):
            AgentFiles(str(state))
        assert (state / "run").is_dir(), "the refused one removed the first one's files"
    finally:
        first.close()
    AgentFiles(str(state)).close()  # once the first has stopped, the next one starts
    assert sorted(p.name for p in state.iterdir()) == ["lock"]
    assert stat.S_IMODE((state / "lock").stat().st_mode) == 0o600


def test_missing_parents_are_made_private_too(tmp_path):
    state = tmp_path / "a" / "b" / "state"
    AgentFiles(str(state)).close()
    assert [stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "a", state.parent, state)] \
        == [0o700] * 3


def test_a_link_in_place_of_a_clusters_log_directory_is_not_followed(tmp_path):
    logs = JobLogs(str(tmp_path / "logs"), "agent")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "logs" / "abc123").symlink_to(elsewhere)
    with pytest.raises(UnsafeDirectory, match=f"{tmp_path / 'logs' / 'abc123'} is not a "
                                              "directory"):
        logs.create("abc123", 1)
    assert list(elsewhere.iterdir()) == []
    fd = logs.create("def456", 1)
    os.write(fd, b"hello\n")
    os.close(fd)
    assert logs.read("def456", 1, 0) == b"hello\n"
    with pytest.raises(FileExistsError):
        logs.create("def456", 1)
    os.close(logs.create("def456", 1, replace=True))  # a later attempt: a new log
    assert logs.read("def456", 1, 0) == b""
    logs.close()


def test_names_that_differ_never_share_a_file():
    assert safe_name("node-1.lab_a") == "node-1.lab_a"
    assert len({safe_name(n) for n in ("a/b", "a_b", "a b", "a\\b")}) == 4
    assert "/" not in safe_name("../../etc")
