import os, signal, sys, time
from pathlib import Path
import tempfile
sys.path.insert(0, os.getcwd())
import cloudpickle, tests
cloudpickle.register_pickle_by_value(tests)
import zres
from tests.conftest import wait_until, stop_process
from tests.tasks import hold, starts
from tests.e2e.test_pipelining import make_short
from tests.e2e.test_direct_results import big, store_dir, length, touch

tmp = Path(tempfile.mkdtemp())
cluster = zres.LocalCluster(agents=[{"slot": 1, "other": 1, "CPU": 4}], names=["a"], heartbeat_interval=0.2, heartbeat_timeout=20.0)
try:
    client = zres.Client(cluster.address)
    ledger, warm = str(tmp / "ledger"), str(tmp / "warm")
    make_short(client, tmp)
    zres.wait([client.submit(length, b"", warm, "w", warm, resources={"other": 1}) for _ in range(10)], timeout=30)
    value = client.submit(big, 200_000, resources={"other": 1}); zres.wait([value], timeout=30)
    path = os.path.join(client.submit(store_dir, resources={"other": 1}).result(30), str(value.id))
    release, marker = str(tmp / "release"), str(tmp / "b")
    first = client.submit(hold, release, marker, resources={"slot": 1})
    wait_until(lambda: os.path.exists(marker))
    then = str(tmp / "then")
    x = client.submit(length, value, ledger, "x", then, resources={"slot": 1}, retries=0)
    after = client.submit(length, b"z", ledger, "z", then, resources={"slot": 1}, retries=0)
    wait_until(lambda: all("its worker holds it" in client.why(f) for f in (x, after)))
    client.submit(touch, str(tmp / "y"), resources={"other": 1}).result(30)
    agent = cluster.agents["a"]
    os.rename(path, path + ".kept"); Path(path).write_bytes(b"")
    stop_process(agent.pid)
    try:
        Path(release).touch()
        wait_until(lambda: starts(ledger).get("z"))
        Path(then).touch()
        print("after", after.result(15), "why x", client.why(x))
        os.rename(path + ".kept", path)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    for i in range(10):
        print(round(time.monotonic() % 100, 2), "why x", client.why(x), starts(ledger)); time.sleep(0.3)
    print("x", x.result(30), "first", first.result(30))
    fs = client.map(touch, [str(tmp / f"t{i}") for i in range(4)], resources={"slot": 1})
    time.sleep(3)
    print([f.done() for f in fs], client.why(fs[0]))
    print("starts", starts(ledger))
finally:
    cluster.close()
