"""prefetch_to_jax: order, errors at the right batch, early stop, deleters, DataLoader workers."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="jax is not installed (pip install jax)")

import dlinspect  # noqa: E402
from _versions import enable_x64  # noqa: E402
from _helpers import Fresh, aligned  # noqa: E402
from dlinspect import DLDeviceType as D  # noqa: E402
from dlinspect import UnsupportedDeviceError, plan, prefetch_to_jax  # noqa: E402
from dlinspect.testing import DeleterCounter, FakeProducer, aligned_empty, make_capsule  # noqa: E402


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == "dlinspect-prefetch"]


def batch_of(i, counter=None):
    x = aligned_empty((4, 3), np.float32, 64)
    x[...] = i
    return {"x": make_capsule(x, counter=counter) if counter is not None else x,
            "y": np.full((4,), i, np.int32)}


@pytest.mark.parametrize("thread", [None, True, False])
def test_order_and_values(thread):
    loader = prefetch_to_jax((batch_of(i) for i in range(7)), thread=thread)
    got = [(float(b["x"][0, 0]), int(b["y"][0])) for b in loader]
    assert got == [(i, i) for i in range(7)]
    assert prefetch_threads() == []


@pytest.mark.parametrize("size", [1, 2, 5])
def test_every_deleter_once(size):
    counter = DeleterCounter()
    n = 0
    for b in prefetch_to_jax((batch_of(i, counter) for i in range(6)), size=size, thread=True):
        assert isinstance(b["x"], jax.Array)
        n += 1
    del b
    gc.collect()
    assert n == 6 and counter.calls == 6


@pytest.mark.parametrize("thread", [None, True, False])
@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_source_error_raised_at_its_batch(thread, error):
    # A KeyboardInterrupt of the source on the worker thread too reaches the consumer.
    boom = error("batch 3 is corrupt")

    def source():
        for i in range(6):
            if i == 3:
                raise boom
            yield batch_of(i)

    seen = []
    with pytest.raises(error) as info:
        for b in prefetch_to_jax(source(), size=4, thread=thread):
            seen.append(int(b["y"][0]))
    assert info.value is boom and seen == [0, 1, 2]
    assert prefetch_threads() == []


@pytest.mark.parametrize("thread", [None, True, False])
def test_conversion_error_raised_at_its_batch(thread):
    def source():
        for i in range(5):
            b = batch_of(i)
            if i == 2:
                b["x"] = FakeProducer(np.ones(3, np.float32), (D.kDLVulkan, 0))
            yield b

    seen = []
    with pytest.raises(UnsupportedDeviceError, match="kDLVulkan"):
        for b in prefetch_to_jax(source(), fallback="raise", thread=thread):
            seen.append(int(b["y"][0]))
    assert seen == [0, 1]


@pytest.mark.parametrize("thread", [None, True, False])
def test_stop_iteration_in_a_conversion_is_an_error_not_the_end(thread):
    # A pytree whose flatten leaks StopIteration: the epoch must not end quietly there,
    # dropping the batches after it.
    class Leaky:
        pass

    def flatten(_):
        raise StopIteration

    jax.tree_util.register_pytree_node(Leaky, flatten, lambda aux, children: Leaky())

    def source():
        for i in range(4):
            yield {"x": Leaky()} if i == 2 else batch_of(i)

    seen = []
    with pytest.raises(RuntimeError, match="StopIteration"):
        for b in prefetch_to_jax(source(), thread=thread):
            seen.append(int(b["y"][0]))
    assert seen == [0, 1]
    assert prefetch_threads() == []


def test_early_stop_joins_the_thread_and_frees_every_batch():
    counter = DeleterCounter()
    made = []
    closed = []

    def source():
        try:
            for i in range(1000):
                made.append(i)
                yield batch_of(i, counter)
        finally:
            closed.append(True)

    for b in prefetch_to_jax(source(), size=3, thread=True):
        break
    del b
    gc.collect()
    assert prefetch_threads() == []
    assert closed == [True]
    assert 1 <= len(made) <= 1 + 3 + 2  # the consumed one, the queue, one in hand
    assert counter.calls == len(made)


@pytest.mark.parametrize("thread", [None, True, False])
def test_consumer_exception_stops_the_worker(thread):
    with pytest.raises(KeyError):
        for b in prefetch_to_jax((batch_of(i) for i in range(100)), thread=thread):
            raise KeyError("consumer failed")
    assert prefetch_threads() == []


def test_device_and_options_pass_through():
    dev = jax.devices("cpu")[0]
    out = list(prefetch_to_jax([np.arange(3.0, dtype=np.float32)], device=dev, copy=True))
    assert out[0].devices() == {dev} and out[0].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError, match="size"):
        prefetch_to_jax([], size=0)
    with pytest.raises(ValueError, match="fallback"):
        prefetch_to_jax([], fallback="maybe")


def test_progress_bar(capsys):
    pytest.importorskip("tqdm", reason="tqdm is not installed")
    out = list(prefetch_to_jax([np.ones(2, np.float32)] * 3, progress=True))
    assert len(out) == 3
    assert "3/3" in capsys.readouterr().err


def test_progress_without_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)
    with pytest.raises(ImportError, match="pip install tqdm"):
        prefetch_to_jax([], progress=True)


@pytest.mark.slow
def test_dataloader_workers_shared_memory_zero_copy(torch):
    """Batches collated in worker processes arrive in shared memory; they import in place."""
    from torch.utils.data import DataLoader, TensorDataset

    images = torch.arange(64 * 3 * 8 * 8, dtype=torch.float32).reshape(64, 3, 8, 8)
    labels = torch.arange(64, dtype=torch.int32)
    loader = DataLoader(TensorDataset(images, labels), batch_size=16, num_workers=2,
                        multiprocessing_context="spawn")
    seen = 0
    for batch_images, batch_labels in loader:
        assert batch_images.is_shared()
        assert plan(batch_images).kind == "zero-copy"
        x = dlinspect.to_jax(batch_images)
        assert x.addressable_data(0).unsafe_buffer_pointer() == batch_images.data_ptr()
        np.testing.assert_array_equal(np.asarray(x), batch_images.numpy())
        seen += 1
    assert seen == 4
    # And through prefetch_to_jax, in order:
    firsts = [int(lab[0]) for _, lab in prefetch_to_jax(loader)]
    assert firsts == [0, 16, 32, 48]


@pytest.mark.slow
def test_exit_with_a_live_worker_is_clean():
    """The interpreter exits cleanly while a worker is still converting (atexit joins it)."""
    import subprocess
    code = ("import itertools, warnings, numpy as np, dlinspect\n"
            "warnings.simplefilter('ignore', dlinspect.DLInspectWarning)\n"
            "src = ({'x': np.ones((64, 64), np.float32), 'y': np.arange(64)} for _ in itertools.count())\n"
            "it = iter(dlinspect.prefetch_to_jax(src, size=64, thread=True))\n"
            "next(it)\n")
    for _ in range(5):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-2000:]


def test_stop_while_the_source_blocks(monkeypatch):
    from dlinspect import _prefetch
    monkeypatch.setattr(_prefetch, "_JOIN_S", 0.2)
    release = threading.Event()

    def source():
        yield np.ones(2, np.float32)
        release.wait(30)  # stuck
        yield np.ones(2, np.float32)

    g = iter(prefetch_to_jax(source(), thread=True))
    next(g)
    with pytest.warns(dlinspect.DLInspectWarning, match="inside next"):
        g.close()
    release.set()
    for t in prefetch_threads():
        t.join(5)
    assert prefetch_threads() == []


@pytest.mark.parametrize("thread", [None, True, False])
def test_worker_uses_the_callers_x64_mode(thread):
    with enable_x64(True):
        direct = dlinspect.to_jax(np.arange(4))
        fetched = next(iter(prefetch_to_jax([np.arange(4)], thread=thread)))
    assert direct.dtype == fetched.dtype == np.int64


@pytest.mark.parametrize("thread", [None, True, False])
def test_warnings_reach_the_consumer_at_its_line(thread):
    with pytest.warns(dlinspect.DLInspectWarning, match="int64") as record:
        for _ in prefetch_to_jax([np.arange(4)] * 3, thread=thread):
            pass
    assert len(record) >= 1 and {w.filename for w in record} == {__file__}


def test_auto_takes_a_thread_only_with_work_on_both_sides(monkeypatch):
    """thread=None: the first batches are timed on the consumer's thread; a worker takes
    over only when loading and the consumer's work both exceed the threshold."""
    import time
    from dlinspect import _prefetch
    # Margins of 3x each way: a loaded machine (two test runs on two cores) still takes
    # a list's batches as quick and a sleep as slow.
    monkeypatch.setattr(_prefetch, "_OVERLAP_S", 0.004)
    from dlinspect._core import DEFAULT, check_options as options
    # (no device named: JAX's default device, the CPU in this suite: tests/conftest.py)
    assert _prefetch._on_cpu(DEFAULT) and _prefetch._on_cpu(options(jax.devices("cpu")[0]))
    assert [b["x"].shape for b in prefetch_to_jax([batch_of(i) for i in range(6)])] == [(4, 3)] * 6
    monkeypatch.setattr(_prefetch, "_on_cpu", lambda options: False)   # as on a GPU

    def slow_source(n=12):
        for i in range(n):
            time.sleep(0.012)
            yield batch_of(i)

    def threads_during(source, consumer_s):
        seen = []
        for b in prefetch_to_jax(source):
            seen.append(len(prefetch_threads()))
            time.sleep(consumer_s)
        return seen

    assert threads_during(slow_source(), 0.0) == [0] * 12     # nothing to overlap with
    assert threads_during([batch_of(i) for i in range(12)], 0.012) == [0] * 12  # quick loading
    busy = threads_during(slow_source(), 0.012)                # both sides work: a thread
    assert busy[:4] == [0] * 4 and sum(busy[4:]) >= 4, busy
    assert prefetch_threads() == []


