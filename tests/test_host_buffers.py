"""`StepBuffers` (pagedrt/engine/host_buffers.py): two host buffers handed out in turn, one
per step, grown past their size without touching slices already handed out."""

import numpy as np
import torch

from pagedrt.engine.host_buffers import StepBuffers, to_device


def test_steps_alternate_and_slices_stay_valid():
    buffers = StepBuffers(8, pin=False)
    buffers.next_step()
    a = buffers.take(3)
    a.fill_(1)
    b = buffers.take(4)  # same step: the next slice of the same buffer
    b.fill_(2)
    assert a.data_ptr() + 3 * 8 == b.data_ptr()
    big = buffers.take(6)  # past the size: a new buffer, twice the step's need
    big.fill_(3)
    assert buffers.buffers[buffers.turn].numel() == 2 * (3 + 4 + 6)
    assert a.tolist() == [1] * 3 and b.tolist() == [2] * 4  # the old slices are untouched
    buffers.next_step()
    other = buffers.take(5)  # the other buffer: the previous step's slices are not reused
    other.fill_(4)
    assert big.tolist() == [3] * 6 and a.tolist() == [1] * 3
    buffers.next_step()
    again = buffers.take(2)  # back to the first step's buffer (grown), from its start
    assert again.data_ptr() == big.data_ptr()


def test_to_device_stages_each_copy_in_the_next_buffer():
    buffers = StepBuffers(4, pin=False)
    first = buffers.to_device(np.arange(3, dtype=np.int64), torch.device("cpu"))
    second = buffers.to_device(np.arange(10, 16, dtype=np.int64), torch.device("cpu"))
    assert first.tolist() == [0, 1, 2] and second.tolist() == list(range(10, 16))
    assert first.data_ptr() != second.data_ptr()


def test_to_device_takes_lists_arrays_and_tensors():
    """The one host -> device helper: a list, a numpy array or a tensor, in the dtype asked
    (or the values' own, float32 for Python floats); on the CPU the host tensor itself."""
    cpu = torch.device("cpu")
    out = to_device([0.5, 1.25], cpu)
    assert out.dtype == torch.float32 and out.tolist() == [0.5, 1.25]
    assert to_device([1, 0, 1], cpu, torch.bool).tolist() == [True, False, True]
    array = np.arange(6, dtype=np.int64)
    shared = to_device(array, cpu)
    assert shared.dtype == torch.int64 and np.shares_memory(shared.numpy(), array)
    assert to_device(array[::2], cpu).tolist() == [0, 2, 4]  # strided: made contiguous
    assert to_device(np.array([0.1, 0.9]), cpu, torch.float32).dtype == torch.float32
    t = torch.tensor([3, 4], dtype=torch.int32)
    assert to_device(t, cpu) is t and to_device(t, cpu, torch.int64).dtype == torch.int64
