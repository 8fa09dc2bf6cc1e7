"""A private, throw-away RabbitMQ node for destructive tests: start, stop, SIGKILL and restart it at will.

The shared node (rabbit@localhost on 5672) must never be touched by such tests, so each `PrivateBroker` gets its own
node name, its own loopback ports and one temporary directory holding everything it writes: data, logs, config,
enabled plugins, Erlang cookie and certificates. The node runs as a child process group of this process and
receives SIGTERM if the process dies (Linux parent-death signal), so a crashed test does not leave it behind.

Usage:
    with PrivateBroker() as b:
        url = b.add_vhost("v1")
        ...
        b.kill(); b.start()
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import string
import subprocess
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

from fedat.deploy.ports import free_ports
from fedat.errors import BrokerError  # noqa: F401 (re-exported)
from fedat.runtime.tls import TlsConfig

# The Debian package's /usr/sbin scripts are wrappers that, run as root, switch to the `rabbitmq` user and write
# the shared node's /var/log/rabbitmq/startup_log: call the real scripts so the node runs as us, in our directory.
_DEFAULT_BIN = "/usr/lib/rabbitmq/bin"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
CTL_TIMEOUT = 60.0

# Linux sends the parent-death signal when the *thread* that forked the child ends. Forking from one long-lived
# worker thread ties the node to the life of the process, not of whichever thread called start().
_spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fedat-devbroker-spawn")


def _bin(name: str) -> str:
    """Path of a RabbitMQ script: FEDAT_RABBITMQ_BIN, the Debian lib dir, or PATH."""
    base = Path(os.environ.get("FEDAT_RABBITMQ_BIN", _DEFAULT_BIN))
    if (base / name).exists():
        return str(base / name)
    found = shutil.which(name)
    if found is None:
        raise BrokerError(f"{name} not found in {base} or on PATH (is rabbitmq-server installed?)")
    return found


def _openssl(args: list[str], cwd: Path) -> None:
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise BrokerError(f"openssl {' '.join(args[:2])} failed: {r.stderr.strip()[-2000:]}")


def make_certificates(directory: str | Path, ca_name: str = "fedat-test-ca") -> dict[str, Path]:
    """Write a CA, a server certificate (localhost, 127.0.0.1) and a client certificate; return their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]  # EC: fast to generate
    _openssl(
        [
            "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "7", "-subj", f"/CN={ca_name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        ],
        d,
    )  # fmt: skip
    exts = {
        "server": "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for role, ext in exts.items():
        (d / f"{role}.ext").write_text(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n" + ext
        )
        cn = "localhost" if role == "server" else "fedat-test-client"
        _openssl(["req", *ec, "-keyout", f"{role}.key", "-out", f"{role}.csr", "-subj", f"/CN={cn}"], d)
        _openssl(
            [
                "x509", "-req", "-in", f"{role}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{role}.pem", "-days", "7", "-extfile", f"{role}.ext",
            ],
            d,
        )  # fmt: skip
    return {
        "ca": d / "ca.pem",
        "server_cert": d / "server.pem",
        "server_key": d / "server.key",
        "client_cert": d / "client.pem",
        "client_key": d / "client.key",
    }


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path.name}: not written)"
    return f"--- {path.name} (last {min(lines, len(text))} lines) ---\n" + "\n".join(text[-lines:])


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the node's whole process group, then reap its leader."""
    # Only while the leader is unreaped: its pid (= the group id) cannot have been reused by anyone else.
    if proc.returncode is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass


def _cleanup(state: dict) -> None:
    """Last resort at garbage collection or interpreter exit: kill the node, remove its directory."""
    proc = state.get("proc")
    if proc is not None:
        _kill_group(proc)
        state["proc"] = None
    if state.get("dir"):
        shutil.rmtree(state["dir"], ignore_errors=True)


