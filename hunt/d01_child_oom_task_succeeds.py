"""DEFECT 1: on cgroup v1 a task whose child process goes past the task's MEMORY limit
returns normally (the kernel OOM-kills the child only; subprocess.run returns -9 at once,
before the monitor's 50 ms sampler kills the rest), though README says the tree is killed
and the work fails with MemoryLimitError. Old code: prints 'returned -9'."""
import subprocess, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres  # noqa


def run_child():
    code = "b = bytearray(400 << 20); b[::4096] = b'\\1' * (len(b) // 4096)"
    return subprocess.run([sys.executable, "-c", code]).returncode


with zres.LocalCluster([{"CPU": 1, "MEMORY": 2e9}]) as cluster, \
        zres.Client(cluster.address) as client:
    f = client.submit(run_child, resources={"MEMORY": 200 << 20})
    try:
        print("returned", f.result(60), "(defect)")
    except zres.MemoryLimitError as e:
        print("MemoryLimitError:", e, "(fixed)")
