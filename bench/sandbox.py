"""What the tool sandbox costs per call (SB-1): `true` and `ls` sandboxed against the same bare.

python manage.py bench sandbox --json [--repeat 40] [--files 200]

Bare and sandboxed calls alternate in one run, so both see the same machine load; the figures
are medians, the added milliseconds and the ratio. `bash_tool_true` is the whole bash tool call
(quota walk, limits, output readers) on a workspace of `--files` files. `cgroup` alternates a
sandboxed `true` in a cgroup of its own with one under rlimits only (CC_SANDBOX_CGROUP=off), so
the cost of the per-call cgroup is measured in one run too; `limits` says which applies here.
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from django.test import override_settings

from bench._options import non_negative, positive
from toolcatalog import cgroups, sandbox
from toolcatalog.builtins import WorkspaceToolBox


def add_arguments(parser: Any) -> None:
    parser.add_argument("--repeat", type=positive, default=40, help="calls per measurement")
    parser.add_argument("--files", type=non_negative, default=200, help="files in the workspace")


def _ms(call: Any) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def run(options: dict[str, Any]) -> dict[str, Any]:
    sandbox.check()
    repeat = options["repeat"]
    figures: dict[str, Any] = {"repeat": repeat, "workspace_files": options["files"]}
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for index in range(options["files"]):
            (root / f"file{index}.txt").write_text(f"{index}\n")
        limits = sandbox.Limits.from_settings(wall_seconds=30)
        env = sandbox.environment()
        box = WorkspaceToolBox(root, approve=lambda name, arguments: True)
        for name, command in (("true", ["true"]), ("ls", ["ls", "-la"])):
            bare, boxed = [], []
            for _ in range(repeat):
                bare.append(
                    _ms(lambda command=command: subprocess.run(command, cwd=root, env=env, capture_output=True))  # noqa: S603
                )
                boxed.append(
                    _ms(lambda command=command: sandbox.run(root, command, limits=limits, output_cap=1_000_000))
                )
            bare_ms, boxed_ms = statistics.median(bare), statistics.median(boxed)
            figures[name] = {
                "bare_p50_ms": round(bare_ms, 2),
                "sandboxed_p50_ms": round(boxed_ms, 2),
                "added_ms": round(boxed_ms - bare_ms, 2),
                "ratio": round(boxed_ms / bare_ms, 2),
            }
        # The floor on this machine: bwrap with the fewest namespaces and mounts that run `true`.
        floor = [sandbox.bwrap_path() or "bwrap", "--unshare-user", "--unshare-pid", "--ro-bind", "/usr", "/usr"]
        floor += ["--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"]
        minimal = [_ms(lambda: subprocess.run([*floor, "true"], env=env, capture_output=True)) for _ in range(repeat)]  # noqa: S603
        figures["bwrap_minimal_true_p50_ms"] = round(statistics.median(minimal), 2)
        tool = [_ms(lambda: box.execute("bash", {"command": "true"})) for _ in range(repeat)]
        figures["bash_tool_true_p50_ms"] = round(statistics.median(tool), 2)
        figures["limits"] = cgroups.describe()
        if cgroups.layout() is not None:
            figures["cgroup"] = _cgroup_cost(root, limits, repeat)
    return figures


def _cgroup_cost(root: Path, limits: sandbox.Limits, repeat: int) -> dict[str, float]:
    with_cgroup, without = [], []
    for _ in range(repeat):
        with_cgroup.append(_ms(lambda: sandbox.run(root, ["true"], limits=limits, output_cap=1_000_000)))
        with override_settings(CC_SANDBOX_CGROUP="off"):
            cgroups.reset()
            cgroups.layout()  # found outside the timing, as a worker finds it once
            without.append(_ms(lambda: sandbox.run(root, ["true"], limits=limits, output_cap=1_000_000)))
        cgroups.reset()
        cgroups.layout()
    on, off = statistics.median(with_cgroup), statistics.median(without)
    return {"true_p50_ms": round(on, 2), "true_rlimits_only_p50_ms": round(off, 2), "added_ms": round(on - off, 2)}
