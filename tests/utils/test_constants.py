import pytest
import torch
from conftest import DEVICES

from fbo_torch.utils import keyed_random as kr
from fbo_torch.utils.constants import _runs, constant_tensor


@pytest.mark.parametrize("device", DEVICES)
def test_constant_tensor_values_dtype_device(device):
    t = constant_tensor([0.5, -2.0, 3], dtype=torch.float64, device=device)
    assert t.dtype == torch.float64 and t.device.type == device and t.shape == (3,)
    assert t.cpu().tolist() == [0.5, -2.0, 3.0]
    i = constant_tensor([1, 2**40], dtype=torch.long, device=device)
    assert i.cpu().tolist() == [1, 2**40]
    assert constant_tensor([], dtype=torch.float32, device=device).shape == (0,)


def test_runs_of_equal_values_are_one_fill_each():
    # on a GPU each run is one fill: d equal lower bounds cost one kernel, and 100 values in 3 runs
    # stay below the 64-fill limit (beyond it the values are copied from the host)
    assert _runs([]) == []
    assert _runs([0.5] * 100 + [1.5] + [2] * 3) == [(0, 100, 0.5), (100, 101, 1.5), (101, 104, 2)]
    assert [r[:2] for r in _runs([1, 1.0, True])] == [(0, 1), (1, 2), (2, 3)]  # equal, but other types
    assert [r[:2] for r in _runs([float("nan")] * 2)] == [(0, 1), (1, 2)]  # nan != nan: one run each


@pytest.mark.cuda
def test_constant_tensor_and_int_key_fold_do_not_synchronize():
    dev = torch.device("cuda")
    v = torch.arange(4, device=dev)
    expected = kr.fold(torch.tensor(kr.root_key(3), device=dev), v)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        t = constant_tensor([1.0, 2.0], dtype=torch.float64, device=dev)
        long = constant_tensor([0.5] * 100 + [1.5] + [2] * 3, dtype=torch.float64, device=dev)  # 3 runs
        folded = kr.fold(kr.root_key(3), v)  # a Python-int key folded with a device tensor
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert t.cpu().tolist() == [1.0, 2.0]
    assert long.cpu().tolist() == [0.5] * 100 + [1.5] + [2.0] * 3
    assert torch.equal(folded, expected)
