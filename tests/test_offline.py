"""Offline without waiting: an unreachable Hub is found once, said in one line, and the libraries go offline."""
import logging
import os
import sys

import pytest
import timm
from huggingface_hub import constants

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.models import _hub as offline

UNREACHABLE = 'http://127.0.0.1:9'  # the discard port: refused at once, no network needed


@pytest.fixture
def online_process(monkeypatch):
    """A process that has not checked the Hub and is not in offline mode; everything restored afterwards."""
    monkeypatch.setattr(offline, '_checked', False)
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', False)
    monkeypatch.setenv('HF_HUB_OFFLINE', '0')  # recorded, so restored whatever the test sets
    if 'datasets' in sys.modules:
        monkeypatch.setattr(sys.modules['datasets'].config, 'HF_HUB_OFFLINE', False)


def test_an_unreachable_hub_switches_the_libraries_offline_once(online_process, monkeypatch, caplog):
    import datasets
    monkeypatch.setattr(constants, 'ENDPOINT', UNREACHABLE)
    with caplog.at_level(logging.WARNING, logger='timm_recursive'):
        assert offline.go_offline_if_hub_unreachable() is True
        assert offline.go_offline_if_hub_unreachable() is True  # once: no second check, no second note
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and UNREACHABLE in notes[0] and 'HF_HUB_OFFLINE=1' in notes[0]
    assert constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE and os.environ['HF_HUB_OFFLINE'] == '1'


def test_a_reachable_hub_leaves_online_mode_alone(online_process, monkeypatch):
    monkeypatch.setattr(offline, '_hub_answers', lambda endpoint, timeout: True)
    assert offline.go_offline_if_hub_unreachable() is False
    assert not constants.HF_HUB_OFFLINE and os.environ['HF_HUB_OFFLINE'] == '0'


def test_offline_mode_set_by_the_user_asks_nothing(monkeypatch):
    monkeypatch.setattr(constants, 'HF_HUB_OFFLINE', True)

    def asked(endpoint, timeout):
        raise AssertionError('the Hub was asked although HF_HUB_OFFLINE is set')
    monkeypatch.setattr(offline, '_hub_answers', asked)
    assert offline.go_offline_if_hub_unreachable() is True


def test_pretrained_weights_offline_fail_at_once_in_one_sentence(online_process, monkeypatch, capfd):
    # without the check, huggingface_hub retried the download with backoff (30-50 s of "Retrying in 8s")
    monkeypatch.setattr(constants, 'ENDPOINT', UNREACHABLE)
    monkeypatch.setattr(offline, 'HUB_CHECK_TIMEOUT_S', 1.0)
    with pytest.raises(RuntimeError, match='no weights have been published for recursive_dsa_moe_tiny.fashion_mnist'):
        timm.create_model('recursive_dsa_moe_tiny.fashion_mnist', pretrained=True)
    assert 'Retry' not in capfd.readouterr().err
