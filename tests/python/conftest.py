"""Fixtures shared by the pytest files."""

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
