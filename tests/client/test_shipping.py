"""Shipping code: a module beside the user's script, which agents cannot import, fails a
task with ModuleNotFoundError unless the client ships it (sends it by value)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zres

pytestmark = pytest.mark.timeout(90)

MODULE = '''
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y

def double(x):
    return 2 * x

def where(x, y):
    return Point(x, y)
'''

SCRIPT = '''
import sys, zres
import shipme_{tag}

address, keys, how = sys.argv[1:]
mod = shipme_{tag}
client = zres.Client(address, keys=keys, modules=[mod] if how == "modules" else [])
if how == "ship":
    client.ship(mod)
try:
    point = client.submit(mod.where, client.submit(mod.double, 21), 1).result(timeout=30)
    print("ok", point.x, point.y, type(point).__name__)
except Exception as exc:
    print("failed", type(exc).__name__, exc, *getattr(exc, "__notes__", []))
client.close()
'''


def run_user_script(tmp_path: Path, cluster: zres.LocalCluster, how: str) -> str:
    """A user's script beside its own module, as a user runs it: from its directory."""
    tag = how
    (tmp_path / f"shipme_{tag}.py").write_text(MODULE)
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT.format(tag=tag)))
    done = subprocess.run([sys.executable, "script.py", cluster.address, cluster.keys, how],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_module_agents_cannot_import_fails_the_task_unless_shipped(tmp_path, make_cluster):
    cluster = make_cluster([{"CPU": 2}])
    out = run_user_script(tmp_path, cluster, "none")
    assert out.startswith("failed ModuleNotFoundError") and "shipme_none" in out, out
    # Its note says where it was missing and how to send it there.
    assert f"cannot be imported on agent {cluster.status()['agents'][0]['name']}" in out, out
    assert "zres.Client(modules=[shipme_none]) or client.ship(shipme_none)" in out, out
    assert run_user_script(tmp_path, cluster, "ship") == "ok 42 1 Point"
    assert run_user_script(tmp_path, cluster, "modules") == "ok 42 1 Point"


def test_shipping_something_not_a_module_is_refused(make_cluster, make_client):
    with pytest.raises(TypeError, match=r"ship\(\) takes modules, not str 'json'"):
        zres.Client("tcp://127.0.0.1:9", modules=["json"])  # (refused before connecting)
    cluster = make_cluster([{"CPU": 1}])
    client = make_client(cluster.address, keys=cluster.keys)
    with pytest.raises(TypeError, match="not function"):
        client.ship(test_shipping_something_not_a_module_is_refused)
