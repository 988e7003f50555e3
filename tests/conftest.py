"""Test-session set-up shared by every test: no test ever touches the network.

The Hugging Face Hub is switched to offline mode and pointed at a private, empty cache before
anything imports ``huggingface_hub`` (this root conftest loads before any test module), so a test
that would download something fails at once instead of waiting, and tests fill the cache they need.
"""
import os
import shutil
import tempfile

import pytest

HF_CACHE = tempfile.mkdtemp(prefix='timm_recursive_hf_cache_')
os.environ['HF_HUB_OFFLINE'] = '1'
os.environ['HF_HUB_CACHE'] = HF_CACHE


def pytest_unconfigure(config):
    shutil.rmtree(HF_CACHE, ignore_errors=True)


@pytest.fixture
def unfused_attention():
    """FLOP counters miss fused attention kernels: count with timm's explicit attention."""
    import timm.layers.config  # imported here, after the Hub is set offline above
    previous = timm.layers.config._USE_FUSED_ATTN
    timm.layers.set_fused_attn(False)
    yield
    timm.layers.config._USE_FUSED_ATTN = previous
