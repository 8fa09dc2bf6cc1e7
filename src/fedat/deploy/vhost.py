"""The broker side of one local deployment: a fresh vhost with one user per role, and each role's signing keys.

Without a URL, `open` provisions a fresh vhost through the management API (`fedat.deploy.provision`): the
topology, and one least-privilege user per role named `<vhost>-<role>`; each service then connects as its role's
user and does not declare the topology (`FEDAT_DECLARE_TOPOLOGY=0`). With a URL, every role connects with it and
declares the topology itself. Every deployment gets a fresh signing secret; each role's process receives only its
own keys (`keys_for_role`), in a keyring file in a private temporary folder. `close` removes all of it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from fedat.deploy import provision as prov
from fedat.deploy.roles import SERVICE_ROLES
from fedat.protocol import signing

# Read by a launcher only, to provision its vhost; never passed on to a service.
MANAGEMENT_ENV = (
    "FEDAT_MANAGEMENT_URL",
    "FEDAT_ADMIN_USER",
    "FEDAT_ADMIN_PASSWORD",
    "FEDAT_ADMIN_PASSWORD_FILE",
    "FEDAT_AMQP_HOST",
)
# Keys come from the deployment (one keyring file per role), never from the launcher's own environment.
KEYS_ENV = ("FEDAT_SIGNING_SECRET_FILE", "FEDAT_SIGNING_SECRET", "FEDAT_KEYRING_FILE")


def management(env: Mapping[str, str]) -> tuple[str, str, str]:
    """(API URL, admin user, admin password) from FEDAT_MANAGEMENT_URL, FEDAT_ADMIN_USER, FEDAT_ADMIN_PASSWORD(_FILE);
    the local broker's guest by default."""
    pw_file = env.get("FEDAT_ADMIN_PASSWORD_FILE")
    password = Path(pw_file).read_text().strip() if pw_file else env.get("FEDAT_ADMIN_PASSWORD", "guest")
    return env.get("FEDAT_MANAGEMENT_URL", prov.DEFAULT_API_URL), env.get("FEDAT_ADMIN_USER", "guest"), password


class Vhost:
    """A role's AMQP URL, its signing keys, and whether its services declare the topology."""

    def __init__(self, amqp_url: str | None, num_tiers: int):
        self.given = amqp_url
        self.num_tiers = num_tiers
        self.name: str | None = None
        self.urls: dict[str, str] = {}
        self.management: tuple[str, str, str] | None = None
        self.secret = secrets.token_bytes(32)
        self.keys_dir: str | None = None

    def keyring_file(self, role: str) -> str:
        """The file holding `role`'s keys (written on first use, mode 0600)."""
        if self.keys_dir is None:
            self.keys_dir = tempfile.mkdtemp(prefix="fedat-keys-")
        path = Path(self.keys_dir) / f"{role}.json"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(signing.keys_for_role(self.secret, role), f)
        return str(path)

    def keyring(self, role: str) -> signing.Keyring:
        """`role`'s keys, for a service run inside this process (the recorder)."""
        return signing.Keyring.from_mapping(signing.keys_for_role(self.secret, role))

    def open(self) -> None:
        """Provision the vhost and the users (unless a URL was given); on failure, remove what was made."""
        if self.given is not None:
            return
        self.management = management(os.environ)
        self.name = f"fedat-run-{uuid.uuid4().hex[:8]}"
        users = {role: (f"{self.name}-{role}", secrets.token_urlsafe(24)) for role in SERVICE_ROLES}
        try:
            host = os.environ.get("FEDAT_AMQP_HOST")  # default: the management API's host, port 5672
            self.urls = prov.provision(*self.management, self.name, self.num_tiers, users, amqp_host=host)
        except BaseException:
            self.close()
            raise

    @property
    def declare(self) -> bool:
        """Services declare the topology only on a broker URL given by the caller."""
        return self.given is not None

    def url(self, role: str) -> str:
        """The AMQP URL `role`'s services connect with."""
        return self.given if self.given is not None else self.urls[role]

    def env(self, role: str) -> dict[str, str]:
        """The variables that tell a service of `role` where and how to connect, and with which keys to sign."""
        return {
            "FEDAT_AMQP_URL": self.url(role),
            "FEDAT_DECLARE_TOPOLOGY": "1" if self.declare else "0",
            "FEDAT_KEYRING_FILE": self.keyring_file(role),
        }

    def close(self) -> None:
        """Delete the keys, the provisioned vhost and users (nothing if a URL was given); never raises."""
        if self.keys_dir is not None:
            shutil.rmtree(self.keys_dir, ignore_errors=True)
            self.keys_dir = None
        if self.name is None or self.management is None:
            return
        names = [f"{self.name}-{role}" for role in SERVICE_ROLES]
        try:
            prov.deprovision(*self.management, self.name, names)
        except Exception as exc:  # the run's results matter more than the clean-up: say what is left
            print(f"[fedat] could not delete vhost {self.name} and its users {names}: {exc}", flush=True)
        self.name = None
