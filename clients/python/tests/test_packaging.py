"""The package as a user gets it: `python -m build` makes the sdist and,
from it, the wheel; the sdist installs into a fresh venv with its
dependencies at their floors (on the oldest Python that has wheels for
them, when one is on this machine) and runs a smoke script against the
broker, and mypy --strict checks user code against the installed package
(py.typed). The rest of the suite runs against the wheel, installed in the
suite's own venv by clients/setup.sh."""

import glob
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]

# The floors of pyproject.toml's dependencies for Python 3.9, the oldest
# Python it supports: what the fresh venv installs when such a Python is
# found (the old grpcio has no wheels for newer Pythons, and building it
# from source takes too long).
FLOOR_PYTHON = "3.9"
FLOOR_PINS = ["grpcio==1.38.1", "protobuf==4.21.1"]


def floor_python():
    """A python3.9 that runs: $LEASEQ_FLOOR_PYTHON, on PATH, or pyenv's."""
    candidates = [os.environ.get("LEASEQ_FLOOR_PYTHON"), shutil.which(f"python{FLOOR_PYTHON}")]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{FLOOR_PYTHON}*/bin/python{FLOOR_PYTHON}")))
    candidates += [f"/usr/bin/python{FLOOR_PYTHON}"]
    for c in candidates:
        if c and os.access(c, os.X_OK):
            ok = subprocess.run([c, "-c", "import venv, ensurepip"], capture_output=True, timeout=30)
            if ok.returncode == 0:
                return c
    return None


def sh(*cmd, timeout=300, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of the fresh venv, what was pinned) with the wheel installed."""
    tmp = tmp_path_factory.mktemp("pkg")
    # Built from a copy: setuptools writes build/ and *.egg-info next to the
    # sources, which would leave the checkout dirty.
    src = tmp / "src"
    # symlinks=False: LICENSE is a link to the repository's.
    shutil.copytree(HERE, src, symlinks=False,
                    ignore=shutil.ignore_patterns(".venv*", "build", "dist", "*.egg-info", "__pycache__", "tests", "examples"))  # fmt: skip
    sh(sys.executable, "-m", "build", "--outdir", tmp / "dist", src, timeout=300)
    (wheel,) = (tmp / "dist").glob("leaseq-*.whl")
    (sdist,) = (tmp / "dist").glob("leaseq-*.tar.gz")
    import tarfile
    import zipfile

    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for f in ("LICENSE", "README.md", "pyproject.toml", "leaseq/py.typed", "leaseq/v1/queue_pb2.pyi"):
        assert f in names, f"{f} in the sdist: {sorted(names)}"
    with zipfile.ZipFile(wheel) as z:
        assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in z.namelist()), z.namelist()
    base = floor_python()
    env_dir = tmp / "venv"
    if base is not None:
        sh(base, "-m", "venv", env_dir)
        pins = FLOOR_PINS
    else:
        venv.create(env_dir, with_pip=True)
        pins = []
        print(f"no python{FLOOR_PYTHON} here: the fresh venv gets the newest dependencies")
    py = env_dir / "bin" / "python"
    # The otel extra too: mypy checks examples/tracing.py against it (and
    # examples/exactly_once.py against psycopg).
    # The sdist: pip builds the wheel from it, as for a user without one.
    sh(py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
       f"leaseq[otel] @ {sdist.as_uri()}", "opentelemetry-sdk", "psycopg[binary]", *pins, timeout=600)  # fmt: skip
    return py, pins


def test_the_wheel_installs_into_a_fresh_venv_and_works(installed, addr):
    py, pins = installed
    # The install carries the stubs, the marker and the type stubs of the protos.
    files = sh(py, "-c", "import importlib.metadata as m; print('\\n'.join(str(f) for f in m.files('leaseq')))")
    for f in ("leaseq/py.typed", "leaseq/v1/queue_pb2.pyi", "leaseq/v1/admin_pb2_grpc.py"):
        assert f in files.split()
    out = sh(py, HERE / "tests" / "smoke.py", addr, cwd="/", timeout=120)
    assert "smoke ok" in out
    for pin in pins:
        name, version = pin.split("==")
        assert f"{name} {version}" in out, out
    print(out)


def test_mypy_strict_accepts_user_code_against_the_installed_package(installed, tmp_path):
    py, _ = installed
    # docs/clients.md's Python block, with what its handler calls.
    docs = (HERE.parent.parent / "docs" / "clients.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", docs, re.S)
    assert blocks, "docs/clients.md has a python block"
    docs_file = tmp_path / "docs_clients.py"
    docs_file.write_text("def mail_server_busy() -> bool:\n    return False\n\n\n" + "\n".join(blocks))
    user_files = [HERE / "tests" / "typed_user.py", *sorted((HERE / "examples").glob("*.py")), docs_file]
    # From a directory without the sources, so `leaseq` is the installed one.
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(py),
         "--cache-dir", str(tmp_path / "cache"), *map(str, user_files)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success" in r.stdout


def test_the_package_itself_passes_mypy_strict(tmp_path):
    """With grpcio's and protobuf's typeshed stubs (test extras); the
    generated leaseq/v1 is exempt (pyproject.toml)."""
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "leaseq"],
        cwd=HERE, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
