"""Fixtures the training and evaluation tests share."""

import pytest
import torch

import hooked


@pytest.fixture(scope="module")
def one_thread():
    """Many small steps and forwards: on a busy shared machine torch's thread pool waits on its barrier longer than
    such a step computes, so a module asking for this runs on one thread (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def ioi_gpt2():
    """The bundled IOI GPT-2 (4 layers, d_model 128)."""
    return hooked.load("hooked/ioi-gpt2")
