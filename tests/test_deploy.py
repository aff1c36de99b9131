"""The deployment examples in deploy/ say what the README promises: read as the tools that
apply them read them (YAML for Kubernetes, the units' keys for systemd)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # (dask's dependency, already installed for its tests)

from tests.conftest import wait_until

pytestmark = pytest.mark.timeout(100)

DEPLOY = Path(__file__).parent.parent / "deploy"


def test_the_kubernetes_broker_keeps_its_state_on_a_volume_and_probes_apart():
    docs = {(d["kind"], d["metadata"]["name"]): d
            for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "zres.yaml").read_text())}
    claim = docs["PersistentVolumeClaim", "zres-broker-state"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    pod = docs["Deployment", "zres-broker"]["spec"]["template"]["spec"]
    (broker,) = pod["containers"]
    volume = next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)
    assert volume["persistentVolumeClaim"]["claimName"] == "zres-broker-state"
    mount = next(m for m in broker["volumeMounts"] if m["name"] == volume["name"])
    state = broker["args"][broker["args"].index("--state") + 1]
    assert state.startswith(mount["mountPath"] + "/") and not mount.get("readOnly")
    assert broker["readinessProbe"] != broker["livenessProbe"]
    assert broker["livenessProbe"]["httpGet"]["path"] == "/health"
    assert docs["Deployment", "zres-broker"]["spec"]["strategy"]["type"] == "Recreate"


def test_the_systemd_units_keep_their_state_private():
    for unit in ("zres-broker.service", "zres-agent.service"):
        lines = (DEPLOY / "systemd" / unit).read_text().splitlines()
        assert "StateDirectoryMode=0700" in lines, unit


def test_the_systemd_agent_may_make_cgroups_for_its_tasks_memory_limits():
    lines = (DEPLOY / "systemd" / "zres-agent.service").read_text().splitlines()
    assert "Delegate=yes" in lines and "KillMode=control-group" in lines


def test_every_kubernetes_pod_can_read_the_keys_it_mounts():
    """A Secret's files belong to root, mode defaultMode, unless the pod has an fsGroup
    (then they are that group's, and readable by it): a non-root container whose Secret is
    0400 without one cannot read its keys (the agents failed so, at start)."""
    for doc in yaml.safe_load_all((DEPLOY / "kubernetes" / "zres.yaml").read_text()):
        pod = doc.get("spec", {}).get("template", {}).get("spec")
        if pod is None:
            continue
        for volume in pod.get("volumes", []):
            mode = volume.get("secret", {}).get("defaultMode", 0o644)
            if "secret" in volume and not mode & 0o004:
                context = pod.get("securityContext", {})
                assert not context.get("runAsNonRoot") or context.get("fsGroup"), \
                    f"{doc['metadata']['name']} cannot read {volume['name']}"


# Slurm's commands as one node sees them: srun runs its command here, once.
SHIMS = {"srun": 'while [ "${1#-}" != "$1" ]; do shift; done; exec "$@"',
         "scontrol": "echo node1", "hostname": "echo 127.0.0.1"}


def _job_ids(count: int) -> list[int]:
    """Slurm job ids whose broker ports (20000 + id % 20000) are free here."""
    ids = []
    for job in range(os.getpid() % 20000, 40000):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", 20000 + job % 20000)) != 0:
                ids.append(job)
        if len(ids) == count:
            return ids
    raise AssertionError("no free ports")


def test_two_slurm_jobs_of_one_user_on_one_node_each_run_their_cluster(tmp_path):
    """The batch script, with Slurm's commands played by shims and its broker on loopback,
    run as two jobs of one user sharing a node: the second one's agent could not start
    (the first's held ~/.local/state/zres/agent-NODE), so that job waited 120 s and
    failed. Each cleans up after itself."""
    shims = tmp_path / "bin"
    shims.mkdir()
    for name, body in SHIMS.items():
        (shims / name).write_text(f"#!/bin/bash\n{body}\n")
        (shims / name).chmod(0o755)
    script = tmp_path / "zres-cluster.sbatch"
    script.write_text((DEPLOY / "slurm" / "zres-cluster.sbatch").read_text()
                      .replace("tcp://0.0.0.0:", "tcp://127.0.0.1:"))
    (tmp_path / "home").mkdir()
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ZRES_", "XDG_", "SLURM"))}
    env.update(HOME=str(tmp_path / "home"), TMPDIR=str(tmp_path / "tmp"),
               PATH=f"{shims}:{Path(sys.executable).parent}:{env['PATH']}",
               SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node1", SLURMD_NODENAME="node1")
    first, second = _job_ids(2)
    running, release = tmp_path / "running", tmp_path / "release"
    holds = (f"open({str(running)!r}, 'w').close(); "
             f"from tests.conftest import wait_until; import os; "
             f"wait_until(lambda: os.path.exists({str(release)!r}), 60)")
    jobs = []

    def start(job_id: int, *command: str) -> subprocess.Popen[str]:
        # (a session of its own: a job that fails the test is stopped with its daemons)
        jobs.append(subprocess.Popen(["bash", str(script), *command], text=True,
                                     env={**env, "SLURM_JOB_ID": str(job_id)},
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True))
        return jobs[-1]

    try:
        job = start(first, sys.executable, "-c", holds)
        wait_until(lambda: running.exists() or job.poll() is not None, 60,
                   message="the first job's command to start")
        assert job.poll() is None, job.communicate()[0]
        other = start(second, "zres", "status")
        out = other.communicate(timeout=80)[0]
        assert other.returncode == 0, out
        assert out.count("node1 ") == 2, out  # (the script's own status, then the command's)
        release.touch()
        out = job.communicate(timeout=60)[0]
        assert job.returncode == 0, out
    finally:
        release.touch()
        for each in jobs:
            if each.poll() is None:
                os.killpg(each.pid, 9)
                each.communicate()
    assert list((tmp_path / "tmp").iterdir()) == [], "a job left its state behind"
    assert not list((tmp_path / "home").glob(".zres-job-*")), "a job left its keys behind"
