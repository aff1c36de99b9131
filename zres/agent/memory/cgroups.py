"""Per-task cgroups: a memory limit the kernel enforces, and how much was used.

cgroup v2 where the agent may make cgroups below its own (as root, or in a subtree
delegated to it: systemd's ``Delegate=yes``); else cgroup v1's memory controller, where a
host still keeps memory on the v1 (or hybrid) hierarchy and the agent may write there.

Each thing limited (a task's own process, an actor's, a command job) gets a cgroup of its
own, ``t-ID``, in the agent's directory ``zres-TAG`` below the agent's own cgroup (TAG
names the agent's state directory: its next start finds and removes what a killed agent
left). Its limit is ``memory.max`` (v1 ``memory.limit_in_bytes``), with no swap past it
(``memory.swap.max`` 0, v1 ``memory.memsw.limit_in_bytes``); on v2 the kernel kills the
whole cgroup together (``memory.oom.group``). ``memory.events``' ``oom_kill`` (v1
``memory.oom_control``'s) tells an out-of-memory kill from a crash; ``memory.peak`` (v1
``memory.max_usage_in_bytes``) is its peak.

On v2 a cgroup that holds processes cannot give its children a controller: an agent whose
cgroup is its own (a systemd service with ``Delegate=yes``) moves itself into a leaf,
``zres-agent``, first; one that shares its cgroup with other processes cannot, and says so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

_FILES = {2: {"limit": "memory.max", "current": "memory.current", "peak": "memory.peak",
              "events": "memory.events", "swap": "memory.swap.max"},
          1: {"limit": "memory.limit_in_bytes", "current": "memory.usage_in_bytes",
              "peak": "memory.max_usage_in_bytes", "events": "memory.oom_control",
              "swap": "memory.memsw.limit_in_bytes"}}


@dataclass(slots=True)
class Cgroups:
    """The agent's directory of task cgroups, on cgroup v2 or v1 (VERSION)."""

    version: int
    base: str

    @property
    def mode(self) -> str:
        return f"cgroup v{self.version}"

    def _file(self, path: str, what: str) -> str:
        return os.path.join(path, _FILES[self.version][what])

    def make(self, name: str, limit: int | None) -> str:
        """Make cgroup NAME limited to LIMIT bytes (None: no limit, figures only); return
        its path. One left there by an earlier agent goes first."""
        path = os.path.join(self.base, name)
        if os.path.isdir(path):
            self.kill(path)
            self.remove(path)
        if not os.path.isdir(self.base):  # (swept by another agent while it held nothing)
            os.mkdir(self.base)
            if self.version == 2:
                _write(os.path.join(self.base, "cgroup.subtree_control"), "+memory")
        os.mkdir(path)
        if limit is not None:
            _write(self._file(path, "limit"), str(limit))
            swap = self._file(path, "swap")
            if os.path.exists(swap):  # (v1: memory and swap together; v2: swap alone)
                with contextlib.suppress(OSError):
                    _write(swap, str(limit) if self.version == 1 else "0")
        if self.version == 2:
            with contextlib.suppress(OSError):  # (before 4.19 there is none)
                _write(os.path.join(path, "memory.oom.group"), "1")
        return path

    def enter(self, path: str, pid: int) -> None:
        """Move process PID into the cgroup at PATH (its children made later follow it)."""
        _write(os.path.join(path, "cgroup.procs"), str(pid))

    def usage(self, path: str) -> tuple[int, int]:
        """What the cgroup at PATH uses now, and the most it has used (its peak, where the
        kernel keeps one; else what it uses now)."""
        current = _int(self._file(path, "current")) or 0
        peak = _int(self._file(path, "peak"))
        return current, max(current, peak or 0)

    def oom_kills(self, path: str) -> int:
        """How many of the cgroup's processes the kernel killed for its limit."""
        try:
            text = Path(self._file(path, "events")).read_text()
        except OSError:
            return 0
        return parse_oom_kills(text)

    def pids(self, path: str) -> list[int]:
        try:
            text = Path(path, "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(line) for line in text.split() if line.isdigit()]

    def kill(self, path: str) -> None:
        """SIGKILL every process of the cgroup at PATH."""
        if self.version == 2 and os.path.exists(os.path.join(path, "cgroup.kill")):
            with contextlib.suppress(OSError):
                _write(os.path.join(path, "cgroup.kill"), "1")
        for pid in self.pids(path):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, path: str) -> bool:
        """Remove the (empty) cgroup at PATH; False while processes are still in it."""
        try:
            os.rmdir(path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    def leftovers(self) -> list[str]:
        """The task cgroups in the agent's directory (an earlier agent's, at start)."""
        try:
            return [os.path.join(self.base, e) for e in sorted(os.listdir(self.base))
                    if e.startswith("t-") and os.path.isdir(os.path.join(self.base, e))]
        except OSError:
            return []

    def sweep(self) -> int:
        """Remove what other agents killed outright left beside this one's directory and
        no process uses any more (an agent whose name is never started again, as a test's,
        would leave them for ever); return how many cgroups went. (One that a live agent
        has just made and not yet entered may go too: that agent then watches its work
        itself, as it does where it cannot make a cgroup.)"""
        removed = 0
        parent = os.path.dirname(self.base)
        try:
            others = [os.path.join(parent, e) for e in os.listdir(parent)
                      if e.startswith("zres-") and e != "zres-agent"
                      and os.path.join(parent, e) != self.base]
        except OSError:
            return 0
        for other in others:
            for path in Cgroups(self.version, other).leftovers():
                removed += not self.pids(path) and self.remove(path)
            removed += self.remove(other)
        return removed

    def close(self) -> None:
        """Remove the agent's directory (its task cgroups gone already, or going)."""
        for path in self.leftovers():
            self.kill(path)
            self.remove(path)
        self.remove(self.base)


def detect(tag: str, root: str = "/", move: bool = True) -> tuple[Cgroups | None, str]:
    """The agent's task cgroups (in ``zres-TAG`` below its own cgroup), and why not on v2
    if they are on v1; or None and why there are none. MOVE: on v2, the agent may move
    itself into a leaf of its own cgroup (it must, to give its children the memory
    controller) when it is alone there."""
    mountinfo = _read(Path(root, "proc/self/mountinfo"))
    own = _read(Path(root, "proc/self/cgroup"))
    found: Cgroups | None = None
    v2 = cgroup_dir(mountinfo, own, "cgroup2", "")
    if v2 is None:
        why_v2 = "cgroup v2: no hierarchy is mounted"
    else:
        found, why_v2 = _v2(Path(root, v2.lstrip("/")), tag, move)
        if found is not None:
            return found, ""
    v1 = cgroup_dir(mountinfo, own, "cgroup", "memory")
    if v1 is None:
        return None, f"{why_v2}; cgroup v1: no memory controller is mounted"
    found, why_v1 = _v1(Path(root, v1.lstrip("/")), tag)
    return found, why_v2 if found is not None else f"{why_v2}; {why_v1}"


def _v2(own: Path, tag: str, move: bool) -> tuple[Cgroups | None, str]:
    if "memory" not in _read(own / "cgroup.controllers").split():
        return None, (f"cgroup v2: {own} has no memory controller (it is on cgroup v1 here, "
                      "or not enabled in the cgroup above)")
    if not os.access(own / "cgroup.subtree_control", os.W_OK):
        return None, (f"cgroup v2: cannot make cgroups in {own} (run the agent as root, or "
                      "in a cgroup delegated to it: systemd's Delegate=yes)")
    try:
        if "memory" not in _read(own / "cgroup.subtree_control").split():
            try:
                _write(own / "cgroup.subtree_control", "+memory")
            except OSError as exc:  # EBUSY: processes in it (the agent, and others?)
                if exc.errno != errno.EBUSY:
                    raise
                others = [p for p in _read(own / "cgroup.procs").split()
                          if p != str(os.getpid())]
                if others or not move:
                    return None, (f"cgroup v2: {own} holds {len(others)} other process(es) "
                                  "besides the agent: give the agent a cgroup of its own "
                                  "(systemd: Delegate=yes)" if others else
                                  f"cgroup v2: the agent would have to leave {own} for a leaf")
                (own / "zres-agent").mkdir(exist_ok=True)
                _write(own / "zres-agent/cgroup.procs", str(os.getpid()))
                _write(own / "cgroup.subtree_control", "+memory")
        base = own / f"zres-{tag}"
        base.mkdir(exist_ok=True)
        if "memory" not in _read(base / "cgroup.subtree_control").split():
            _write(base / "cgroup.subtree_control", "+memory")
        return _probe(Cgroups(2, str(base)))
    except OSError as exc:
        return None, f"cgroup v2: {own}: {exc.strerror or exc}"


def _v1(own: Path, tag: str) -> tuple[Cgroups | None, str]:
    if not os.access(own, os.W_OK):
        return None, f"cgroup v1: cannot make cgroups in {own} (run the agent as root)"
    try:
        base = own / f"zres-{tag}"
        base.mkdir(exist_ok=True)
        return _probe(Cgroups(1, str(base)))
    except OSError as exc:
        return None, f"cgroup v1: {own}: {exc.strerror or exc}"


def _probe(cgroups: Cgroups) -> tuple[Cgroups | None, str]:
    """CGROUPS if a cgroup limited to 1 GiB can be made there (and removed)."""
    path = cgroups.make("t-probe", 1 << 30)
    cgroups.remove(path)
    return cgroups, ""


def cgroup_dir(mountinfo: str, own: str, fstype: str, controller: str) -> str | None:
    """Where this process's cgroup is, for cgroup v2 (FSTYPE "cgroup2") or a v1 CONTROLLER
    (FSTYPE "cgroup"), from /proc/self/mountinfo (MOUNTINFO) and /proc/self/cgroup (OWN);
    None if that hierarchy is not mounted or the cgroup is not under its mount."""
    path = None
    for line in own.splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3 and ((not controller and fields[0] == "0" and not fields[1])
                                 or controller in fields[1].split(",") and controller):
            path = fields[2]
    if path is None:
        return None
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        mount, types = left.split(), right.split()
        if len(mount) < 5 or len(types) < 3 or types[0] != fstype:
            continue
        if controller and controller not in types[2].split(","):
            continue
        top, point = _unescape(mount[3]), _unescape(mount[4])
        if top == "/":
            return point.rstrip("/") + path
        if path == top or path.startswith(top.rstrip("/") + "/"):
            return point.rstrip("/") + path[len(top.rstrip("/")):]
    return None


def parse_oom_kills(text: str) -> int:
    """The ``oom_kill`` count of a memory.events (v1: memory.oom_control) file's TEXT."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _unescape(text: str) -> str:
    """A mountinfo field with its octal escapes (a space is \\040) undone."""
    return text.encode().decode("unicode_escape") if "\\" in text else text


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: str | os.PathLike[str], text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


def _int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
