"""GPU conventions for the suite, so it collects and passes on a machine without CUDA.

- ``@pytest.mark.gpu`` on a test (or ``pytestmark = pytest.mark.gpu`` on a module): skipped
  unless a CUDA device of capability 9.0 is visible.
- the ``cuda_device`` fixture: the ``torch.device`` to run on, or a skip.

CUDA is only queried when a test that needs it is about to run, never at import or
collection, so CPU-only runs do not even import torch on behalf of these hooks.
"""
from __future__ import annotations

import functools

import pytest

REQUIRED_CAPABILITY = (9, 0)


@functools.lru_cache(maxsize=None)
def _gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    capability = tuple(torch.cuda.get_device_capability(0))
    if capability != REQUIRED_CAPABILITY:
        major, minor = capability
        return f"needs sm_90 (Hopper); device 0 is sm_{major}{minor}"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        reason = _gpu_skip_reason()
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def cuda_device():
    reason = _gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    import torch

    return torch.device("cuda", 0)


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without CUDA, whatever this one has: live commands must stop before touching a GPU."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
