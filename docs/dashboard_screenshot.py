"""Take docs/dashboard.png: the dashboard of a small live cluster with some work, in
headless Chromium (as tests/e2e/test_dashboard.py drives it).

    python docs/dashboard_screenshot.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zres  # noqa: E402
from tests.e2e.test_dashboard import chromium  # noqa: E402
from tests.tasks import wait_for_file  # noqa: E402


class Model:
    def predict(self, x: int) -> int:
        return 2 * x


def main() -> None:
    work = Path(tempfile.mkdtemp())
    release = str(work / "release")
    with zres.LocalCluster([{"GPU": 4, "MEMORY": "256GiB"}, {"GPU": 2, "MEMORY": "128GiB"},
                            {"MEMORY": "64GiB", "licence": 2}], nthreads=8,
                           names=["gpu-a", "gpu-b", "cpu-1"], http="127.0.0.1:0") as cluster:
        client = zres.Client(cluster.address)
        browser = chromium(work / "profile")
        browser.set_window_size(1400, 1300)
        browser.get(cluster.dashboard)
        futures = []
        for i in range(12):  # some history for the chart: work arriving and finishing
            futures += [client.submit(time.sleep, 0.2 * (j % 5), key=f"prep-{i}-{j}")
                        for j in range(20)]
            time.sleep(1)
        futures += [client.submit(wait_for_file, release, 600, resources={"GPU": 2},
                                  key=f"train-{i}") for i in range(4)]
        futures += [client.submit(wait_for_file, release, 600, resources={"GPU": 1},
                                  key=f"finetune-{i}") for i in range(5)]
        giant = client.submit(wait_for_file, release, 600, resources={"GPU": 8}, key="giant")
        futures += [client.submit(wait_for_file, release, 600,
                                  resources={"MEMORY": "48GiB"}, key=f"etl-{i}")
                    for i in range(4)]
        jobs = [client.submit_command(["sh", "-c", f"until [ -e {release} ]; do sleep 0.1; "
                                       "done"], resources={"licence": 1}, name=f"render-{i}")
                for i in range(3)]
        model = client.actor(Model, resources={"CPU": 1}, name="model")
        model.predict(2).result(30)
        time.sleep(8)
        browser.save_screenshot(str(ROOT / "docs" / "dashboard.png"))
        browser.quit()
        Path(release).touch()
        client.cancel(giant)
        for f in futures + jobs:
            f.result(60)
        client.close()


if __name__ == "__main__":
    main()
