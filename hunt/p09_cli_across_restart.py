"""zres wait and zres logs --follow across a broker SIGKILL+restart; 300 jobs from
zres submit --file."""
import os, subprocess, sys, time, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import zres, wait  # noqa

d = tempfile.mkdtemp()
with zres.LocalCluster([{"CPU": 2}], nthreads=2) as cluster:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZRES_")}
    env.update(ZRES_KEYS=cluster.keys, ZRES_BROKER=cluster.address,
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))

    def zcli(*args, **kw):
        return subprocess.run([sys.executable, "-m", "zres", *args], env=env, text=True,
                              capture_output=True, cwd=d, **kw)

    lines = "\n".join(f"echo line-$((1+{i}))" for i in range(300)) + "\n"
    Path(d, "runs.txt").write_text(lines)
    t = time.monotonic()
    p = zcli("submit", "--file", "runs.txt")
    ids = p.stdout.split()
    print("submit --file: rc", p.returncode, len(ids), "ids in %.2f s" % (time.monotonic() - t),
          p.stderr[-200:])
    t = time.monotonic()
    p = zcli("wait", *ids, timeout=300)
    print("wait 300: rc", p.returncode, "%.1f s" % (time.monotonic() - t), p.stderr[-300:])
    # a job running 8 s, printing each 0.5 s
    p = zcli("submit", "--shell", "for i in $(seq 1 16); do echo tick $i; sleep 0.5; done; exit 3")
    jid = p.stdout.strip()
    print("job", jid, p.stderr)
    w = subprocess.Popen([sys.executable, "-m", "zres", "wait", jid], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lf = subprocess.Popen([sys.executable, "-m", "zres", "logs", "--follow", jid], env=env,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(2.5)
    cluster.restart_broker()
    print("restarted")
    time.sleep(1)
    cluster.restart_broker()
    print("restarted again")
    o, e = w.communicate(timeout=120)
    print("wait: rc", w.returncode, repr(o), repr(e[-400:]))
    o, e = lf.communicate(timeout=120)
    ticks = [l for l in o.splitlines() if l.startswith("tick")]
    print("logs --follow: rc", lf.returncode, len(ticks), "ticks", ticks[-1:] , repr(e[-400:]))
