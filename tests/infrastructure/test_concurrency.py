"""Per-call hooks belong to the caller: threads and asyncio tasks sharing one model never see each other's.

Every concurrent result is compared with the same call run alone, sequentially, beforehand: exact
equality (torch.equal), since the same forward on the same inputs runs the same kernels in the same order (one
model, one thread count), whichever thread runs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooked
from hooked import ablate, metrics
from hooked.testing import random_model

N_THREADS, N_CALLS = 8, 50


@pytest.fixture(scope="module")
def model():
    return random_model("gpt2", seed=4, n_layers=2, n_heads=4)


@pytest.fixture(scope="module")
def tokens(model):
    return torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(1))


def zero_head(head: int):
    def fn(z, hook):
        z[:, :, head] = 0.0

    return fn


def scale_resid(factor: float):
    def fn(resid, hook):
        return resid * factor

    return fn


def work(model, tokens, worker: int, call: int):
    """One call of one worker: a different hook, and a different kind of call, for each (worker, call)."""
    head, layer = (worker + call) % model.cfg.n_heads, call % model.cfg.n_layers
    kind = call % 5
    if kind == 0:
        return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head(head))])
    if kind == 1:  # a cache of what the hook changed, and of what it did not
        name = f"blocks.{layer}.attn.hook_z"
        with model.hooks(fwd_hooks=[(name, zero_head(head))]):
            logits, cache = model.run_with_cache(tokens, names_filter=[name, "blocks.1.hook_resid_post"])
        return torch.cat([logits.flatten(), cache[name].flatten(), cache["blocks.1.hook_resid_post"].flatten()])
    if kind == 2:  # a sweep refuses outside hooks: another thread's must not count as outside
        metric = metrics.logit_diff(model, [1, 2], [3, 4])
        variants = {
            f"L{layer}H{h}": [(f"blocks.{layer}.attn.hook_z", ablate.zero(heads=h))]
            for layer in range(model.cfg.n_layers)
            for h in (head, (head + 1) % model.cfg.n_heads)
        }
        return hooked.sweep(model, tokens, variants, metric).values
    if kind == 3:  # nested contexts, and a mean reference computed from a clean forward inside a hooked one
        mean = ablate.mean(tokens[:, :5], heads=head, model=model)
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", scale_resid(1.0 + worker / 10))]):
            return model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", mean)])
    return model.generate(
        tokens,
        max_new_tokens=3,
        stop_at_eos=False,
        verbose=False,
        fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head(head))],
    )


def sequential(model, tokens, workers: int, calls: int) -> dict:
    return {(w, c): work(model, tokens, w, c) for w in range(workers) for c in range(calls)}


def test_threads_see_only_their_own_hooks(model, tokens):
    expected = sequential(model, tokens, N_THREADS, N_CALLS)
    wrong, errors = [], []
    start = threading.Barrier(N_THREADS)

    def thread(worker: int):
        start.wait()
        for call in range(N_CALLS):
            try:
                if not torch.equal(work(model, tokens, worker, call), expected[worker, call]):
                    wrong.append((worker, call))
            except Exception as error:  # noqa: BLE001 - reported below with the call that raised
                errors.append((worker, call, repr(error)))

    threads = [threading.Thread(target=thread, args=(w,)) for w in range(N_THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert not wrong, (
        f"{len(wrong)} of {N_THREADS * N_CALLS} concurrent calls differ from the same call alone: {wrong[:5]}"
    )


def test_hooks_on_the_model_are_shared_by_every_thread(model, tokens):
    fired = []
    # The Thread object, not get_ident(): an ident is reused once its thread has ended, and a short-lived
    # thread can end before the next one starts.
    model.add_hook("hook_embed", lambda x, hook: fired.append(threading.current_thread()))
    try:
        threads = [threading.Thread(target=lambda: [work(model, tokens, 0, 0) for _ in range(5)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        model.reset_hooks()
    assert len(fired) == 20 and set(fired) == set(threads)


def test_asyncio_tasks_see_only_their_own_hooks(model, tokens):
    async def task(worker: int):
        results = {}
        for call in range(10):
            with model.hooks(fwd_hooks=[(f"blocks.{call % 2}.attn.hook_z", zero_head((worker + call) % 4))]):
                await asyncio.sleep(0)  # another task runs here, inside this task's block
                results[call] = model(tokens)
            await asyncio.sleep(0)
        return results

    async def main():
        return await asyncio.gather(*(task(w) for w in range(4)))

    outcomes = asyncio.run(main())
    for worker, results in enumerate(outcomes):
        for call, logits in results.items():
            alone = model.run_with_hooks(
                tokens, fwd_hooks=[(f"blocks.{call % 2}.attn.hook_z", zero_head((worker + call) % 4))]
            )
            assert torch.equal(logits, alone), (worker, call)


def test_asyncio_mixed_calls_equal_sequential(model, tokens):
    expected = sequential(model, tokens, 4, 10)

    async def task(worker: int):
        out = {}
        for call in range(10):
            await asyncio.sleep(0)
            out[call] = await asyncio.to_thread(
                work, model, tokens, worker, call
            )  # a pool thread, in a copy of this task's context
        return out

    async def main():
        return await asyncio.gather(*(task(w) for w in range(4)))

    for worker, results in enumerate(asyncio.run(main())):
        for call, value in results.items():
            assert torch.equal(value, expected[worker, call]), (worker, call)


def test_a_task_started_in_a_block_sees_its_hooks_but_not_after_it_ends(model, tokens):
    seen = []

    async def child(started: asyncio.Event, go: asyncio.Event):
        model(tokens)  # inside the parent's block: its hook runs
        started.set()
        await go.wait()
        model(tokens)  # the block has ended: the hook must not run, though this task's context still holds it

    async def main():
        started, go = asyncio.Event(), asyncio.Event()
        with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: seen.append(1))]):
            running = asyncio.create_task(child(started, go))
            await started.wait()
        go.set()
        await running

    asyncio.run(main())
    assert len(seen) == 1


def test_a_thread_does_not_inherit_the_block_it_was_started_in(model, tokens):
    seen = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: seen.append(threading.get_ident()))]):
        other = threading.Thread(target=model, args=(tokens,))
        other.start()
        other.join()
        assert seen == []
        contextvars.copy_context().run(model, tokens)  # the documented way to hand a block's hooks on
    assert seen == [threading.get_ident()]


def test_shared_and_per_call_hooks_run_in_registration_order(model, tokens):
    order = []
    model.add_hook("hook_embed", lambda x, hook: order.append("shared 1"))
    try:
        with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: order.append("call"))]):
            model.add_hook("hook_embed", lambda x, hook: order.append("shared 2"))
            model.add_hook("hook_embed", lambda x, hook: order.append("first"), prepend=True)
            assert len(model.hook_dict["hook_embed"].fwd_hooks) == 4
            model(tokens)
    finally:
        model.reset_hooks()
    assert order == ["first", "shared 1", "call", "shared 2"]


def test_reset_inside_a_block_removes_the_block_hooks_for_this_caller(model, tokens):
    seen = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: seen.append(1))]):
        model.reset_hooks()
        assert not model.hook_dict["hook_embed"].listening
        model(tokens)
    model(tokens)
    assert seen == []


def test_hooks_suspended_hides_shared_hooks_only_for_this_caller(model, tokens):
    seen, other_saw = [], []
    model.add_hook("hook_embed", lambda x, hook: seen.append(threading.get_ident()))
    try:
        inside, leave = threading.Event(), threading.Event()

        def suspended():
            with model.hooks_suspended():
                model(tokens)
                inside.set()
                leave.wait()

        holder = threading.Thread(target=suspended)
        holder.start()
        inside.wait()
        model(tokens)  # this thread is not suspended
        other_saw.extend(seen)
        leave.set()
        holder.join()
    finally:
        model.reset_hooks()
    assert other_saw == [threading.get_ident()]


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n_threads=st.integers(2, 6), heads=st.lists(st.integers(0, 3), min_size=6, max_size=6))
def test_any_thread_count_gives_the_sequential_results(model, tokens, n_threads, heads):
    def call(head):
        return model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_z", zero_head(head))])

    expected = {h: call(h) for h in range(model.cfg.n_heads)}  # sequentially, before any thread starts
    results = {}

    def thread(worker: int):
        for i, head in enumerate(heads):
            head = (head + worker) % model.cfg.n_heads
            results[worker, i] = torch.equal(call(head), expected[head])

    threads = [threading.Thread(target=thread, args=(w,)) for w in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(results.values()) and len(results) == n_threads * len(heads)
