"""What tasks and actors print reaches the client that submitted them: line by line,
prefixed ``(TASK AGENT) ``, on the stream it was written to, before the task's result.
Real broker, agent and worker processes; the client is this process (read with capsys) or
a script run as a user would (its stdout and stderr read)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import zres
from tests.conftest import LOSS, wait_until
from zres.agent.output import BURST, RATE


@pytest.fixture(scope="module")
def cluster() -> Iterator[zres.LocalCluster]:
    with zres.LocalCluster(agents=[{"CPU": 4}], nthreads=4, names=["node-a"],
                           heartbeat_interval=0.2) as cluster:
        yield cluster


# -- tasks (they travel by value to the worker processes) -----------------------------------


def shout(x: int) -> int:
    print("hello", x)
    print("careful", x, file=sys.stderr)
    return x * 2


def unfinished() -> str:
    print("no newline", end="")
    sys.stdout.write(" at all")
    return "done"


def lines_in_pieces(tag: str, count: int, gate: str) -> int:
    """Write COUNT lines a character at a time, once all tasks of GATE have begun."""
    Path(gate, tag).touch()
    deadline = time.monotonic() + 30
    while len(os.listdir(gate)) < 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    for i in range(count):
        for ch in f"{tag}:{i}:" + "x" * 40:
            sys.stdout.write(ch)
        sys.stdout.write("\n")
    return count


def flood(nbytes: int) -> str:
    print("before")
    print("y" * 99 + ("\n" + "y" * 99) * (nbytes // 100 - 1))
    print("after")
    return "survived"


def chatter(stop: str) -> str:
    """Print a line every 10 ms until STOP exists."""
    i = 0
    while not os.path.exists(stop):
        print("tick", i)
        i += 1
        time.sleep(0.01)
    print("last words")
    return "finished"


def die_mid_line() -> None:
    print("half a li", end="")
    os._exit(3)


class Greeter:
    def __init__(self, greeting: str) -> None:
        print("constructed with", greeting)
        self.greeting = greeting

    def greet(self, name: str) -> str:
        print(self.greeting, name)
        print("to stderr", name, file=sys.stderr)
        return f"{self.greeting} {name}"

    async def greet_later(self, name: str) -> str:
        print("async", self.greeting, name)
        return name


# -- tests ----------------------------------------------------------------------------------


def test_a_users_script_sees_task_and_actor_output_before_results(
        cluster: zres.LocalCluster, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import sys, zres

        def process(x):
            print("processing", x)
            print("warning about", x, file=sys.stderr)
            return x + 1

        class Greeter:
            def __init__(self):
                print("up")
            def greet(self, name):
                print("hi", name)
                return name

        with zres.Client({cluster.address!r}, keys={cluster.keys!r}) as client:
            print("result", client.submit(process, 41).result(), flush=True)
            greeter = client.actor(Greeter)
            print("call", greeter.greet("bob").result(), flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[:2] == ["(process-1 node-a) processing 41", "result 42"]
    assert re.fullmatch(r"\(Greeter\.__init__-\w+ node-a\) up", out[2])
    assert out[3:] == ["(Greeter.greet-3 node-a) hi bob", "call bob"]
    assert "(process-1 node-a) warning about 41" in done.stderr.splitlines()


def test_output_arrives_before_the_result(cluster: zres.LocalCluster,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with zres.Client(cluster.address) as client:
        for i in range(20):
            future = client.submit(shout, i)
            assert future.result(timeout=30) == 2 * i
            captured = capsys.readouterr()  # at once: nothing may come later
            name = f"shout-{i + 1}"
            assert captured.out == f"({name} node-a) hello {i}\n"
            assert captured.err == f"({name} node-a) careful {i}\n"


def test_actor_output_goes_to_its_caller(cluster: zres.LocalCluster,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with zres.Client(cluster.address) as client:
        greeter = client.actor(Greeter, "hello")
        greeter.ready().result(timeout=30)
        assert re.fullmatch(r"\(Greeter\.__init__-\w+ node-a\) constructed with hello\n",
                            capsys.readouterr().out)
        assert greeter.greet("ann").result(timeout=30) == "hello ann"
        captured = capsys.readouterr()
        assert captured.out == "(Greeter.greet-2 node-a) hello ann\n"
        assert captured.err == "(Greeter.greet-2 node-a) to stderr ann\n"
        assert greeter.greet_later("cy").result(timeout=30) == "cy"  # on the actor's loop
        assert capsys.readouterr().out == "(Greeter.greet_later-3 node-a) async hello cy\n"


def test_text_without_a_newline_comes_at_the_tasks_end(
        cluster: zres.LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    with zres.Client(cluster.address) as client:
        assert client.submit(unfinished).result(timeout=30) == "done"
        assert capsys.readouterr().out == "(unfinished-1 node-a) no newline at all\n"


def test_lines_of_concurrent_tasks_are_never_mixed(
        cluster: zres.LocalCluster, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with zres.Client(cluster.address) as client:
        futures = [client.submit(lines_in_pieces, f"t{k}", 150, str(tmp_path))
                   for k in range(4)]
        assert [f.result(timeout=60) for f in futures] == [150] * 4
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 600
    seen: dict[str, list[int]] = {}
    for line in lines:
        match = re.fullmatch(r"\(lines_in_pieces-(\d) node-a\) t(\d):(\d+):x{40}", line)
        assert match, f"a line was mixed with another: {line!r}"
        assert int(match[1]) == int(match[2]) + 1  # under its own task's prefix
        seen.setdefault(match[2], []).append(int(match[3]))
    assert seen == {str(k): list(range(150)) for k in range(4)}  # each in order


def test_forward_output_false_prints_nothing(cluster: zres.LocalCluster,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with zres.Client(cluster.address, forward_output=False) as quiet, \
            zres.Client(cluster.address) as loud:
        assert quiet.submit(shout, 1).result(timeout=30) == 2
        assert quiet.submit(unfinished).result(timeout=30) == "done"
        assert capsys.readouterr() == ("", "")
        assert loud.submit(shout, 2).result(timeout=30) == 4  # the same cluster, printing
        assert capsys.readouterr().out == "(shout-1 node-a) hello 2\n"


def test_a_huge_print_is_bounded_and_marked(cluster: zres.LocalCluster,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    total = 20_000_000
    with zres.Client(cluster.address) as client:
        start = time.monotonic()
        assert client.submit(flood, total).result(timeout=60) == "survived"
        elapsed = time.monotonic() - start  # (longer than the task ran)
        lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "(flood-1 node-a) before"
    kept = [line for line in lines if line.endswith("y" * 99)]
    assert 0 < len(kept) * 100 <= BURST + RATE * elapsed  # what a task may send
    notes = [re.fullmatch(r"\(flood-1 node-a\) \[zres: (\d+) bytes of output dropped\]", line)
             for line in lines if "output dropped" in line]
    assert notes and all(notes)
    after = lines[-1] == "(flood-1 node-a) after"  # (kept if the allowance had refilled)
    assert len(lines) == 1 + len(kept) + len(notes) + after
    # Every byte written was printed or counted as dropped.
    written = len("before\n") + total + len("after\n")
    printed = len("before\n") + len(kept) * 100 + (len("after\n") if after else 0)
    assert printed + sum(int(note[1]) for note in notes) == written


def test_a_worker_killed_mid_line_loses_only_its_output(
        cluster: zres.LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    with zres.Client(cluster.address) as client:
        with pytest.raises(zres.WorkerLostError):
            client.submit(die_mid_line).result(timeout=30)
        assert client.submit(shout, 5).result(timeout=30) == 10  # the next worker prints
        assert "(shout-2 node-a) hello 5\n" in capsys.readouterr().out


class _Printed:
    """What capsys has caught so far, kept across reads."""

    def __init__(self, capsys: pytest.CaptureFixture[str]) -> None:
        self._capsys = capsys
        self.text = ""

    def __call__(self) -> str:
        self.text += self._capsys.readouterr().out
        return self.text


def test_output_goes_on_after_a_broker_restart(make_cluster, capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    cluster = make_cluster([{"CPU": 1}], names=["node-a"])
    printed = _Printed(capsys)
    stop = tmp_path / "stop"
    with zres.Client(cluster.address) as client:
        future = client.submit(chatter, str(stop))
        wait_until(lambda: "(chatter-1 node-a) tick 3\n" in printed(), message="ticks")
        cluster.restart_broker()
        mark = len(printed())
        # Some ticks are lost while the broker is away; later ones come again.
        wait_until(lambda: "tick" in printed()[mark:], timeout=60, message="ticks again")
        stop.touch()
        assert future.result(timeout=60) == "finished"
        assert printed().endswith("(chatter-1 node-a) last words\n")


def test_an_agent_killed_while_its_task_prints_fails_the_task(
        make_cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    cluster = make_cluster([{"CPU": 1}], names=["node-a"], **LOSS)
    printed = _Printed(capsys)
    with zres.Client(cluster.address) as client:
        future = client.submit(chatter, str(tmp_path / "never"))
        wait_until(lambda: "(chatter-1 node-a) tick 3\n" in printed(), message="ticks")
        cluster.agents["node-a"].kill()
        with pytest.raises(zres.AgentLostError):
            future.result(timeout=60)
        cluster.add_agent({"CPU": 1}, name="node-b")
        assert client.submit(shout, 1).result(timeout=30) == 2
        assert printed().endswith("(shout-2 node-b) hello 1\n")


def test_an_agents_log_keeps_what_tasks_print_forwarded_or_not(make_cluster, spawn, tmp_path):
    cluster = make_cluster(agents=[])
    log = tmp_path / "agent.out"
    with open(log, "wb") as out:
        spawn([sys.executable, "-m", "zres", "agent", cluster.address, "--name", "logged",
               "--keys", str(cluster.keys), "--resources", "CPU=1", "--no-detect"],
              stdout=out)
    cluster.wait_for_agents(["logged"])
    with zres.Client(cluster.address, forward_output=False) as client:
        client.submit(print, "kept in the agent's log").result(30)
    wait_until(lambda: "kept in the agent's log" in log.read_text(),
               message="the print in the agent's output")


class Stalled:
    """A stream that blocks every write until released: a paused terminal."""

    def __init__(self) -> None:
        import threading
        self.release = threading.Event()
        self.text: list[str] = []

    def write(self, text: str) -> int:
        self.release.wait(60)
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_a_stalled_terminal_stalls_no_heartbeat_and_output_still_comes_first(
        make_cluster, monkeypatch):
    cluster = make_cluster(agents=[{"CPU": 1}])
    stalled = Stalled()
    monkeypatch.setattr(sys, "stdout", stalled)
    with zres.Client(cluster.address) as client:
        printed = client.submit(shout, 5)
        # The client's I/O thread is not stuck behind the terminal: the broker answers it.
        wait_until(lambda: client.status()["counts"].get("finished", 0) >= 1,
                   message="the task to end while the terminal is paused")
        assert not printed.done(), "its result came before its output was printed"
        stalled.release.set()
        assert printed.result(30) == 10
    assert any("shout" in text for text in stalled.text)