class PrivateBroker:
    """A RabbitMQ node of our own on loopback ports, with its data in one temporary directory."""

    def __init__(self, tls: bool = False, management: bool = False, prometheus: bool = False):
        self.tls, self.management, self.prometheus = tls, management, prometheus
        self.node = f"fedat-{secrets.token_hex(4)}@localhost"
        self.dir: Path | None = None
        self.port = self.dist_port = 0
        self.ssl_port: int | None = None
        self.management_port: int | None = None
        self.prometheus_port: int | None = None
        self.ca_file = self.client_cert = self.client_key = ""
        self.beam_pid: int | None = None
        self.startup_seconds = 0.0  # of the last start(), until await_startup succeeded
        self._state: dict = {"proc": None, "dir": None}
        self._finalizer = weakref.finalize(self, _cleanup, self._state)

    # -- life cycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> PrivateBroker:
        try:
            self.setup()
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def setup(self) -> None:
        """Create the directory, pick ports, write config, plugins, cookie and (with tls) certificates."""
        if self.dir is not None:
            return
        if not self._finalizer.alive:  # set up again after close()
            self._state = {"proc": None, "dir": None}
            self._finalizer = weakref.finalize(self, _cleanup, self._state)
        self.dir = Path(tempfile.mkdtemp(prefix="fedat-broker-"))
        self._state["dir"] = self.dir
        ports = free_ports(2 + self.tls + self.management + self.prometheus)
        self.port, self.dist_port = ports.pop(), ports.pop()
        lines = [
            f"listeners.tcp.local = 127.0.0.1:{self.port}",
            "loopback_users.guest = true",
            "log.console = false",
            "log.file.level = info",
        ]
        if self.tls:
            self.ssl_port = ports.pop()
            certs = make_certificates(self.dir / "certs")
            self.ca_file, self.client_cert, self.client_key = (
                str(certs["ca"]),
                str(certs["client_cert"]),
                str(certs["client_key"]),
            )
            lines += [
                f"listeners.ssl.local = 127.0.0.1:{self.ssl_port}",
                f"ssl_options.cacertfile = {certs['ca']}",
                f"ssl_options.certfile = {certs['server_cert']}",
                f"ssl_options.keyfile = {certs['server_key']}",
                "ssl_options.verify = verify_peer",
                "ssl_options.fail_if_no_peer_cert = true",
            ]
        plugins = []
        if self.management:
            self.management_port = ports.pop()
            plugins.append("rabbitmq_management")
            lines += ["management.tcp.ip = 127.0.0.1", f"management.tcp.port = {self.management_port}"]
        if self.prometheus:
            self.prometheus_port = ports.pop()
            plugins.append("rabbitmq_prometheus")
            lines += ["prometheus.tcp.ip = 127.0.0.1", f"prometheus.tcp.port = {self.prometheus_port}"]
        (self.dir / "rabbitmq.conf").write_text("\n".join(lines) + "\n")
        (self.dir / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        (self.dir / "conf.d").mkdir()
        # An empty env file: the system one (/etc/rabbitmq/rabbitmq-env.conf) names the shared node.
        (self.dir / "rabbitmq-env.conf").write_text("")
        # The node and rabbitmqctl both read $HOME/.erlang.cookie; a private HOME keeps ~/.erlang.cookie untouched.
        home = self.dir / "home"
        home.mkdir()
        cookie = home / ".erlang.cookie"
        cookie.write_text("".join(secrets.choice(string.ascii_uppercase) for _ in range(20)))
        cookie.chmod(0o400)

    def env(self) -> dict[str, str]:
        """The environment for this node's server and CLI processes."""
        assert self.dir is not None, "setup() first"
        d = self.dir
        # Inherited RABBITMQ_*/ERL_* settings (e.g. a developer's RABBITMQ_NODENAME) would leak into our node.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update(
            HOME=str(d / "home"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_CONFIG_FILES=str(d / "conf.d" / "*.conf"),  # else /etc/rabbitmq/conf.d/*.conf is read too
            RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_PID_FILE=str(d / "node.pid"),
            RABBITMQ_MOTD_FILE=str(d / "motd"),
            # Erlang distribution on loopback only, like the shared node (its env file sets the same).
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}",
            ERL_EPMD_ADDRESS="127.0.0.1",
        )
        return env

    @property
    def running(self) -> bool:
        """True while the node's process group leader is alive."""
        proc = self._state["proc"]
        return proc is not None and proc.poll() is None

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start the node (on the same ports and data as before) and wait until it accepts clients."""
        self.setup()
        if self.running:
            return
        assert self.dir is not None
        out = open(self.dir / "server.out", "ab")
        argv = [_bin("rabbitmq-server")]
        if shutil.which("setpriv"):
            # SIGTERM (not KILL) to the start script if we die: its trap stops the VM cleanly.
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
        try:
            proc = _spawner.submit(
                subprocess.Popen,
                argv,
                env=self.env(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: kill() and close() can take the whole node down
            ).result(timeout=30)
        finally:
            out.close()
        self._state["proc"] = proc
        started = time.monotonic()
        try:
            self._await_startup(proc, timeout)
            self.beam_pid = self._find_beam_pid()
        except BaseException:
            _kill_group(proc)
            self._state["proc"] = None
            raise
        self.startup_seconds = time.monotonic() - started

    def _await_startup(self, proc: subprocess.Popen, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrokerError(f"{self.node} did not start within {timeout:.0f}s; last check: {last}\n{self.logs()}")
            # await_startup gives up early while the node is not yet registered with epmd: retry until the deadline.
            waiter = subprocess.Popen(
                [_bin("rabbitmqctl"), "-n", self.node, "await_startup", "--timeout", str(max(1, int(left)))],
                env=self.env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            while waiter.poll() is None and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if waiter.poll() is None:
                waiter.kill()
            out_text = waiter.communicate(timeout=10)[0]
            if waiter.returncode == 0:
                return
            last = out_text.strip()[-500:]
            if proc.poll() is not None:
                raise BrokerError(f"{self.node} exited with status {proc.returncode} while starting\n{self.logs()}")
            time.sleep(0.2)

    def _find_beam_pid(self) -> int:
        """The OS pid of this node's Erlang VM, as the node itself reports it (checked against our group)."""
        pid = int(self.ctl("eval", "os:getpid().").strip().strip('"'))
        proc = self._state["proc"]
        if os.getpgid(pid) != proc.pid:
            raise BrokerError(f"{self.node} reports pid {pid}, which is not in our process group {proc.pid}")
        return pid

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the node cleanly (its data is kept for start()); SIGKILL it if it has not exited within `timeout`."""
        proc = self._state["proc"]
        if proc is None:
            return
        if proc.poll() is None:
            try:
                self.ctl("stop", timeout=timeout)
            except (BrokerError, subprocess.TimeoutExpired):
                pass  # fall through to the wait below, then SIGKILL
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
        self._state["proc"] = None
        self.beam_pid = None

    def kill(self) -> None:
        """SIGKILL this node's Erlang VM (beam.smp) only, as a crash would; start() brings it back."""
        # A crash is a crash: on 3.10 (ra 2.2.0) a quorum queue declared less than ~0.5 s before it comes back
        # leaderless (its registration in names.dets is saved on a 500 ms timer; rabbitmq/ra#443).
        proc = self._state["proc"]
        if proc is None or self.beam_pid is None:
            raise BrokerError(f"{self.node} is not running")
        try:
            os.kill(self.beam_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_TIMEOUT)  # the start script returns from `wait` once the VM is gone
        except subprocess.TimeoutExpired:
            _kill_group(proc)
        self._state["proc"] = None
        self.beam_pid = None

    def restart(self, timeout: float = START_TIMEOUT) -> None:
        """Stop cleanly and start again on the same ports and data directory."""
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Stop the node (SIGKILL after 30 s) and remove its directory."""
        proc = self._state["proc"]
        try:
            if proc is not None and proc.poll() is None:
                self.stop()
        finally:
            self._finalizer()  # kills whatever is left of the group and removes the directory
            self.dir = None

    # -- talking to it ----------------------------------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = CTL_TIMEOUT) -> str:
        """Run `rabbitmqctl -n <node> args...` and return its stdout; BrokerError on failure."""
        r = subprocess.run(
            [_bin("rabbitmqctl"), "-n", self.node, *args],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if r.returncode != 0:
            raise BrokerError(
                f"rabbitmqctl -n {self.node} {' '.join(args)} failed ({r.returncode}): "
                f"{(r.stderr.strip() or r.stdout.strip())[-2000:]}"
            )
        return r.stdout

    def amqp_url(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> str:
        """Plain AMQP URL of a vhost on this node."""
        return f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}/{quote(vhost, safe='')}"

    def amqps_url(self, vhost: str = "/", user: str = "guest", password: str = "guest") -> str:
        """AMQPS URL of a vhost on this node (use it with tls_config())."""
        if self.ssl_port is None:
            raise BrokerError("PrivateBroker(tls=True) is needed for amqps_url")
        return (
            f"amqps://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.ssl_port}/"
            f"{quote(vhost, safe='')}"
        )

    def tls_config(self) -> TlsConfig:
        """Client TLS settings: trust this node's CA, present the client certificate, check the name localhost."""
        if not self.ca_file:
            raise BrokerError("PrivateBroker(tls=True) is needed for tls_config")
        return TlsConfig(self.ca_file, self.client_cert, self.client_key, server_hostname="localhost")

    @property
    def management_url(self) -> str:
        """Base URL of the management HTTP API."""
        if self.management_port is None:
            raise BrokerError("PrivateBroker(management=True) is needed for management_url")
        return f"http://127.0.0.1:{self.management_port}"

    def add_vhost(self, name: str) -> str:
        """Create vhost `name`, grant guest everything on it and return its plain AMQP URL."""
        self.ctl("add_vhost", name)
        self.ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
        return self.amqp_url(name)

    def logs(self, lines: int = 40) -> str:
        """The tails of the start script's output and of the node's log, for error messages."""
        if self.dir is None:
            return "(no directory)"
        return _tail(self.dir / "server.out", lines) + "\n" + _tail(self.dir / "log" / f"{self.node}.log", lines)
