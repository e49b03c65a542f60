"""Shared test set-up.

Triton kernels run on CPU tensors only under its interpreter, and Triton reads TRITON_INTERPRET
when a kernel is defined, so it must be set before any kernel module is imported. On a machine
with a GPU the compiled path is tested instead.
"""

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except ImportError:  # the sim-only tests do not need torch
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip_cuda)
