"""Unzip every wheel of a folder into one target folder in parallel, as ``pip install --no-deps --target``
places them (for wheels without ``.data/purelib`` or ``.data/platlib`` parts, which it refuses).

    python unpack_wheels.py WHEEL_DIR TARGET
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def unpack(wheel: Path, target: Path) -> int:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        if any(".data/purelib/" in n or ".data/platlib/" in n for n in names):
            raise ValueError(f"{wheel.name} has .data/purelib or platlib parts: install it with pip")
        for info in archive.infolist():
            path = target / info.filename
            if info.is_dir():
                path.mkdir(parents=True, exist_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, open(path, "wb") as dest:
                shutil.copyfileobj(source, dest, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(path, mode)
    return len(names)


def main() -> None:
    wheels, target = Path(sys.argv[1]), Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    files = sorted(wheels.glob("*.whl"), key=lambda w: -w.stat().st_size)  # the largest start first
    with ProcessPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        counts = list(pool.map(unpack, files, [target] * len(files)))
    print(f"unpacked {len(files)} wheels, {sum(counts)} files, into {target}")


if __name__ == "__main__":
    main()
