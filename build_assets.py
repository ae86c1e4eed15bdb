"""Build hook: the wheel carries templates/ and static/ as package data of `controlcenter` (OP-6).

They stay at the top of the checkout, where pages and tests edit them; the installed product
finds them under controlcenter/assets/ (controlcenter/settings.py looks in the checkout first).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools.command.build_py import build_py as _build_py

ASSET_FOLDERS = ("templates", "static")


class build_py(_build_py):  # noqa: N801 - setuptools looks the command up by this name
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for folder in ASSET_FOLDERS:
            source = root / folder
            if source.is_dir():
                shutil.copytree(source, Path(self.build_lib) / "controlcenter" / "assets" / folder, dirs_exist_ok=True)
