"""The fedat-core container image (infra/images) against the real broker.

`infra/images/build.sh core` builds it (a Debian base made by mmdebstrap, no registry; buildah with chroot isolation)
or keeps the existing image when its input hash (Containerfile, scripts, package sources, base) is unchanged. The
image must run as UID 10001, hold no pip, compiler or apt, answer an unknown role with exit 2 and the list of roles,
and its aggregator must connect to the broker from a read-only root filesystem (only /tmp and /run writable, through
infra/images/run-readonly.sh, since buildah 1.28 has no `run --read-only`), consume `fedat.aggregator.tier-models`,
answer /readyz, and exit 0 within seconds of SIGTERM. The TensorFlow image is built by `make images` only.
Every working container is removed (`buildah rm`) whatever happens. Needs root, as building images does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import tomllib
import uuid
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from .broker import http_status

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.xdist_group("image")]  # one build, one worker
ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "infra" / "images"
BUILDAH = ["buildah", "--storage-driver", os.environ.get("FEDAT_BUILDAH_STORAGE_DRIVER", "vfs")]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/fedat-core:{VERSION}"
CORE_ROLES = ("barrier", "aggregator", "profiler", "provision", "keys")
BUILD_TIMEOUT = 600  # a cold build (mmdebstrap + wheels) takes ~1.5 min here; a reused image ~1 s


@pytest.fixture(scope="module")
def core_image() -> str:
    if os.geteuid() != 0:
        pytest.skip("building and running images needs root (mmdebstrap root mode, buildah chroot isolation)")
    started = time.time()
    r = subprocess.run([str(IMAGES / "build.sh"), "core"], capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert r.returncode == 0, f"infra/images/build.sh core failed:\n{r.stdout[-2000:]}\n{r.stderr[-6000:]}"
    print(f"build.sh core: {time.time() - started:.1f} s\n{r.stderr[-1500:]}")
    return IMAGE


def _rm(name: str) -> None:
    subprocess.run([*BUILDAH, "rm", name], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def container(core_image: str):
    """A working container of the image (plain `buildah run`: host network, the image's USER, ENV and WORKDIR)."""
    name = f"fedat-test-{uuid.uuid4().hex[:8]}"
    try:
        subprocess.run(
            [*BUILDAH, "from", "--pull-never", "--quiet", "--name", name, core_image],
            check=True,
            capture_output=True,
            timeout=300,
        )
        yield name
    finally:
        _rm(name)


def run_in(container: str, *cmd: str, user: str | None = None) -> subprocess.CompletedProcess:
    as_user = ["--user", user] if user else []
    return subprocess.run(
        [*BUILDAH, "run", "--isolation", "chroot", *as_user, container, "--", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_image_config_and_labels(core_image):
    out = subprocess.run(
        [*BUILDAH, "inspect", "--type", "image", core_image], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    config = json.loads(out)["OCIv1"]["config"]
    assert config["User"].split(":")[0] == "10001"
    assert config["Entrypoint"] == ["fedat-entrypoint"]
    assert config["Cmd"] == ["help"]
    assert config["WorkingDir"] == "/srv/fedat"
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["HOME"] == env["TMPDIR"] == env["MPLCONFIGDIR"] == "/tmp"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.title"] == "fedat-core"
    assert labels["org.opencontainers.image.version"] == VERSION
    for key in ("revision", "created", "description", "base.name"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert labels["io.fedat.input-hash"] and labels["io.fedat.debian.suite"] and labels["io.fedat.debian.release"]
    pins = labels["io.fedat.requirements"].split()
    assert "numpy==2.4.6" in pins and "pika==1.4.4" in pins and f"fedat-aggregator=={VERSION}" in pins
    assert not [p for p in pins if p.lower().startswith(("tensorflow", "pip==", "wheel=="))], pins


def test_runs_as_fedat_without_build_tools(container):
    r = run_in(container, "sh", "-c", "id -u; id -g; pwd; stat -c %u /srv/fedat")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["10001", "10001", "/srv/fedat", "10001"]
    r = run_in(container, "sh", "-c", "command -v pip pip3 gcc cc make apt-get apt")
    assert r.returncode != 0 and r.stdout.strip() == "", f"build tools in the image: {r.stdout}"
    # Asked on stdout: buildah's chroot run can cut a failing command's stderr short (seen in CI).
    found = "from importlib.util import find_spec as f; "
    found += "print(*(f(m) is not None for m in ('pip', 'tensorflow', 'numpy')))"
    r = run_in(container, "python", "-c", found)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False", "True"], f"pip, tensorflow, numpy found: {r.stdout}"
    # No package lists, downloaded .debs, pip cache or wheels left behind (root: /root is not readable by 10001).
    r = run_in(
        container,
        "sh",
        "-c",
        "find /var/lib/apt /var/cache /root /tmp /opt/fedat -type f "
        "\\( -path '*/lists/*' ! -name lock -o -name '*.deb' -o -name '*.whl' -o -path '*/.cache/pip/*' \\)",
        user="0:0",
    )
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout + r.stderr
    r = run_in(container, "cat", "/usr/share/fedat/pip-freeze.txt", "/usr/share/fedat/debian-release.txt")
    assert "numpy==2.4.6" in r.stdout and "Date:" in r.stdout, r.stdout + r.stderr


def test_entrypoint_roles(container):
    r = run_in(container, "fedat-entrypoint", "nonsense")
    assert r.returncode == 2
    assert "nonsense" in r.stderr and all(role in r.stderr for role in CORE_ROLES), r.stderr
    r = run_in(container, "fedat-entrypoint", "worker")
    assert r.returncode == 2 and "fedat-tf" in r.stderr
    r = run_in(container, "fedat-entrypoint", "help")  # the default CMD
    assert r.returncode == 0 and "usage: fedat-entrypoint ROLE" in r.stdout
    r = run_in(container, "fedat-entrypoint", "provision", "--help")
    assert r.returncode == 0 and "--vhost" in r.stdout, r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _consumed_queues(vhost: str) -> list[str]:
    r = subprocess.run(
        ["rabbitmqctl", "list_consumers", "-p", vhost, "-q", "--no-table-headers", "queue_name"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.split()


def test_aggregator_connects_from_read_only_root_and_stops_on_sigterm(core_image, vhost_url, tmp_path):
    vhost = unquote(urlparse(vhost_url).path[1:])
    port = _free_port()
    name = f"fedat-test-{uuid.uuid4().hex[:8]}"
    # Before the service starts, the same shell proves which paths are writable; then it becomes the aggregator.
    probe = (
        "for d in / /opt/fedat /srv/fedat /etc /usr /var; do touch $d/.w 2>/dev/null && echo WRITABLE $d; done; "
        "touch /tmp/.w && echo TMP-OK; exec fedat-entrypoint aggregator"
    )
    env = {
        "FEDAT_AMQP_URL": vhost_url,
        "FEDAT_SIGNING": "off",
        "FEDAT_METRICS_PORT": str(port),
        "FEDAT_LOG_LEVEL": "INFO",
    }
    log = tmp_path / "aggregator.log"
    cmd = [str(IMAGES / "run-readonly.sh"), "--name", name, core_image]
    for k, v in env.items():
        cmd += ["-e", f"{k}={v}"]
    cmd += ["--", "sh", "-c", probe]
    started = time.time()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while http_status(port, "/readyz") != 200:
            assert proc.poll() is None, f"the container exited ({proc.returncode}):\n{log.read_text()}"
            assert time.time() < deadline, f"/readyz never answered 200:\n{log.read_text()}"
            time.sleep(0.2)
        ready = time.time() - started
        deadline = time.time() + 30
        while "fedat.aggregator.tier-models" not in _consumed_queues(vhost):
            assert time.time() < deadline, f"no consumer on fedat.aggregator.tier-models: {_consumed_queues(vhost)}"
            time.sleep(0.5)
        time.sleep(2)  # a few seconds of service
        assert proc.poll() is None, log.read_text()
        stopping = time.time()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
        stopped = time.time() - stopping
        text = log.read_text()
        print(f"ready {ready:.1f} s after start, stopped {stopped:.1f} s after SIGTERM; log:\n{text}")
        assert "TMP-OK" in text and "WRITABLE" not in text, f"the root filesystem is not read-only:\n{text}"
        assert "connected to the broker" in text, text
        assert rc == 0, f"exit status {rc} after SIGTERM:\n{text}"
        assert stopped < 10
        assert "fedat.aggregator.tier-models" not in _consumed_queues(vhost)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
        _rm(name)  # normally already removed by run-readonly.sh
