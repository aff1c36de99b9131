"""The dashboard page, in a real headless browser (Debian's Chromium, driven by Selenium)
on a live cluster: what a user sees there, and that it follows the cluster live."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import wait_until
from tests.tasks import hold
from zres.core import keys as K

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1400,1000")


def chromium(profile: Path) -> webdriver.Chrome:
    """Headless Chromium with a fresh profile, driven by the system's chromedriver (so
    Selenium Manager downloads nothing)."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"the dashboard test needs {' and '.join(missing)}: install them with "
                    "`apt-get install chromium chromium-driver` (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    driver = chromium(tmp_path / "profile")
    try:
        yield driver
    finally:
        driver.quit()


def alice_keys(cluster_keys: str, into: Path) -> str:
    """A directory holding the broker's public key and a client key named alice."""
    made = K.keygen(cluster_keys, role="client", name="alice")
    into.mkdir()
    shutil.copy(Path(cluster_keys) / f"{K.BROKER}.key", into)
    shutil.copy(made[0], into)
    return str(into)


def text(browser: webdriver.Chrome, css: str) -> str:
    """What the elements at CSS show (read again when the page redrew one as it was read:
    it redraws as the cluster changes)."""
    for _ in range(100):
        try:
            return "\n".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, css))
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{css} was redrawn at each of 100 reads")


def shows(browser: webdriver.Chrome, css: str, wanted: str, timeout: float = 20) -> str:
    """Wait until the elements at CSS show WANTED; return what they show."""
    seen = [""]

    def showing(b: webdriver.Chrome) -> str | bool:
        seen[0] = text(b, css)
        return seen[0] if wanted in seen[0] else False

    try:
        return WebDriverWait(browser, timeout).until(showing)
    except TimeoutException:
        raise AssertionError(f"{css} did not show {wanted!r} within {timeout}s; it shows "
                             f"{seen[0]!r}") from None


@pytest.mark.filterwarnings("ignore::zres.InfeasibleWarning")
def test_the_dashboard_shows_the_cluster_and_follows_it(make_cluster, make_client, browser,
                                                        tmp_path):
    cluster = make_cluster(agents=[{"GPU": 2, "MEMORY": "64GiB"}, {"licence": 1}],
                           nthreads=2, names=["gpu-node", "lic-node"], http="127.0.0.1:0")
    client = make_client(cluster.address)
    alice = make_client(cluster.address, keys=alice_keys(cluster.keys, tmp_path / "alice"))
    release, marker = str(tmp_path / "release"), str(tmp_path / "started")
    training = client.submit(hold, release, marker, resources={"GPU": 1}, key="train")
    wait_until(lambda: os.path.exists(marker), message="the GPU task to start")
    never = [client.submit(pow, 2, 2, resources={"GPU": 4}, key=f"huge{i}") for i in range(3)]
    never.append(client.submit(pow, 2, 2, resources={"MEMORY": "128GiB"}, key="big"))
    wait_until(lambda: all(f.infeasible for f in never), message="infeasible warnings")
    job = alice.submit_command(["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done"],
                               resources={"licence": 1}, name="render")
    wait_until(lambda: any(j["state"] == "running" for j in alice.jobs()),
               message="the job to run")

    browser.get(cluster.dashboard)
    WebDriverWait(browser, 20).until(lambda b: b.find_element(By.TAG_NAME, "body")
                                     .get_attribute("data-ready") == "1")
    assert browser.title == "zres dashboard"
    assert cluster.address in text(browser, "#broker")
    # Agents, each resource with its free / total, and the GPUs.
    gpu_node = '[data-agent="gpu-node"]'
    assert shows(browser, f'{gpu_node} [data-resource="GPU"]', "1 / 2 free")
    assert "64 GiB / 64 GiB free" in text(browser, f'{gpu_node} [data-resource="MEMORY"]')
    assert "GPUs 0, 1" in text(browser, gpu_node)
    assert "0 / 1 free" in text(browser, '[data-agent="lic-node"] [data-resource="licence"]')
    # Work that waits: one row per request, with its count, state and reason, amounts as
    # given (64 GiB, not 68.72G).
    waiting = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#waiting tbody tr")]
    assert waiting == ["3 queued CPU=1 GPU=4 infeasible: needs GPU=4, largest agent has GPU=2 "
                       "huge0, huge1, huge2",
                       "1 queued CPU=1 MEMORY=128 GiB infeasible: needs MEMORY=128 GiB, "
                       "largest agent has MEMORY=64 GiB big"]
    # The job, with its owner and state; the running task, with its owner and client.
    [job_id] = alice.job_ids([job])
    assert text(browser, "#jobs tbody") == \
        f"{job_id} render alice running lic-node CPU=1 licence=1 zres logs {job_id}"
    running = text(browser, "#running tbody").split("\n")
    assert running[0].startswith(f"train (id {training.id}) admin gpu-node CPU=1 GPU=1 ")
    assert running[1].startswith(f"render (id {job_id}) alice lic-node CPU=1 licence=1 ")
    assert all(row.endswith(" connected") for row in running)
    # The job has a process of its own: its memory, now and at most (issue 30), once its
    # agent has beaten; the task shares its slot's pooled process: none of its own.
    running = shows(browser, "#running tbody", " (peak ").split("\n")
    assert " (peak " in running[1] and " - connected" in running[0], running
    # The tasks' states, in the words of every view.
    assert text(browser, "#counts [data-state]").split("\n") == [
        "0 waiting", "4 queued", "2 running", "0 finished", "0 error", "0 cancelled"]
    # Tasks by state over time: a line per state, a point per refresh.
    lines = browser.find_elements(By.CSS_SELECTOR, "#history polyline")
    assert len(lines) == 3 and lines[2].get_attribute("stroke") == "#2f80ed"  # running

    # Live: what finishes shows as finished, and the GPU comes back, with no reload.
    Path(release).touch()
    assert training.result(30) == "released" and job.result(30).exit_code == 0
    shows(browser, f'{gpu_node} [data-resource="GPU"]', "2 / 2 free")
    shows(browser, "#jobs tbody", f"{job_id} render alice done")
    shows(browser, "#running tbody", "nothing runs")
    client.cancel(never)
    shows(browser, "#waiting tbody", "nothing waits or is queued")
    shows(browser, "#ended", "ended since the broker started: 2 finished, 0 error, "
          "4 cancelled")
    # A placement group: its owner, state, strategy and each bundle with where it is.
    pg = client.placement_group([{"GPU": 1}], name="shown")
    pg.ready().result(30)
    assert shows(browser, "#placement-groups tbody", "on gpu-node") == \
        "shown admin ready PACK [0] GPU=1 on gpu-node"
    pg.remove()
    shows(browser, "#placement-groups tbody", "no placement groups")
