"""Put the clone's core/ and cli/ on this interpreter's path, beside setuptools' editable finder.

From the folder that holds the clone (a folder named rlsdk), `python -m pytest` and `python -c` put that
folder first on sys.path, and the clone would be imported as an empty namespace package `rlsdk`
(`No module named 'rlsdk.plugins.records'`); a regular package found on sys.path wins over it. Run by
scripts/setup.sh and by CI for each environment it makes."""

import sysconfig
from pathlib import Path

root = Path(__file__).resolve().parents[1]
pth = Path(sysconfig.get_paths()["purelib"]) / "rlsdk-source-folders.pth"
pth.write_text(f"{root / 'core'}\n{root / 'cli'}\n")
print(f"wrote {pth}")
