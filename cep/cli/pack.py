"""``vigil pack OUT.tar.gz``: the installed Python environment (Vigil, its native dependencies,
PySpark's Python side) as one relocatable archive, for Spark executors that have none of it.

The archive is made with ``venv-pack``. An editable install of Vigil (``pip install -e``) is
only an import hook pointing at the source tree, which venv-pack would pack as it is (a hook
to a path the executors do not have); so the packages the hook maps go into the archive's
``site-packages`` as a regular install lays them out (package data included), and the hook is
left out.
PySpark's jars are left out too: an executor's JVM has its own, and its Python never reads
them. ``vigil run --pack OUT.tar.gz`` (or ``spark_udf.session(pack=...)``) ships the archive
with ``spark.archives`` (see ``docs/deploy.md``).
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from cep.cli.arguments import EXIT_OK, UsageError

__all__ = ["configure_parser", "editable_packages", "pack_environment"]

_DISTRIBUTION = "vigil"
_LEFT_OUT = (
    "*/site-packages/pyspark/jars/*",  # the executor JVM's own; never read by Python
    "*/site-packages/__editable__*",  # the editable install's import hook
    "*/site-packages/__pycache__/__editable__*",
)


def configure_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "pack",
        help="pack this Python environment (Vigil included) for Spark executors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", metavar="OUT.tar.gz", help="the archive to write")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    parser.add_argument(
        "--compress-level", type=int, default=1, choices=range(10), metavar="0-9",
        help="gzip level (default 1: packing is dominated by compression)",
    )
    parser.set_defaults(handler=_handle)
    return parser


def _handle(args: argparse.Namespace) -> int:
    began = time.monotonic()
    out = pack_environment(args.out, force=args.force, compress_level=args.compress_level)
    size_mb = os.path.getsize(out) / 1e6
    print(f"vigil pack: wrote {out} ({size_mb:.0f} MB, {time.monotonic() - began:.0f} s); "
          f"run with --pack {out}", file=sys.stderr)
    return EXIT_OK


def editable_packages(prefix: str | None = None) -> dict[str, Path]:
    """The packages an editable install of Vigil maps to its source tree (dotted name ->
    directory), read from the import hook setuptools installs in ``site-packages``; empty when
    Vigil is installed normally (its files are then packed as they are)."""
    site = Path(sysconfig.get_paths(vars={"base": prefix or sys.prefix})["purelib"])
    mapping: dict[str, Path] = {}
    for hook in site.glob(f"__editable___{_DISTRIBUTION}_*_finder.py"):
        # The hook's MAPPING is a literal dict; read it without importing the hook.
        tree = ast.parse(hook.read_text(encoding="utf-8"))
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) else None)
            if isinstance(target, ast.Name) and target.id == "MAPPING" and node.value:
                value = ast.literal_eval(node.value)
                mapping.update({name: Path(path) for name, path in value.items()})
    return mapping


def pack_environment(
    out: str, *, prefix: str | None = None, force: bool = False, compress_level: int = 1
) -> str:
    """Write the virtual environment at ``prefix`` (default: this interpreter's) to ``out``
    (``.tar.gz``, ``.zip`` ...), with Vigil's packages copied in when it is an editable install.

    Raises
    ------
    UsageError
        When this interpreter is not in a virtual environment, venv-pack is missing or
        ``out`` exists (without ``force``).
    """
    try:
        import venv_pack
    except ImportError as exc:
        raise UsageError("vigil pack needs venv-pack: pip install venv-pack") from exc
    prefix = prefix or sys.prefix
    if prefix == sys.base_prefix and not os.path.exists(os.path.join(prefix, "pyvenv.cfg")):
        raise UsageError("vigil pack packs a virtual environment; run it from one (python -m "
                         "venv ENV; ENV/bin/pip install vigil)")
    if os.path.exists(out) and not force:
        raise UsageError(f"{out} exists (--force to overwrite)")
    env = venv_pack.Env(prefix)
    for pattern in _LEFT_OUT:
        env = env.exclude(pattern)
    packages = editable_packages(prefix)
    if packages:
        site = os.path.relpath(sysconfig.get_paths(vars={"base": prefix})["purelib"], prefix)
        env.files = env.files + _package_files(packages, site)
    try:
        return str(env.pack(output=out, force=force, compress_level=compress_level))
    except venv_pack.VenvPackException as exc:
        raise UsageError(f"vigil pack: {exc}") from exc


def _package_files(packages: dict[str, Path], site: str) -> list[Any]:
    """venv-pack records of the source files of ``packages`` (dotted name -> directory),
    placed in ``site`` as a regular install places them (package data included)."""
    import venv_pack

    files = []
    for name, directory in sorted(packages.items()):
        base = os.path.join(site, *name.split("."))
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                target = os.path.join(base, str(path.relative_to(directory)))
                files.append(venv_pack.File(str(path), target))
    return files
