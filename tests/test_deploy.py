"""The deployment examples in deploy/ say what the README promises: read as the tools that
apply them read them (YAML for Kubernetes, the units' keys for systemd)."""

from __future__ import annotations

from pathlib import Path

import yaml  # (dask's dependency, already installed for its tests)

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
