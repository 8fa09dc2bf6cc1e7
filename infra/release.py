#!/usr/bin/env python3
"""Release artifacts: the Helm chart as a package, both images as OCI archives, and a values file that pins the
images by digest (`make release`).

    python infra/release.py                       # chart + both images (builds missing archives: root, buildah)
    python infra/release.py --images ""           # the chart only
    python infra/release.py --out DIR --images core

Writes into --out (default results/release/<chart version>/): `fedat-<chart version>.tgz` (linted strictly first,
symlinked files stored as files), `fedat-<image>-<app version>.tar` (oci-archive, as `make images EXPORT=1` writes
them), `values-images.yaml` (image.<image>.digest: the manifest digest each archive holds), and `SHA256SUMS`.

Push an archive without re-encoding its manifest, so the digest stays the one pinned, e.g.
`skopeo copy --preserve-digests oci-archive:fedat-core-0.1.0.tar docker://registry.example.com/fedat/core:0.1.0`,
then install with `-f values-images.yaml --set image.core.repository=registry.example.com/fedat/core ...`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "infra" / "helm" / "fedat"
IMAGES = ("core", "tf")
KUBE_VERSIONS = ("v1.25.0", "v1.33.0")


class ReleaseError(RuntimeError):
    """A release step failed; the message says which and why."""


def chart_meta(chart: Path = CHART) -> dict:
    """Chart.yaml as a dict."""
    return yaml.safe_load((chart / "Chart.yaml").read_text())


def package_chart(out: Path, chart: Path = CHART) -> Path:
    """Lint the chart strictly at the oldest and a recent Kubernetes, then package it into `out`."""
    import helm_python as helm

    helm.disable_logging()
    for kube in KUBE_VERSIONS:
        report = helm.lint(str(chart), None, strict=True, kube_version=kube)
        problems = report["errors"] + [m for m in report["messages"] if m["severity"] >= 2]
        if problems:
            raise ReleaseError(f"helm lint --strict (Kubernetes {kube}) failed: {problems}")
    path = Path(helm.package(str(chart), destination=str(out)))
    # The chart's files/ are symlinks into infra/: the package must hold their content.
    with tarfile.open(path) as tar:
        for rel, source in (
            ("files/alerts.yaml", ROOT / "infra" / "prometheus" / "alerts.yaml"),
            ("files/dashboards/fedat.json", ROOT / "infra" / "grafana" / "fedat.json"),
        ):
            member = tar.getmember(f"{chart.name}/{rel}")
            if not member.isfile() or tar.extractfile(member).read() != source.read_bytes():
                raise ReleaseError(f"{path.name}: {rel} is not a copy of {source.relative_to(ROOT)}")
    return path


def oci_digest(archive: Path) -> str:
    """The digest of the image manifest an oci-archive holds (index.json's one manifest), checked against its blob."""
    with tarfile.open(archive) as tar:
        try:
            index = json.load(tar.extractfile("index.json"))
        except KeyError:
            raise ReleaseError(f"{archive.name} is not an OCI archive (no index.json)") from None
        manifests = index.get("manifests", [])
        if len(manifests) != 1:
            raise ReleaseError(f"{archive.name}: index.json lists {len(manifests)} manifests, expected one")
        digest = manifests[0]["digest"]
        algorithm, _, hexdigest = digest.partition(":")
        if algorithm != "sha256" or len(hexdigest) != 64:
            raise ReleaseError(f"{archive.name}: manifest digest {digest!r} is not sha256")
        try:
            blob = tar.extractfile(f"blobs/sha256/{hexdigest}").read()
        except KeyError:
            raise ReleaseError(f"{archive.name}: the manifest blob {digest} is missing") from None
    if hashlib.sha256(blob).hexdigest() != hexdigest:
        raise ReleaseError(f"{archive.name}: the manifest blob does not hash to {digest}")
    return digest


def build_images(images: list[str]) -> None:
    """`infra/images/build.sh` with EXPORT=1 (root, buildah, mmdebstrap): builds what changed, writes the archives."""
    if os.geteuid() != 0 or shutil.which("buildah") is None:
        raise ReleaseError(
            "the image archives are missing and cannot be built here (needs root and buildah: `make images "
            "EXPORT=1`); or release the chart alone with --images ''"
        )
    r = subprocess.run([str(ROOT / "infra" / "images" / "build.sh"), *images], env={**os.environ, "EXPORT": "1"})
    if r.returncode != 0:
        raise ReleaseError(f"infra/images/build.sh {' '.join(images)} failed ({r.returncode})")


def values_for(digests: dict[str, str], app_version: str) -> str:
    """The values file that pins each image by digest (the tag stays, for people reading it)."""
    body = {"image": {img: {"tag": app_version, "digest": d} for img, d in sorted(digests.items())}}
    head = (
        "# Written by infra/release.py: the images of this release, pinned by the manifest digest of their\n"
        "# oci-archive. Set image.<image>.repository to where you pushed them (keep the digest: push with\n"
        "# skopeo copy --preserve-digests).\n"
    )
    return head + yaml.safe_dump(body, sort_keys=True)


def sha256sums(folder: Path) -> str:
    """`sha256sum`'s format for every file in `folder` but SHA256SUMS itself."""
    lines = []
    for f in sorted(p for p in folder.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        h = hashlib.sha256()
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        lines.append(f"{h.hexdigest()}  {f.name}\n")
    return "".join(lines)


def release(out: Path, images: list[str], archives: Path) -> dict[str, Path]:
    """Every artifact of a release into `out`; name -> path."""
    meta = chart_meta()
    out.mkdir(parents=True, exist_ok=True)
    made = {"chart": package_chart(out)}
    if images:
        wanted = {img: archives / f"fedat-{img}-{meta['appVersion']}.tar" for img in images}
        missing = [img for img, path in wanted.items() if not path.exists()]
        if missing:
            build_images(missing)
        digests = {}
        for img, path in wanted.items():
            target = out / path.name
            shutil.copyfile(path, target)
            digests[img] = oci_digest(target)
            made[img] = target
        (out / "values-images.yaml").write_text(values_for(digests, str(meta["appVersion"])))
        made["values"] = out / "values-images.yaml"
    (out / "SHA256SUMS").write_text(sha256sums(out))
    made["sums"] = out / "SHA256SUMS"
    return made


def main() -> None:
    """Command line: see the module's docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="default: results/release/<chart version>")
    p.add_argument("--images", default=" ".join(IMAGES), help="images to export, space- or comma-separated ('' none)")
    p.add_argument("--archives", type=Path, default=ROOT / "results" / "images", help="where build.sh writes them")
    args = p.parse_args()
    images = [i for i in args.images.replace(",", " ").split() if i]
    unknown = sorted(set(images) - set(IMAGES))
    if unknown:
        p.error(f"unknown image(s) {unknown}; images: {' '.join(IMAGES)}")
    out = args.out or ROOT / "results" / "release" / str(chart_meta()["version"])
    try:
        made = release(out, images, args.archives)
    except ReleaseError as exc:
        sys.exit(f"release failed: {exc}")
    for name, path in made.items():
        print(f"{name:7s} {path}")


if __name__ == "__main__":
    main()
