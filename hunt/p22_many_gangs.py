"""Twelve gangs competing for three agents of gpu=2 (multi-node jobs of 2 and 3 nodes,
placement groups PACK/SPREAD/STRICT_*), each holding briefly: all finish, none deadlocks,
everything free at the end, no rank ran twice."""
from common import *  # noqa


def where():
    import time
    time.sleep(0.2)
    return zres.get_task_context().agent


out = tempfile.mkdtemp()
with zres.LocalCluster(agents=[{"gpu": 2}] * 3, names=["a", "b", "c"], heartbeat_interval=0.2) as c, \
        zres.Client(c.address) as cl:
    t = time.monotonic()
    jobs = [cl.submit_command(["sh", "-c", 'echo x >> "$OUT/$ZRES_JOB_ID-$NODE_RANK"; sleep 0.3'],
                              nodes=n, resources={"gpu": g}, env={"OUT": out})
            for n, g in [(2, 2), (3, 1), (2, 1), (3, 2), (2, 2), (3, 1)]]
    groups = [cl.placement_group(b, strategy=s) for b, s in [
        ([{"gpu": 2}] * 3, "STRICT_SPREAD"), ([{"gpu": 1}] * 4, "PACK"),
        ([{"gpu": 1}] * 2, "STRICT_PACK"), ([{"gpu": 2}] * 2, "SPREAD"),
        ([{"gpu": 1}] * 6, "SPREAD"), ([{"gpu": 2}], "STRICT_SPREAD")]]
    done_groups, left = 0, list(groups)
    deadline = time.monotonic() + 90
    while left and time.monotonic() < deadline:
        for pg in [g for g in left if g.ready().done()]:
            pg.ready().result()
            cl.submit(where, placement=(pg, 0)).result(30)
            pg.remove()
            left.remove(pg)
            done_groups += 1
        time.sleep(0.05)
    for pg in left:
        print("still waiting:", cl.why(pg))
    codes = [j.result(60).exit_code for j in jobs]
    print(f"groups done {done_groups}, job exit codes {codes} in {time.monotonic()-t:.1f}s")
    counts = {p.name: len(p.read_text().split()) for p in Path(out).iterdir()}
    print("each rank once:", all(v == 1 for v in counts.values()), len(counts), "rank files")
    wait(lambda: free_everywhere(cl), 20, "free")
    print("all free")