def test_auto_never_takes_a_thread_for_cpu_devices(monkeypatch):
    import time
    from dlinspect import _prefetch
    monkeypatch.setattr(_prefetch, "_OVERLAP_S", 0.0)

    def slow_source():
        for i in range(8):
            time.sleep(0.002)
            yield batch_of(i)

    seen = []
    for _ in prefetch_to_jax(slow_source(), device=jax.devices("cpu")[0]):
        seen.append(len(prefetch_threads()))
        time.sleep(0.002)
    assert seen == [0] * 8


@pytest.mark.parametrize("thread", [False, True, None])
def test_a_one_shot_source_refuses_a_second_epoch(thread):
    """An iterator gives one epoch; a second epoch over it (exhausted, or closed by an
    epoch stopped early) is an error, not an epoch of no batches. A source that starts
    again gives every epoch."""
    batches = [{"x": np.full(2, i, np.float32)} for i in range(3)]
    loader = prefetch_to_jax(iter(batches), thread=thread)
    assert [float(b["x"][0]) for b in loader] == [0.0, 1.0, 2.0]
    with pytest.raises(dlinspect.SourceExhaustedError, match="list_iterator.*new iterator"):
        iter(loader)
    gen = prefetch_to_jax((b for b in batches), thread=thread)
    for b in gen:
        break   # stopped early: the generator is closed
    with pytest.raises(dlinspect.SourceExhaustedError, match="generator"):
        iter(gen)
    again = prefetch_to_jax(batches, thread=thread)
    assert [len(list(again)) for _ in range(2)] == [3, 3]
    # a generator a first loader finished, given to a second loader: refused at once
    source = (b for b in batches)
    assert len(list(prefetch_to_jax(source, thread=thread))) == 3
    with pytest.raises(dlinspect.SourceExhaustedError, match="generator.*finished"):
        iter(prefetch_to_jax(source, thread=thread))
    assert list(prefetch_to_jax((b for b in []), thread=thread)) == []   # empty, not spent


