"""Fixtures shared by the pytest files."""

import ctypes
import os
import subprocess

import pytest

import ndx_ctypes as ndx


@pytest.fixture
def make_context():
    """`make_context(mode, provider, **kw)`: a new ndx.Context, released after the
    test; `provider=True` adds the Python frame provider and HOST capture (unless
    `capture` is given), so sites name lines of the test file."""
    made = []

    def make(mode, provider, **kw):
        if provider:
            kw.setdefault("capture", ndx.NDX_CAPTURE_HOST)
        ctx = ndx.Context(mode=mode, **kw)
        made.append(ctx)
        if provider:
            ctx.set_frame_provider()
        return ctx

    yield make
    for c in made:
        c.release()


def header_dir():
    """The repository's include directory; skips the test when the header is absent."""
    include = os.path.join(ndx.REPO_ROOT, "include")
    if not os.path.isfile(os.path.join(include, "ndx.h")):
        pytest.skip(f"no header at {include}")
    return include


def c_layout(tmp_path, include, structs, consts=()):
    """Compiles a C program against `include/ndx.h` printing sizeof and every field's
    offsetof of `structs` ({C name: ctypes class}) and the values of `consts` (names
    of ndx_ctypes constants); returns (what C printed, what ctypes says)."""
    body, expected = [], []
    for name, cls in structs.items():
        body.append(f'printf("%zu\\n", sizeof({name}));')
        expected.append(ctypes.sizeof(cls))
        for field, _ in cls._fields_:
            body.append(f'printf("%zu\\n", offsetof({name}, {field}));')
            expected.append(getattr(cls, field).offset)
    for c in consts:
        body.append(f'printf("%d\\n", (int){c});')
        expected.append(getattr(ndx, c))
    src = tmp_path / "layout.c"
    src.write_text(
        '#include <stdio.h>\n#include <stddef.h>\n#include "ndx.h"\nint main(void) {\n'
        + "\n".join(body)
        + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-I", include, str(src), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()], expected
