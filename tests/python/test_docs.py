"""The README's C snippets, as a new user would use them: each is wrapped in the
smallest program it implies, compiled against include/ndx.h with
`-std=c99 -Wall -Wextra -Werror`, linked against the library under test and run, and
what the README says about its output (the error text in its comments, the lines
and sequence numbers in its prose) is checked against what it printed.

Run: NDX_LIBRARY=/path/to/libndx.so python3 -m pytest -q tests/python/test_docs.py
"""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ndx_ctypes as ndx  # noqa: E402
from conftest import header_dir  # noqa: E402

README = os.path.join(ndx.REPO_ROOT, "README.md")


def readme_text():
    with open(README, encoding="utf-8") as f:
        return f.read()


def c_snippets():
    """The ```c blocks of the README, in order, as lists of lines."""
    return [b.split("\n")[:-1] for b in re.findall(r"```c\n(.*?)```", readme_text(), re.S)]


def build_and_run(tmp_path, name, source):
    """Compiles `source` as a C99 program with every warning an error, links it
    against the library under test and runs it; returns (stdout, stderr)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    include = header_dir()
    # The library has a SONAME (libndx.so.0): link and run through a directory that
    # names it both ways, whatever the file under test is called.
    libdir = tmp_path / "lib"
    libdir.mkdir(exist_ok=True)
    for link in ("libndx.so", "libndx.so.0"):
        if not (libdir / link).exists():
            os.symlink(os.path.realpath(ndx.library_path()), libdir / link)
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    exe = tmp_path / name
    subprocess.run(
        [cc, "-std=c99", "-g", "-Wall", "-Wextra", "-Werror", "-I", include, str(src),
         "-L", str(libdir), "-lndx", f"-Wl,-rpath,{libdir}", "-lm", "-pthread",
         "-o", str(exe)],
        check=True,
    )
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout, run.stderr


def split_includes(lines):
    includes = [line for line in lines if line.startswith("#include")]
    body = [line for line in lines if not line.startswith("#include")]
    return includes, body


def test_readme_import_snippet_fails_as_its_comments_say(tmp_path):
    """'Using it from C': a DLPack import of a tensor with shape[1] = -3 prints the
    error its comment shows, leaves `managed` with the caller (no deleter call); with a
    valid shape the same code imports it and the release runs the deleter once."""
    snippet = c_snippets()[0]
    includes, body = split_includes(snippet)
    expected = re.search(r"/\* \.\.\. (.*?) \.\.\. \*/", "\n".join(body)).group(1)
    assert "shape[1] is -3" in expected
    source = "\n".join(
        includes
        + [
            "#include <stdio.h>",
            "#include <string.h>",
            "static int deleted = 0;",
            "static void deleter(DLManagedTensorVersioned* self) { (void)self; deleted++; }",
            "static void snippet(DLManagedTensorVersioned* managed) {",
        ]
        + body
        + [
            "}",
            "int main(void) {",
            "  float data[6] = {0};",
            "  int64_t shape[2] = {2, -3};",
            "  DLManagedTensorVersioned m;",
            "  memset(&m, 0, sizeof m);",
            "  m.version.major = DLPACK_MAJOR_VERSION;",
            "  m.version.minor = DLPACK_MINOR_VERSION;",
            "  m.deleter = deleter;",
            "  m.dl_tensor.data = data;",
            "  m.dl_tensor.device.device_type = kDLCPU;",
            "  m.dl_tensor.ndim = 2;",
            "  m.dl_tensor.shape = shape;",
            "  m.dl_tensor.dtype.code = kDLFloat;",
            "  m.dl_tensor.dtype.bits = 32;",
            "  m.dl_tensor.dtype.lanes = 1;",
            "  snippet(&m);",
            '  printf("deleted after the failed import: %d\\n", deleted);',
            "  shape[1] = 3;",
            "  snippet(&m);",
            '  printf("deleted after the release: %d\\n", deleted);',
            "  return 0;",
            "}",
            "",
        ]
    )
    out, err = build_and_run(tmp_path, "readme_import", source)
    assert expected in err, err
    assert "Traceback (most recent call last):" in err, err
    assert "deleted after the failed import: 0" in out, out
    assert "deleted after the release: 1" in out, out
    assert err.count("Traceback") == 1, err  # the valid import printed nothing


def test_readme_async_snippet_points_at_the_lines_it_names(tmp_path):
    """'Asynchronous errors that point at your line': each snippet line annotated
    `/* line N */` is placed at line N of the program; the wait's error is the
    ValueError of the invocation and line the prose names, caused by the `div`
    failure of the sequence number and line the prose names."""
    snippet = c_snippets()[1]
    text = readme_text()
    prelude = [
        "#include <ndx.h>",
        "#include <stdio.h>",
        "#include <string.h>",
        "int main(void) {",
        "  const int32_t num[4] = {10, 20, 30, 40}, den[4] = {2, 5, 0, 8};",
        "  const int64_t shape[1] = {4};",
        "  ndx_tensor_t *a = NULL, *b = NULL, *q = NULL;",
        "  ndx_future_t *f1 = NULL, *f2 = NULL;",
        "  ndx_tensor_from_host(num, NDX_DTYPE_INT32, 1, shape, NULL, NULL, &a);",
        "  ndx_tensor_from_host(den, NDX_DTYPE_INT32, 1, shape, NULL, NULL, &b);",
        "  ndx_input_t div_in[2] = {{a, NULL}, {b, NULL}};",
    ]
    annotated = [
        (i, int(m.group(1)))
        for i, line in enumerate(snippet)
        if (m := re.search(r"/\* line (\d+)\b", line))
    ]
    assert annotated, "the snippet names no lines"
    # Put the first annotated snippet line at its line number, then pad before each
    # later one so that it lands on its own.
    first_index, first_line = annotated[0]
    lines = list(prelude)
    pad = first_line - 1 - first_index - len(lines)
    assert pad >= 0, "the prelude does not fit above the snippet's first named line"
    lines += [""] * pad
    targets = dict(annotated)
    for i, line in enumerate(snippet):
        if i in targets:
            assert len(lines) + 1 <= targets[i], f"snippet line {i} cannot be at line {targets[i]}"
            lines += [""] * (targets[i] - 1 - len(lines))
        lines.append(line)
    for i, line_no in annotated:
        assert lines[line_no - 1] == snippet[i]
    lines += [
        "  const ndx_error_t* links[2] = {e, e ? ndx_error_cause(e) : NULL};",
        "  for (int k = 0; k < 2; k++) {",
        "    if (!links[k]) { printf(\"link %d: none\\n\", k); continue; }",
        "    ndx_frame_t fr;",
        "    memset(&fr, 0, sizeof fr);",
        "    fr.struct_size = sizeof fr;",
        "    ndx_error_t* fe = ndx_error_frame(links[k], 0, &fr);",
        "    printf(\"link %d: %s %s #%llu line %u\\n\", k,",
        "           ndx_error_kind_name(ndx_error_kind(links[k])), ndx_error_op(links[k]),",
        "           (unsigned long long)ndx_error_sequence(links[k]), fe ? 0u : fr.line);",
        "    ndx_error_free(fe);",
        "  }",
        "  ndx_error_free(e);",
        "  ndx_future_release(f1);",
        "  ndx_future_release(f2);",
        "  ndx_tensor_release(q);",
        "  ndx_tensor_release(a);",
        "  ndx_tensor_release(b);",
        "  ndx_context_release(ctx);",
        "  return 0;",
        "}",
        "",
    ]
    out, _ = build_and_run(tmp_path, "readme_async", "\n".join(lines))

    # What the code comments say: every ndx_invoke annotated with a line is enqueued there.
    got = dict(re.findall(r"link \d: ValueError (\w+) #\d+ line (\d+)", out))
    for i, line_no in annotated:
        m = re.search(r'ndx_invoke\(ctx, "(\w+)"', snippet[i])
        if m:
            assert got.get(m.group(1)) == str(line_no), (snippet[i], out)
    # What the prose says.
    outer = re.search(r"`e` is a (\w+) from `(\w+)` \(#(\d+), enqueued at line (\d+)\)", text)
    cause = re.search(r"cause is the original\s+`(\w+)` failure \(#(\d+)\) with frame 0 at line (\d+)", text)
    assert outer and cause, "the README's prose about the snippet changed: update this test"
    assert f"link 0: {outer.group(1)} {outer.group(2)} #{outer.group(3)} line {outer.group(4)}" in out, out
    assert f"link 1: ValueError {cause.group(1)} #{cause.group(2)} line {cause.group(3)}" in out, out


def test_readme_frame_provider_needs_host_capture():
    """The README: a frame provider is called only under NDX_CAPTURE_HOST or ALL; under
    the default (NATIVE) a Python caller's error carries no frame of its own file."""
    this = os.path.realpath(__file__)

    def own_lines(capture):
        kw = {} if capture is None else {"capture": capture}
        ctx = ndx.Context(mode=ndx.NDX_EVAL_SYNC_CPU, **kw)
        try:
            provider = ctx.set_frame_provider()
            img = ndx.tensor_from_numpy(np.zeros((2, 2, 1), np.uint8), layout="HWC")
            bad = {"x": 1, "y": 0, "w": 2, "h": 1}  # x + w = 3 is past the width 2
            with pytest.raises(ndx.NdxError) as info:
                line = sys._getframe().f_lineno + 1
                ctx.invoke("crop", [img], args=bad)
            frames = [f for f in info.value.frames if f.file and os.path.realpath(f.file) == this]
            return provider.calls, [f.line for f in frames], line
        finally:
            ctx.release()

    calls, lines, _ = own_lines(None)
    assert calls == 0 and lines == [], (calls, lines)
    for capture in (ndx.NDX_CAPTURE_HOST, ndx.NDX_CAPTURE_ALL):
        calls, lines, line = own_lines(capture)
        assert calls == 1 and lines and lines[0] == line, (capture, calls, lines, line)
    assert "NDX_CAPTURE_HOST" in readme_text()
