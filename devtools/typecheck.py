"""Type-check the project with mypy, mapping module names the way pyproject.toml's package-dir does.

mypy finds `keyload.processors.apply` only at `<dir>/keyload/processors/apply.py`, and the real file is
`processors/apply.py`; no mypy setting maps a module name onto another folder. So this hands mypy the
source list itself, one (path, module) pair per file from [tool.setuptools] package-dir and packages,
plus the [tool.mypy] packages found the ordinary way, and mypy reports errors against the real paths.
Run: `python -m devtools.typecheck [mypy options]` (settings come from [tool.mypy] as usual).
"""

from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parent.parent


def mapped_sources() -> list[BuildSource]:
    """One BuildSource per .py file of every package setuptools installs, named as installed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dir: dict[str, str] = config["package-dir"]
    sources: list[BuildSource] = []
    for package in config["packages"]:
        parts = package.split(".")
        for depth in range(len(parts), 0, -1):  # the longest mapped prefix wins
            prefix = ".".join(parts[:depth])
            if prefix in package_dir:
                folder = ROOT / package_dir[prefix] / Path(*parts[depth:])
                break
        else:
            folder = ROOT / Path(*parts)
        for file in sorted(folder.glob("*.py")):
            module = package if file.stem == "__init__" else f"{package}.{file.stem}"
            sources.append(BuildSource(str(file.relative_to(ROOT)), module, None, str(ROOT)))
    return sources


def main(argv: list[str]) -> int:
    t0 = time.time()
    fscache = FileSystemCache()
    # The [tool.mypy] targets (bench, devtools) resolve normally; keyload comes from the mapping.
    sources, options = process_options(argv, fscache=fscache)
    sources = [source for source in sources if source.module.split(".")[0] != "keyload"] + mapped_sources()
    _, messages, blockers = run_build(sources, options, fscache, t0, sys.stdout, sys.stderr)
    if blockers:
        return 2
    errors = [message for message in messages if ": error:" in message]
    if errors:
        files = {message.split(":", 1)[0] for message in errors}
        print(f"Found {len(errors)} errors in {len(files)} files (checked {len(sources)} source files)")
        return 1
    print(f"Success: no issues found in {len(sources)} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
