"""The series launches the three ways learners use it: JupyterLab, Binder, Colab.

- JupyterLab: a real server, started with the command the README gives, headless on a
  loopback port. Through its REST API its file browser lists each notebook once; a
  kernel started by that server runs notebook 01 cell by cell over the kernel websocket;
  a notebook saved through it with its outputs (as JupyterLab's autosave does) leaves its
  MyST source unchanged and the structure tests green; then the server is shut down and
  its process ended by its id.
- Binder: the repo2docker recipe in ``binder/`` is replayed in a new virtual
  environment (pins, postBuild, start script), and its pins must match
  ``requirements.txt``.
- Colab: the bootstrap cell is exercised in ``test_notebooks.py`` with a fake Colab
  module.
Nothing here reaches the network: the server binds 127.0.0.1 only, and the Binder
replay layers a new environment over the installed pins.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import secrets
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
LOOPBACK = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def readme_lab_command() -> list[str]:
    """The ``jupyter lab ...`` command of the README's "come back later" line, as arguments."""
    text = (ROOT / "README.md").read_text()
    lines = [ln for ln in re.findall(r"^(.*jupyter lab.*)$", text, re.M) if "&&" in ln]
    assert lines, "the README gives no command that starts JupyterLab"
    commands = {ln.split("&&")[-1].strip() for ln in lines}
    assert len(commands) == 1, f"the README starts JupyterLab in more than one way: {commands}"
    return commands.pop().split()


