"""Regenerate flightfeed/_generated/ from protos/ with betterproto2 (async grpclib stubs).

Run: python scripts/generate_protos.py [--check]
--check regenerates into a temporary folder and exits 1 if the committed code differs.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "flightfeed" / "_generated"
PLUGIN_OPTIONS = "client_generation=async,server_generation=async"


def generate(out: Path) -> None:
    """Run protoc (from grpcio-tools) with the betterproto2 plugin into `out`."""
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    plugin = shutil.which("protoc-gen-python_betterproto2", path=str(Path(sys.executable).parent))
    if plugin is None:
        raise SystemExit("protoc-gen-python_betterproto2 not found: pip install -e .[dev]")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"-I{well_known}",
            f"--plugin=protoc-gen-python_betterproto2={plugin}",
            f"--python_betterproto2_out={out}",
            f"--python_betterproto2_opt={PLUGIN_OPTIONS}",
            *sources,
        ],
        check=True,
        cwd=PROTOS,
    )


def differences(left: Path, right: Path) -> list[str]:
    """Relative paths that differ between two generated trees."""
    found: list[str] = []

    def walk(cmp: filecmp.dircmp[str], prefix: str) -> None:
        found.extend(prefix + name for name in cmp.left_only + cmp.right_only + cmp.diff_files)
        for name, sub in cmp.subdirs.items():
            walk(sub, f"{prefix}{name}/")

    walk(filecmp.dircmp(left, right, ignore=["__pycache__"]), "")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if regeneration changes code")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "_generated"
            generate(fresh)
            changed = differences(OUT, fresh)
        if changed:
            print("generated code is stale:", *changed, sep="\n  ")
            return 1
        print("generated code is up to date")
        return 0
    if OUT.exists():
        shutil.rmtree(OUT)
    generate(OUT)
    print(f"regenerated {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
