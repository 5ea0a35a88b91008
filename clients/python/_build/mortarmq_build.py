"""The build backend of the mortarmq package (PEP 517, in-tree): it writes a pure-Python
wheel with the standard library alone.

Why not setuptools: `pip install ./clients/python` must work offline on a fresh
machine. pip builds in an isolated environment and would have to download setuptools
(and `wheel`, which the setuptools bundled with Python 3.11's venv still needs) from
an index; this backend needs nothing, so the isolated build installs nothing.

It reads name, version, description and requires-python from the [project] table of
pyproject.toml (simple `key = "value"` lines) and packs the `mortarmq` directory.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "mortarmq"
# A fixed timestamp makes the archives reproducible.
EPOCH = (2026, 1, 1, 0, 0, 0)


def _project():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    section = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.S | re.M).group(1)
    fields = dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"', section, re.M))
    licence = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]*)"', section, re.M)
    fields["license"] = licence.group(1) if licence else ""
    return fields


def _metadata():
    p = _project()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nLicense: %s\n"
            "Requires-Python: %s\nDescription-Content-Type: text/markdown\n\n%s"
            % (p["name"], p["version"], p["description"], p["license"],
               p["requires-python"], readme))


def _dist_info():
    p = _project()
    return "%s-%s.dist-info" % (p["name"], p["version"])


def _wheel_name():
    p = _project()
    return "%s-%s-py3-none-any.whl" % (p["name"], p["version"])


def _package_files():
    out = []
    base = os.path.join(ROOT, PACKAGE)
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".typed")):
                path = os.path.join(dirpath, name)
                out.append((os.path.relpath(path, ROOT).replace(os.sep, "/"), path))
    return out


def _write_wheel(directory, entries):
    """entries: (archive name, bytes). Adds WHEEL, METADATA and RECORD."""
    info = _dist_info()
    entries = list(entries) + [
        (info + "/METADATA", _metadata().encode("utf-8")),
        (info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: mortarmq_build\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
    ]
    record = io.StringIO()
    path = os.path.join(directory, _wheel_name())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in entries:
            wheel.writestr(zipfile.ZipInfo(name, EPOCH), data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            record.write("%s,sha256=%s,%d\n" % (name, digest.decode(), len(data)))
        record.write("%s/RECORD,,\n" % info)
        wheel.writestr(zipfile.ZipInfo(info + "/RECORD", EPOCH), record.getvalue())
    return os.path.basename(path)


# ---- PEP 517 / PEP 660 hooks ---------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = os.path.join(metadata_directory, _dist_info())
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    return _dist_info()


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for name, path in _package_files():
        with open(path, "rb") as f:
            entries.append((name, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # A .pth file puts the source directory on sys.path: edits take effect at once.
    return _write_wheel(wheel_directory, [("mortarmq_editable.pth", (ROOT + "\n").encode())])


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    stem = "%s-%s" % (p["name"], p["version"])
    path = os.path.join(sdist_directory, stem + ".tar.gz")
    files = [(n, src) for n, src in _package_files()]
    for extra in ("pyproject.toml", "README.md", "_build/mortarmq_build.py"):
        files.append((extra, os.path.join(ROOT, extra)))
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        pkg_info = _metadata().encode("utf-8")
        info = tarfile.TarInfo(stem + "/PKG-INFO")
        info.size = len(pkg_info)
        tar.addfile(info, io.BytesIO(pkg_info))
        for name, src in files:
            tar.add(src, arcname="%s/%s" % (stem, name), recursive=False)
    return os.path.basename(path)