class JupyterServer:
    """A Jupyter server started as the README starts it, headless, on a free loopback port."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        self.base = f"http://{LOOPBACK}:{self.port}"
        self.log = (
            tempfile.TemporaryFile()
        )  # a file, not a pipe: a full pipe would block the server
        command = readme_lab_command()
        assert command[:2] == ["jupyter", "lab"], command
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter",
                "lab",
                *command[2:],
                "--no-browser",
                f"--ServerApp.ip={LOOPBACK}",
                f"--ServerApp.port={self.port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={self.token}",
                "--allow-root",
            ],  # fmt: skip
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def request(self, method: str, path: str, body: dict | None = None) -> dict | list | None:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", f"token {self.token}")
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"jupyter server exited: {self.log.read().decode()[-2000:]}")
            try:
                self.request("GET", "/api/status")
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError("jupyter server did not answer in time")

    def stop(self) -> None:
        try:
            self.request("POST", "/api/shutdown")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def _execute(ws, code: str, timeout: float = 300) -> tuple[str, str]:
    """Send one execute_request over the kernel websocket; return (status, text output)."""
    msg_id = uuid.uuid4().hex
    ws.send(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "username": "test",
                    "session": "s",
                    "msg_type": "execute_request",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": True,
                    "user_expressions": {},
                    "allow_stdin": False,
                },
                "channel": "shell",
                "buffers": [],
            }
        )
    )
    out, status, idle = [], None, False
    deadline = time.monotonic() + timeout
    while (status is None or not idle) and time.monotonic() < deadline:
        ws.settimeout(max(1.0, deadline - time.monotonic()))
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "execute_reply":
            status = msg["content"]["status"]
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    if status is None:
        raise TimeoutError(f"no execute_reply within {timeout}s for: {code[:60]!r}")
    return status, "".join(out)


def test_jupyter_server_lists_and_runs_notebooks():
    import websocket

    env = {**os.environ, "NUM_DEVICES": "2", "MPLBACKEND": "Agg"}
    server = JupyterServer(ROOT, env)
    pid = server.proc.pid
    try:
        server.wait_ready()
        # The README's command opens JupyterLab on the notebooks folder, as Binder's urlpath does.
        with urllib.request.urlopen(f"{server.base}/?token={server.token}", timeout=30) as r:
            assert urllib.parse.urlparse(r.url).path == "/lab/tree/notebooks"
        listing = server.request("GET", "/api/contents/notebooks")
        notebooks = [item for item in listing["content"] if item["type"] == "notebook"]
        assert sorted(item["name"] for item in notebooks) == NOTEBOOKS
        stems = [item["name"].rsplit(".", 1)[0] for item in listing["content"]]
        assert len(stems) == len(set(stems)), f"a notebook is listed twice: {sorted(stems)}"

        kernel = server.request("POST", "/api/kernels", {"name": "python3", "path": "notebooks"})
        ws = websocket.create_connection(
            f"ws://{LOOPBACK}:{server.port}/api/kernels/{kernel['id']}/channels?token={server.token}",
            timeout=60,
        )
        try:
            nb = nbformat.read(ROOT / "notebooks" / NOTEBOOKS[0], as_version=4)
            ran = 0
            for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
                status, text = _execute(ws, cell.source)
                assert status == "ok", f"cell {i} failed through the server:\n{cell.source[:200]}"
                if i == 0:
                    assert "running on 2 CPU device(s)" in text  # the server passed NUM_DEVICES on
                ran += 1
            assert ran >= 5
        finally:
            ws.close()
        server.request("DELETE", f"/api/kernels/{kernel['id']}")
    finally:
        server.stop()
    assert server.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _learner_clone(tmp_path: Path, source: Path = ROOT) -> Path:
    """A git repository holding this checkout's files as git holds them, like a learner's clone.

    Tracked files come from git's index, not from the working copy: a notebook a learner has
    run and saved (outputs and all) is cloned as committed, so no test here depends on the
    working copy being clean. Files git does not track yet (and does not ignore) are copied
    as they stand, so that a change not yet staged is tested too.
    """
    clone = tmp_path / "clone"
    clone.mkdir(parents=True)
    subprocess.run(
        ["git", "checkout-index", "--all", f"--prefix={clone}/"], cwd=source, check=True, timeout=120
    )  # fmt: skip
    untracked = subprocess.run(
        ["git", "ls-files", "-z", "--others", "--exclude-standard"],
        cwd=source, capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split("\0")  # fmt: skip
    for rel in filter(None, untracked):
        src = source / rel
        if src.is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / rel)
    git = ["git", "-c", "user.name=learner", "-c", "user.email=learner@example.invalid"]
    subprocess.run([*git, "init", "-q"], cwd=clone, check=True, timeout=120)
    subprocess.run([*git, "add", "-A"], cwd=clone, check=True, timeout=120)
    subprocess.run([*git, "commit", "-qm", "clone"], cwd=clone, check=True, timeout=120)
    return clone


def test_saving_in_jupyterlab_keeps_the_tests_green(tmp_path):
    """Run a notebook, save it with its outputs through the server as JupyterLab does, then test."""
    from nbclient import NotebookClient

    clone = _learner_clone(tmp_path)
    name = "01_linen_basics"
    md = clone / "notebooks" / "src" / f"{name}.md"
    md_before = md.read_text()
    nb = nbformat.read(clone / "notebooks" / f"{name}.ipynb", as_version=4)
    env = {**os.environ, "NUM_DEVICES": "1", "PYTHONPATH": str(clone)}
    old = dict(os.environ)
    os.environ.update(env)
    try:
        NotebookClient(
            nb, timeout=600, kernel_name="python3",
            resources={"metadata": {"path": str(clone / "notebooks")}},
        ).execute()  # fmt: skip
    finally:
        os.environ.clear()
        os.environ.update(old)
    # What a kernel writes into a notebook's metadata when JupyterLab saves it.
    nb.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3}, "file_extension": ".py",
        "mimetype": "text/x-python", "name": "python", "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3", "version": sys.version.split()[0],
    }  # fmt: skip
    server = JupyterServer(clone, env)
    try:
        server.wait_ready()
        server.request(
            "PUT", f"/api/contents/notebooks/{name}.ipynb",
            {"type": "notebook", "format": "json", "content": nb},
        )  # fmt: skip
    finally:
        server.stop()
    saved = nbformat.read(clone / "notebooks" / f"{name}.ipynb", as_version=4)
    assert any(c.get("outputs") for c in saved.cells), "the save did not write the outputs"
    assert md.read_text() == md_before, "saving in JupyterLab changed the notebook's MyST source"
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "tests/test_notebooks.py"],
        cwd=clone, env={**os.environ, "PYTHONPATH": str(clone)},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]


@pytest.mark.timeout(2400)
def test_a_learners_run_and_save_keeps_pytest_green(tmp_path):
    """The README's promise, as a learner lives it: run a notebook in place (its outputs saved
    into the .ipynb), then run the tests in that same working copy. The tests that read the
    notebooks, the JupyterLab-save test (whose clone is taken from this dirty working copy)
    and the executed notebook itself must all pass there."""
    learner = _learner_clone(tmp_path / "learner")
    name = "01_linen_basics"
    env = {**os.environ, "NUM_DEVICES": "1", "PYTHONPATH": str(learner)}
    run = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
         "--inplace", "--ExecutePreprocessor.timeout=600", f"notebooks/{name}.ipynb"],
        cwd=learner, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    saved = nbformat.read(learner / "notebooks" / f"{name}.ipynb", as_version=4)
    assert sum(bool(c.get("outputs")) for c in saved.cells) > 10, "the run saved no outputs"
    # A clone taken from this working copy holds the notebook as committed: no outputs.
    again = _learner_clone(tmp_path / "again", source=learner)
    clean = nbformat.read(again / "notebooks" / f"{name}.ipynb", as_version=4)
    assert not any(c.get("outputs") for c in clean.cells if c.cell_type == "code")
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
         "--device-counts=1", "tests/test_notebooks.py",
         "tests/test_launch.py::test_saving_in_jupyterlab_keeps_the_tests_green",
         f"notebooks/{name}.ipynb"],
        cwd=learner, env={**os.environ, "PYTHONPATH": str(learner)},
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and " failed" not in tests.stdout


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;#]+)", line.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def test_binder_pins_match_requirements():
    binder, main = _pins(ROOT / "binder" / "requirements.txt"), _pins(ROOT / "requirements.txt")
    for pkg in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "matplotlib", "jupyterlab"):
        assert binder.get(pkg) == main.get(pkg), (
            f"binder pins {pkg}=={binder.get(pkg)}, requirements.txt {main.get(pkg)}"
        )
    assert (ROOT / "binder" / "runtime.txt").read_text().strip().startswith("python-3.")


def test_binder_recipe_replays_in_a_new_environment(tmp_path):
    """repo2docker's steps: install binder/requirements.txt, run postBuild, start through binder/start.

    The new venv is layered over this one (a .pth file), so the pins must
    already be satisfied and nothing is downloaded; what it proves is that the pins are
    consistent (pip check), postBuild installs helpers, and the start script sets the
    device count. The fresh install from PyPI is .ci/run's own venv.
    """
    pins = _pins(ROOT / "binder" / "requirements.txt")
    installed = {pkg: importlib.metadata.version(pkg) for pkg in ("jax", "flax")}
    if any(installed[pkg] != pins[pkg] for pkg in installed):
        pytest.skip(
            f"this environment has {installed}, not Binder's pins; the recipe is replayed in "
            "the pinned entry of .ci/run"
        )
    venv = tmp_path / "binder-venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300
    )
    py = venv / "bin" / "python"
    new_site = Path(
        subprocess.run(
            [str(py), "-c", "import site; print(site.getsitepackages()[0])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout.strip()
    )
    # Layer the new environment over this one: its packages are visible, new installs land in the new one.
    (new_site / "_layer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "PIP_NO_INPUT": "1"}
    env.pop("PYTHONPATH", None)
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-index", "-r", "binder/requirements.txt"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    post = subprocess.run(
        ["bash", "binder/postBuild"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert post.returncode == 0, post.stdout + post.stderr
    check = subprocess.run(
        [str(py), "-m", "pip", "check"], env=env, capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stdout
    probe = (
        "import os, helpers, jax, flax; "
        "print(os.environ['NUM_DEVICES'], jax.__version__, flax.__version__, helpers.__file__)"
    )
    out = subprocess.run(
        ["bash", str(ROOT / "binder" / "start"), str(py), "-c", probe],
        cwd=tmp_path, env={k: v for k, v in env.items() if k != "NUM_DEVICES"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    count, jax_v, flax_v, helpers_file = out.stdout.split()
    assert count == "8"
    assert (jax_v, flax_v) == (pins["jax"], pins["flax"])
    assert Path(helpers_file).resolve().parent == ROOT / "helpers"
    # postBuild installed helpers into the new environment itself
    assert list(new_site.glob("flax_sharding_helpers-*.dist-info"))
