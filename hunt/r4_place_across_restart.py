"""Reproducer: a big argument's put asked of a broker that dies before it answers (here
stopped, then killed and restarted on its state): submit() raises BrokerLostError, though
the client carries every other submit over a broker restart by itself."""
import os
import signal
import threading
import time
import traceback

import zres


def size(v):
    return len(v)


if __name__ == "__main__":
    with zres.LocalCluster([{"A": 1}]) as c:
        cl = zres.Client(c.address)
        os.kill(c.broker.pid, signal.SIGSTOP)
        out = []

        def go():
            try:
                out.append(cl.submit(size, b"x" * (2 << 20)).result(60))
            except Exception as exc:
                out.append(exc)
                traceback.print_exc()
        t = threading.Thread(target=go)
        t.start()
        time.sleep(1.0)  # (its PLACE sent, unanswered)
        c.restart_broker()  # (SIGKILL works on a stopped process)
        t.join(120)
        small = cl.submit(size, b"x" * 10).result(60)
        print("big:", out, "small after:", small)
        cl.close()
