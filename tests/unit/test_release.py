"""`make release` (infra/release.py): the chart packaged with its linked files, images pinned by their digests."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import tarfile
from pathlib import Path

import helm_python as helm
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("fedat_release", ROOT / "infra" / "release.py")
release = importlib.util.module_from_spec(spec)
spec.loader.exec_module(release)


def oci_archive(path: Path, manifest: bytes, blob: bytes | None = None) -> str:
    """A minimal oci-archive (index.json naming one manifest, and its blob); returns the manifest digest."""
    digest = "sha256:" + hashlib.sha256(manifest).hexdigest()
    index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                                                "digest": digest, "size": len(manifest)}]}  # fmt: skip
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
            (f"blobs/sha256/{digest.split(':')[1]}", manifest if blob is None else blob),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return digest


def test_the_chart_package_holds_the_linked_files_as_files(tmp_path):
    path = release.package_chart(tmp_path)
    meta = release.chart_meta()
    assert path.name == f"fedat-{meta['version']}.tgz"
    with tarfile.open(path) as tar:
        alerts = tar.getmember("fedat/files/alerts.yaml")
        assert alerts.isfile()
        assert tar.extractfile(alerts).read() == (ROOT / "infra" / "prometheus" / "alerts.yaml").read_bytes()
        names = tar.getnames()
    assert "fedat/templates/tests/test-release.yaml" in names and "fedat/CHANGELOG.md" in names
    assert "fedat/icon.svg" not in names  # inlined in Chart.yaml


def test_a_release_pins_each_image_by_the_digest_its_archive_holds(tmp_path):
    archives = tmp_path / "images"
    archives.mkdir()
    version = release.chart_meta()["appVersion"]
    digests = {
        img: oci_archive(archives / f"fedat-{img}-{version}.tar", json.dumps({"image": img}).encode())
        for img in ("core", "tf")
    }
    out = tmp_path / "out"
    made = release.release(out, ["core", "tf"], archives)
    values = yaml.safe_load(made["values"].read_text())
    assert values == {"image": {img: {"tag": version, "digest": d} for img, d in digests.items()}}
    # the chart accepts the file and runs exactly those images
    with helm.Chart.load(release.CHART) as ch:
        ch.validate_schema(values)
        text = ch.render(values, name="fedat", namespace="fl")["fedat/templates/deployments.yaml"]
    assert f"fedat-core@{digests['core']}" in text and f"fedat-tf@{digests['tf']}" in text
    sums = dict(line.split("  ")[::-1] for line in made["sums"].read_text().splitlines())
    assert set(sums) == {made["chart"].name, "fedat-core-0.1.0.tar", "fedat-tf-0.1.0.tar", "values-images.yaml"}
    for name, digest in sums.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest


def test_an_archive_whose_manifest_does_not_match_its_digest_is_refused(tmp_path):
    bad = tmp_path / "bad.tar"
    oci_archive(bad, b'{"a": 1}', blob=b'{"a": 2}')
    with pytest.raises(release.ReleaseError, match="does not hash to"):
        release.oci_digest(bad)
    with tarfile.open(tmp_path / "plain.tar", "w"):
        pass
    with pytest.raises(release.ReleaseError, match="not an OCI archive"):
        release.oci_digest(tmp_path / "plain.tar")
