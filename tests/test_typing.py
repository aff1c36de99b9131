"""zres is typed for its users: mypy infers what a submitted function returns through
``submit``, ``map`` and ``gather``, and flags a result used as what it is not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import zres

ROOT = Path(zres.__file__).parent.parent

SNIPPET = """
import zres

def inc(x: int) -> int:
    return x + 1

def name(x: int) -> str:
    return str(x)

client = zres.Client()
reveal_type(client.submit(inc, 1))
reveal_type(zres.submit(name, 1))
reveal_type(client.map(inc, [1, 2]))
reveal_type(zres.map(name, [1, 2]))
reveal_type(zres.submit(inc, 1).result())
reveal_type(zres.gather(zres.submit(name, 1)))
reveal_type(zres.gather(zres.map(inc, [1])))
wrong: str = zres.submit(inc, 1).result()
"""


def test_mypy_infers_a_future_of_what_the_function_returns(tmp_path):
    snippet = tmp_path / "snippet.py"
    snippet.write_text(textwrap.dedent(SNIPPET))
    # (run from the checkout: mypy cannot follow an editable install's import hook)
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary",
                           "--cache-dir", str(tmp_path / "cache"), str(snippet)],
                          cwd=ROOT, capture_output=True, text=True, timeout=110)
    revealed = [line.split("Revealed type is ", 1)[1].strip('"') for line in
                done.stdout.splitlines() if "Revealed type is" in line]
    assert revealed == ["zres.client.futures.Future[builtins.int]",
                        "zres.client.futures.Future[builtins.str]",
                        "builtins.list[zres.client.futures.Future[builtins.int]]",
                        "builtins.list[zres.client.futures.Future[builtins.str]]",
                        "builtins.int", "builtins.str", "builtins.list[builtins.int]"] \
        or revealed == ["zres.client.futures.Future[int]", "zres.client.futures.Future[str]",
                        "list[zres.client.futures.Future[int]]",
                        "list[zres.client.futures.Future[str]]", "int", "str", "list[int]"], \
        done.stdout
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    wrong = textwrap.dedent(SNIPPET).splitlines().index(
        "wrong: str = zres.submit(inc, 1).result()") + 1
    assert len(errors) == 1 and f"snippet.py:{wrong}:" in errors[0], done.stdout
    assert 'expression has type "int", variable has type "str"' in errors[0]
    assert done.returncode == 1


def test_the_package_says_it_is_typed():
    assert (ROOT / "zres" / "py.typed").is_file()
