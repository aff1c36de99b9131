"""Probe: the broker killed while a client uploads a big argument through the relay; what
is left on the agents afterwards."""
import sys
import threading
import time

import zres
from p3_faults import store_files

N = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 1 << 30


def size(v):
    return len(v)


import weakref as _wr
from zres.client import futures as _fm
_made = []
_orig_init = _fm.Future.__init__
def _init(self, *a, **k):
    _orig_init(self, *a, **k)
    _made.append(_wr.ref(self))
_fm.Future.__init__ = _init


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1, "MEMORY": 12e9}, {"B": 1, "MEMORY": 12e9}]) as c:
        cl = zres.Client(c.address)
        v = b"\x03" * N
        threading.Timer(1.0, c.restart_broker).start()
        t0 = time.monotonic()
        print("got", cl.submit(size, v, resources={"B": 1}).result(120),
              f"after {time.monotonic()-t0:.1f}s", flush=True)
        del v
        for _ in range(40):
            time.sleep(2)
            files = store_files(c)
            if not any(n for n, _ in sum(files.values(), []) if ".part" not in n):
                break
        print("files:", files)
        st = c.status()
        print("io held:", sorted(cl._io.held), "pending:", list(cl._io.pending), "keys:", list(st)[:30], st.get("counts"))
        import gc
        from zres.client.futures import Future
        gc.collect()
        alive = [o for o in gc.get_objects() if type(o).__name__ == "Future" and hasattr(o, "_local")]
        import sys as _s, traceback as _tb
        def frames_of(f):
            while f is not None:
                yield f
                f = f.f_back
        for tid, top in _s._current_frames().items():
          for frame in frames_of(top):
            for name, val in list(frame.f_locals.items()):
                if type(val).__name__ == "Future" or (isinstance(val, list) and val and type(val[0]).__name__ == "Future"):
                    print("frame local", tid, frame.f_code.co_name, name, flush=True)
        print("alive futures:", [(f._local, f.name) for f in alive])
        for r in _made:
            f = r()
            if f is not None:
                print("ALIVE", f._local, f.name, [ (type(x).__name__, getattr(getattr(x, "f_code", None), "co_name", None)) for x in gc.get_referrers(f)])
        import threading as _th
        print("threads:", [t.name for t in _th.enumerate()])
        print("objects with _local:", [(type(o).__module__, type(o).__name__, o._local) for o in gc.get_objects() if hasattr(o, "_local") and hasattr(o, "_release_when_dropped")][:10])
        for f in alive:
            print("  referrers of", f._local, [type(r).__name__ for r in gc.get_referrers(f)][:8])
        print("tasks:", st.get("tasks"), [(a["name"], a["store"]) for a in st["agents"]])
        cl.close()
