"""Leak probe: an in-process broker (stepped in a thread under a lock), real agents."""
from __future__ import annotations
import collections, gc, os, signal, sqlite3, subprocess, sys, tempfile, threading, time
import zres
from zres.broker.server import Broker
from zres.broker.store import Store
from zres.core import keys

ROOT = tempfile.mkdtemp(prefix="hl-")
KEYS = os.path.join(ROOT, "keys"); keys.keygen(KEYS)
STATE = os.path.join(ROOT, "state")
lock = threading.Lock()
stop = threading.Event()
box: dict = {}

def start_broker(addr="tcp://127.0.0.1:0"):
    store = Store(STATE)
    b = Broker(addr, 0.2, 3.0, 30.0, store=store, keys=KEYS, client_grace=1.0)
    box["b"] = b
    keys.remember(b.address, KEYS)
    def loop():
        while not stop.is_set() and box.get("b") is b:
            with lock:
                b.poll_once(time.monotonic(), timeout=0.05)
    t = threading.Thread(target=loop, daemon=True); t.start(); box["t"] = t
    return b

def agent(name, addr):
    st = os.path.join(ROOT, "agent-" + name)
    return subprocess.Popen([sys.executable, "-m", "zres", "agent", addr, "--name", name,
                             "--state", st, "--keys", KEYS, "--nworkers", "2", "--nthreads", "2",
                             "--resources", "CPU=2 MEMORY=4e9", "--no-detect",
                             "--exit-with", str(os.getpid()), "--log-format", "json"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(ROOT, name + ".log"), "ab"))

def sizes(obj, path="b", depth=0, seen=None, out=None):
    if seen is None: seen, out = set(), {}
    if id(obj) in seen or depth > 5: return out
    seen.add(id(obj))
    if isinstance(obj, (dict, list, set, frozenset, collections.deque, tuple)):
        if not isinstance(obj, tuple): out[path] = len(obj)
        if isinstance(obj, dict):
            vals = list(obj.values())[:3]
        else:
            vals = list(obj)[:3] if not isinstance(obj, (set, frozenset)) else []
        # recurse into a few values, to find containers inside records
        for i, v in enumerate(vals):
            if type(v).__module__.startswith("zres"):
                sizes(v, path + "[*]", depth + 1, seen, out)
        return out
    mod = type(obj).__module__
    if not mod.startswith("zres"): return out
    names = []
    for k in type(obj).__mro__:
        names += list(getattr(k, "__slots__", ()))
    names += list(getattr(obj, "__dict__", {}).keys())
    for n in set(names):
        try: v = getattr(obj, n)
        except Exception: continue
        if callable(v) and not isinstance(v, (dict, list, set)) and not type(v).__module__.startswith("zres"): continue
        sizes(v, f"{path}.{n}", depth + 1, seen, out)
    return out

def proc_info(pid):
    try:
        rss = [l for l in open(f"/proc/{pid}/status") if l.startswith(("VmRSS", "Threads"))]
        r = {l.split(":")[0]: int(l.split()[1]) for l in rss}
        return {"rss_mib": round(r["VmRSS"] / 1024, 1), "thr": r["Threads"],
                "fds": len(os.listdir(f"/proc/{pid}/fd"))}
    except FileNotFoundError:
        return None

def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                s = open(f"/proc/{p}/stat").read()
                fields = s.rsplit(")", 1)[1].split()
                if int(fields[1]) == pid: out.append((int(p), fields[0]))
            except (FileNotFoundError, ProcessLookupError): pass
    return out

def files_under(d):
    n = 0
    for _, dirs, fs in os.walk(d): n += len(fs) + len(dirs)
    return n

def db_counts():
    path = os.path.join(STATE, "state.sqlite3")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tabs = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
    c = {t: con.execute(f"select count(*) from {t}").fetchone()[0] for t in tabs}
    con.close()
    c["_db_kib"] = os.path.getsize(path) // 1024
    wal = path + "-wal"
    c["_wal_kib"] = os.path.getsize(wal) // 1024 if os.path.exists(wal) else 0
    return c

def snapshot(agents):
    with lock:
        s = sizes(box["b"])
    s = {k: v for k, v in s.items()}
    rep = {"tables": s, "db": db_counts(), "me": proc_info(os.getpid()),
           "shm": len(os.listdir("/dev/shm")),
           "tmp": len([f for f in os.listdir("/tmp")]),
           "agents": {n: {**(proc_info(p.pid) or {}), "files": files_under(os.path.join(ROOT, "agent-" + n)),
                          "kids": children(p.pid)} for n, p in agents.items()},
           "zombies_me": [c for c in children(os.getpid()) if c[1] == "Z"]}
    return rep

def diff(a, b, label):
    print(f"== {label}")
    for k in sorted(set(a["tables"]) | set(b["tables"])):
        x, y = a["tables"].get(k, 0), b["tables"].get(k, 0)
        if y > x: print(f"   GREW {k}: {x} -> {y}")
    for k in b["db"]:
        if b["db"][k] != a["db"].get(k): print(f"   db {k}: {a['db'].get(k)} -> {b['db'][k]}")
    print("   me", a["me"], "->", b["me"], " shm", a["shm"], "->", b["shm"], " tmp", a["tmp"], "->", b["tmp"])
    for n in b["agents"]:
        print("   agent", n, a["agents"].get(n), "->", b["agents"][n])
    if b["zombies_me"]: print("   ZOMBIES", b["zombies_me"])
