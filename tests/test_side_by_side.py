"""kgtrace.compute.system.side_by_side: chunks of a pass run in threads come back in order, as a serial loop gives them."""

import threading
import time

import pytest
import torch

from kgtrace.compute.system import side_by_side

CPU = torch.device("cpu")


@pytest.fixture
def two_threads(torch_threads):
    torch_threads(2)


def test_results_come_in_order_from_several_threads_of_one_core_each(two_threads):
    seen = []

    def work(n, own):
        seen.append((threading.current_thread().name, torch.get_num_threads(), torch.is_grad_enabled()))
        x = torch.ones(3, requires_grad=True)
        return n, (x * n).sum()

    got = list(side_by_side(work, range(7), CPU, object))
    assert [n for n, _ in got] == list(range(7))
    assert all(result[0] == n and result[1].item() == 3 * n and not result[1].requires_grad for n, result in got)
    assert {name.startswith("kgtrace-chunk") for name, _, _ in seen} == {True}  # all in the pool's threads
    assert {threads for _, threads, _ in seen} == {1}  # the intra-op threads divided between the two workers
    assert {grad for _, _, grad in seen} == {False}  # under no_grad, which is per thread
    assert torch.get_num_threads() == 2  # restored after the pass


def test_serial_where_it_cannot_help(two_threads):
    names = []

    def work(n, own):
        names.append(threading.current_thread().name)
        return n

    assert list(side_by_side(work, range(3), CPU, object, enabled=False)) == [(0, 0), (1, 1), (2, 2)]
    torch.set_num_threads(1)
    assert list(side_by_side(work, range(3), CPU, object)) == [(0, 0), (1, 1), (2, 2)]
    assert set(names) == {threading.current_thread().name}


def test_an_error_in_a_chunk_reaches_the_consumer_and_the_threads_are_restored(two_threads):
    def work(n, own):
        if n == 2:
            raise ValueError("chunk 2")
        return n

    taken = []
    with pytest.raises(ValueError, match="chunk 2"):
        for n, _ in side_by_side(work, range(5), CPU, object):
            taken.append(n)
    assert taken == [0, 1]
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("threads", [2, 4])
def test_no_two_chunks_hold_the_same_private_object_at_once(torch_threads, threads):
    """Each worker has its own: a chunk that holds it is never joined by another (which would see its changes)."""
    torch_threads(threads)
    made, holding, clashes = [], set(), []
    lock = threading.Lock()

    def private():
        made.append(object())
        return made[-1]

    def work(n, own):
        with lock:
            if id(own) in holding:
                clashes.append(n)
            holding.add(id(own))
        time.sleep(0.002 * (n % 3))  # uneven chunks, so that workers overtake each other
        with lock:
            holding.discard(id(own))
        return n

    assert [n for n, _ in side_by_side(work, range(40), CPU, private)] == list(range(40))
    assert clashes == [] and len(made) == threads
    made.clear()
    torch.set_num_threads(1)
    list(side_by_side(work, range(5), CPU, private))
    assert len(made) == 1  # a serial loop makes one