class TestReport:
    """loader.report: per key path, bytes zero-copy and copied by reason, over an epoch."""

    @staticmethod
    def off():
        """Bytes past an alignment XLA:CPU views that it does not view (jaxlib < 0.5 views
        16-byte aligned memory; later ones 64-byte aligned)."""
        from dlinspect._core import jax_target as target
        return max(4, target().cpu_align // 2)

    @staticmethod
    def alignment_matters():
        """Whether this XLA:CPU copies memory for its alignment (jaxlib 0.4.30 views any)."""
        from dlinspect._core import jax_target as target
        return target().cpu_align > 4

    @classmethod
    def batch(cls, i, aligned=True):
        x = aligned_empty((16, 4), np.float32, 64, offset=0 if aligned else cls.off())
        x[...] = i
        ro = aligned_empty((8,), np.float32, 64)
        ro.flags.writeable = False
        return {"x": x, "ro": ro, "strided": np.ones((4, 4), np.float32)[:, ::2],
                "label": aligned_empty((4,), np.int32, 64), "id": f"b{i}"}

    @pytest.mark.parametrize("thread", [None, True, False])
    def test_counts_per_key_path_and_reason(self, thread):
        loader = prefetch_to_jax(Fresh(lambda i: self.batch(i, aligned=i % 2 == 0), 6),
                                 thread=thread)
        assert [float(b["x"][0, 0]) for b in loader] == [0, 1, 2, 3, 4, 5]
        got = loader.report.as_dict()
        assert loader.report.batches == 6 and set(got) == {"['x']", "['ro']", "['strided']",
                                                           "['label']"}   # ids: no tensor
        assert got["['x']"] == ({"batches": 6, "zero_copy_bytes": 3 * 256,
                                 "copied_bytes": {"alignment": 3 * 256}}
                                if self.alignment_matters() else
                                {"batches": 6, "zero_copy_bytes": 6 * 256, "copied_bytes": {}})
        assert got["['ro']"]["copied_bytes"] == {"read-only": 6 * 32}
        assert got["['strided']"]["copied_bytes"] == {"strides": 6 * 32}
        assert got["['label']"] == {"batches": 6, "zero_copy_bytes": 6 * 16, "copied_bytes": {}}
        table = str(loader.report).splitlines()
        assert table[0].split()[:2] == ["leaf", "batches"] and len(table) == 5
        assert any(line.split()[:4] == ["['x']", "6", "768", "768"] and line.endswith(
            "(alignment)") for line in table) or not self.alignment_matters()
        # A new epoch counts again; a failed batch counts nothing.
        assert len(list(loader)) == 6 and loader.report.batches == 6
        bad = prefetch_to_jax(Fresh(lambda i: [self.batch(0), {
            "x": FakeProducer(np.ones(2), refuse="no")}][i], 2), thread=False)
        with pytest.raises(dlinspect.ProducerError):
            list(bad)
        assert bad.report.batches == 1 and set(bad.report.as_dict()) == set(got)

    @pytest.mark.parametrize("size", [2, 4])
    @pytest.mark.parametrize("thread", [None, True, False])
    def test_counts_batches_handed_over(self, thread, size):
        """A batch counts once the user has it: converted ahead and never asked for, it
        does not (a break at the 5th batch counts 5, whatever the queue's depth)."""
        source = [{"x": aligned(np.full(4, i, np.float32))} for i in range(12)]
        loader = prefetch_to_jax(source, size, thread=thread)
        for i, _ in enumerate(loader):
            assert loader.report.batches == i + 1
            if i == 4:
                break
        assert loader.report.batches == 5
        assert loader.report.as_dict()["['x']"]["batches"] == 5

    def test_simultaneous_epochs_count_apart(self):
        """Two epochs of one loader running at once each count their own batches;
        loader.report is the latest begun."""
        source = [{"x": aligned(np.full(4, i, np.float32))} for i in range(6)]
        loader = prefetch_to_jax(source, thread=False)
        first = iter(loader)
        next(first), next(first)
        one = loader.report
        second = iter(loader)
        assert [float(b["x"][0]) for b in second] == [0, 1, 2, 3, 4, 5]
        assert loader.report is not one and loader.report.batches == 6
        rest = list(first)
        assert len(rest) == 4 and one.batches == 6 and loader.report.batches == 6

    @classmethod
    def big(cls, i, aligned):
        x = aligned_empty((128, 128), np.float32, 64, offset=0 if aligned else cls.off())
        x[...] = i
        return x

    def test_one_warning_per_loader_naming_the_fix(self):
        from dlinspect._core import ADVISE_AFTER, ADVISE_MIN_BYTES
        if not self.alignment_matters():
            pytest.skip("this jaxlib views memory of any alignment: no copy to advise on")
        assert self.big(0, True).nbytes == ADVISE_MIN_BYTES
        loader = prefetch_to_jax(Fresh(lambda i: {"x": self.big(i, aligned=False), "y": np.ones(4),
                                                  "small": self.batch(i, aligned=False)["x"]},
                                       ADVISE_AFTER + 2), narrow="ok", thread=False)
        with pytest.warns(dlinspect.DLInspectWarning,
                          match=r"^\['x'\]: copied in every one of the first 8 batches of "
                                r"the epoch \(65536 bytes each\).*To fix: make the batches "
                                r"with dlinspect\.stack") as seen:
            list(loader)
            list(loader)   # a second epoch: no second warning
        assert len([w for w in seen if "copied in every" in str(w.message)]) == 1
        # Narrowing the user asked for (narrow="ok") is no advice; a leaf copied only in
        # some batches, or small ("small" above), neither.
        quiet = prefetch_to_jax(Fresh(lambda i: {"y": np.ones(4), "x": self.big(i, aligned=i != 3)},
                                      ADVISE_AFTER), narrow="ok", thread=False)
        import warnings as _w
        with _w.catch_warnings():
            _w.simplefilter("error", dlinspect.DLInspectWarning)
            list(quiet)

    def test_one_warning_for_several_reasons_together(self):
        """A leaf copied in every batch for reasons that change from batch to batch or
        come together (memory-mapped read-only batches, some misaligned) is advised on,
        each reason's fix named; one with a reason the user cannot remove is not."""
        from dlinspect._core import ADVISE_AFTER

        def frozen(i):
            x = self.big(i, aligned=i % 2 == 0)
            x.flags.writeable = False
            return x

        loader = prefetch_to_jax(Fresh(lambda i: {"x": frozen(i)}, ADVISE_AFTER), thread=False)
        with pytest.warns(dlinspect.DLInspectWarning, match="copied in every") as seen:
            list(loader)
        text = [str(w.message) for w in seen if "copied in every" in str(w.message)]
        assert len(text) == 1 and 'readonly="share"' in text[0]
        assert ("dlinspect.stack" in text[0]) == self.alignment_matters()
        copied = loader.report.as_dict()["['x']"]["copied_bytes"]
        assert sum(copied.values()) == ADVISE_AFTER * 128 * 128 * 4
        assert set(copied) == ({"read-only", "read-only, alignment"}
                               if self.alignment_matters() else {"read-only"})
        # float64 read-only: its narrowing copy stays whatever the user does (x64 off).
        wide = [frozen(i).astype(np.float64) for i in range(ADVISE_AFTER)]
        for x in wide:
            x.flags.writeable = False
        kept = prefetch_to_jax([{"x": x} for x in wide], thread=False, narrow="ok")
        import warnings as _w
        with _w.catch_warnings():
            _w.simplefilter("error", dlinspect.DLInspectWarning)
            list(kept)
        assert all("narrowing" in r for r in kept.report.as_dict()["['x']"]["copied_bytes"])

    def test_single_tensors_and_stacked_batches(self):
        elements = [{"x": self.batch(i, aligned=False)["x"]} for i in range(4)]
        loader = prefetch_to_jax(Fresh(lambda i: dlinspect.stack(elements), 2), thread=False)
        list(loader)
        assert loader.report.as_dict()["['x']"]["copied_bytes"] == {}   # born aligned
        one = prefetch_to_jax(Fresh(lambda i: np.ones((4, 4), np.float32)[:, ::2], 2), thread=False)
        list(one)
        assert one.report.as_dict() == {"": {"batches": 2, "zero_copy_bytes": 0,
                                             "copied_bytes": {"strides": 64}}}


_FORKED_MID_EPOCH = """
import os, signal, time, warnings, numpy as np, dlinspect
warnings.simplefilter("ignore")   # (JAX's warning about fork() in a process with threads)

class Slow:   # a source still loading when the process forks
    def __iter__(self):
        for i in range(4):
            time.sleep(0.3 * (i > 0))
            yield {"x": np.full((4, 4), i, np.float32)}

loader = dlinspect.prefetch_to_jax(Slow(), thread=True)
it, other = iter(loader), iter(loader)
next(it)
next(other)
pid = os.fork()
if pid == 0:
    signal.alarm(60)   # (a child that hangs is killed, not left behind)
    other.close()   # (an epoch dropped in the child leaves the parent's worker's source be)
    try:
        next(it)
        os._exit(3)
    except RuntimeError as exc:
        ok = "forked from it mid-epoch" in str(exc)
    # a new epoch, begun in the child (read back by NumPy: JAX compiles nothing in a
    # process forked after it started its threads)
    sums = [int(np.asarray(b["x"]).sum()) for b in loader]
    os._exit(0 if ok and sums == [16 * i for i in range(4)] else 4)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), len(list(it)), len(list(other)))
"""


def test_a_process_forked_mid_epoch_gets_an_error_not_a_hang():
    """A child forked while a worker thread converts has no such thread: the epoch it
    inherited raises, saying to begin a new one, which works; the parent goes on."""
    import os
    import subprocess
    proc = subprocess.run([sys.executable, "-c", _FORKED_MID_EPOCH], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["0", "3", "3"] and "Exception ignored" not in proc.stderr
