"""Running code under the emulated CUDA driver (tests/cuda_emu), for pytest files.

    import cuda_emu
    d = cuda_emu.emu_dir()                       # builds once per process; skips without g++
    env = cuda_emu.emu_env(NDX_EMU_ASYNC="1")    # LD_LIBRARY_PATH starts with d
    r = cuda_emu.run_under_emu("import cuda_driver; print(cuda_driver.available())")
    assert r.returncode == 0, r.stderr

The emulated libcuda.so.1 only ever runs in subprocesses: loaded into the pytest
process it would answer every later dlopen("libcuda.so.1") there, shadowing the real
driver of a GPU machine for the other test files.

The build goes to $NDX_EMU_DIR when set, else to a directory of the system's temp dir
named after this checkout; tests/cuda_emu/build.py reuses it while its inputs are
unchanged. The environment's NDX_EMU_* settings pass through to the subprocess (so a
whole run can be made asynchronous with NDX_EMU_ASYNC=1) unless `emu_env` overrides
them; NDX_CUDA_DISABLE is dropped, since the point is to use the driver.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from typing import Optional, Sequence, Union

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
BUILD_SCRIPT = os.path.join(REPO, "tests", "cuda_emu", "build.py")

_built: dict = {}  # "dir" once built in this process


def builder():
    """tests/cuda_emu/build.py as a module (its `build(out_dir)`)."""
    spec = importlib.util.spec_from_file_location("ndx_cuda_emu_build", BUILD_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def default_dir() -> str:
    tag = hashlib.sha256(REPO.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"ndx-cuda-emu-{os.getuid()}-{tag}")


def emu_dir() -> str:
    """The directory holding the emulated libcuda.so.1 (built on first use in this
    process). Skips the calling test when g++ is missing; a failing compilation is
    an error."""
    if "dir" not in _built:
        out = os.environ.get("NDX_EMU_DIR") or default_dir()
        try:
            builder().build(out)
        except FileNotFoundError as e:
            pytest.skip(f"g++ not found: the emulated CUDA driver needs it ({e})")
        _built["dir"] = os.path.abspath(out)
    return _built["dir"]


def emu_env(**extra) -> dict:
    """A copy of os.environ whose LD_LIBRARY_PATH starts with emu_dir() and whose
    PYTHONPATH starts with tests/python (for `import cuda_driver`), updated with
    `extra` (values made str; None removes the variable)."""
    d = emu_dir()
    env = dict(os.environ)
    env.pop("NDX_CUDA_DISABLE", None)
    for var, first in (("LD_LIBRARY_PATH", d), ("PYTHONPATH", HERE)):
        env[var] = first + (os.pathsep + env[var] if env.get(var) else "")
    for k, v in extra.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def run_under_emu(code_or_args: Union[str, Sequence[str]], env: Optional[dict] = None,
                  timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs `python3 -c code` (a str) or `python3 *args` (e.g. ["-m", "pytest", ...])
    in the repository root under emu_env() (or `env`); returns the CompletedProcess
    with text stdout and stderr."""
    if isinstance(code_or_args, str):
        cmd = [sys.executable, "-c", code_or_args]
    else:
        cmd = [sys.executable, *code_or_args]
    return subprocess.run(cmd, env=emu_env() if env is None else env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
