"""Shared helpers for the hunt probes (not part of the package)."""
import os, signal, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zres  # noqa: E402

RANK = ('echo $$ > "$OUT/pid-$ZRES_AGENT-$NODE_RANK-$ZRES_JOB_ID"; '
        'while [ ! -e "$OUT/go" ]; do sleep 0.05; done')


def wait(cond, timeout=30, msg="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {msg}")
        time.sleep(0.05)


def pids(out, agent, job_id):
    return [int(p.read_text()) for p in Path(out).glob(f"pid-{agent}-*-{job_id}")]


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def job(client, fut):
    for j in client.jobs(all=True):
        if j["id"] == fut.id:
            return j


def free_everywhere(client):
    return all(s["free"] == s["total"] for a in client.status()["agents"] for s in a["slots"])


def slots(client):
    return {a["name"]: [(s["free"], s["total"]) for s in a["slots"]]
            for a in client.status()["agents"]}


def key_dir(cluster, stem):
    """A directory holding the broker's public key and STEM's secret key."""
    mine = Path(tempfile.mkdtemp()) / f"keys-{stem}"
    mine.mkdir()
    for file in ("broker.key", f"{stem}.key_secret"):
        (mine / file).write_bytes(Path(cluster.keys, file).read_bytes())
    return str(mine)


def cli(*args, keys=None, timeout=60):
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
    if keys is not None:
        env["ZRES_KEYS"] = keys
    return subprocess.run([sys.executable, "-m", "zres", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
