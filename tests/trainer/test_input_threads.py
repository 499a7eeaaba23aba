"""The input pipeline's threads yield the cores to the step: the threads made after `InputThreads`
(not Python's) are moved to SCHED_IDLE after each call; the threads that were there before, the
step's pools among them, and the trainer's own Python threads keep their priority."""

from __future__ import annotations

import contextlib
import io
import os
import threading

import pytest

tf = pytest.importorskip("tensorflow")
if not hasattr(os, "SCHED_IDLE"):
    pytest.skip("SCHED_IDLE is Linux's", allow_module_level=True)

from runfolder.storage import open_store  # noqa: E402
from trainer import input_threads  # noqa: E402
from trainer.checkpoint_store import CheckpointStore  # noqa: E402
from trainer.config import TrainConfig  # noqa: E402
from trainer.events import EventLog  # noqa: E402
from trainer.input_threads import InputThreads, thread_ids  # noqa: E402
from trainer.loop import TrainLoop  # noqa: E402
from trainer.signals import StopKeyPoller, StopRequest  # noqa: E402


def _policies() -> dict[int, int]:
    found = {}
    for tid in thread_ids():
        with contextlib.suppress(ProcessLookupError):  # it ended in between
            found[tid] = os.sched_getscheduler(tid)
    return found


def _pipeline():
    """A pipeline with threads of its own (parallel map, prefetch), its first element taken."""
    ds = tf.data.Dataset.range(10_000).map(lambda v: v * 2, num_parallel_calls=tf.data.AUTOTUNE)
    it = iter(ds.prefetch(tf.data.AUTOTUNE))
    assert int(next(it)) == 0
    return it


@pytest.fixture(autouse=True)
def _runtime():
    """TensorFlow's runtime (its inter- and intra-op pools) started before `InputThreads`, as the trainer's
    model is built before its pipeline is made."""
    assert int(tf.constant(1) + 1) == 2


@pytest.fixture
def python_thread():
    """A Python thread (as the trainer's uploader and watchers are) started after `InputThreads`."""
    done = threading.Event()
    started = []
    yield lambda: started.append(threading.Thread(target=done.wait, daemon=True)) or started[-1].start() or started[-1]
    done.set()
    for t in started:
        t.join(5)


def test_the_pipelines_threads_are_moved_and_nothing_else(python_thread):
    before = _policies()
    threads = InputThreads(enabled=True)
    watcher = python_thread()
    it = _pipeline()
    moved = threads.settle()
    assert moved >= 1 and len(threads.moved) == moved, (moved, sorted(thread_ids() - set(before)))
    now = _policies()
    idle = sorted(tid for tid in threads.moved if now.get(tid, os.SCHED_IDLE) == os.SCHED_IDLE)
    assert idle == sorted(threads.moved)
    assert not threads.moved & set(before)  # the step's pools (made before) keep their priority
    assert {tid: now[tid] for tid in before if tid in now} == {tid: p for tid, p in before.items() if tid in now}
    assert watcher.native_id not in threads.moved and now[watcher.native_id] == os.SCHED_OTHER
    assert now[threading.main_thread().native_id] == os.SCHED_OTHER
    assert threads.settle() == 0  # nothing new since

    # A pipeline made later from a normal thread (an epoch's restart) is found at the next look.
    again = _pipeline()
    assert threads.settle() >= 1
    assert all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in threads.moved & thread_ids())
    del it, again


def test_switched_off_moves_nothing():
    before = _policies()
    threads = InputThreads(enabled=False)
    it = _pipeline()
    assert threads.settle() == 0 and threads.moved == set()
    now = _policies()
    new = {tid: p for tid, p in now.items() if tid not in before}
    assert os.SCHED_OTHER in new.values(), new  # the pipeline's threads, left as made
    assert {t: now[t] for t in before if t in now} == {t: p for t, p in before.items() if t in now}
    del it


def test_a_refusal_is_said_once_and_the_run_goes_on(monkeypatch, capsys):
    calls = []

    def refuse(tid, policy, param):
        calls.append(tid)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(input_threads.os, "sched_setscheduler", refuse)
    threads = InputThreads(enabled=True)
    it = _pipeline()
    assert threads.settle() == 0 and len(calls) == 1
    assert not threads.enabled and "Operation not permitted" in threads.unavailable
    it2 = _pipeline()
    assert threads.settle() == 0 and len(calls) == 1  # not tried again
    err = capsys.readouterr().err
    assert err.count("keep their priority") == 1, err
    del it, it2


def test_a_platform_without_it_is_switched_off(monkeypatch):
    monkeypatch.delattr(input_threads.os, "sched_setscheduler")
    threads = InputThreads(enabled=True)
    assert not threads.enabled and "no sched_setscheduler" in threads.unavailable and threads.settle() == 0


def _loop(uri, work, model_dir, **options):
    cfg = TrainConfig(run_uri=uri, **{"model": "input_pipe_model:build", "code_dir": str(model_dir), "steps": 6, "batch_size": 8,
                                      "log_every": 2, "checkpoint_every_steps": 0, "steps_per_call": 2, **options})
    store = open_store(uri)
    events = EventLog(store, stream=io.StringIO())
    loop = TrainLoop(cfg, store=store, ckstore=CheckpointStore(store, emit=lambda kind, fields: None), events=events,
                     emit=events.emit, stop=StopRequest(), stop_key=StopKeyPoller(store, every=3600), chief=True,
                     multi_worker=False, work=str(work))
    loop.use(tf.distribute.MirroredStrategy(["/cpu:0"]))
    return loop


PIPE_MODEL = '''
import keras
import numpy as np
import tensorflow as tf

from trainer.models import ModelSpec


def build(config):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])

    def make_dataset(batch_size, seed):
        rng = np.random.default_rng(seed)
        x, y = rng.random((512, 8), dtype=np.float32), rng.random((512, 4), dtype=np.float32)
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(256, seed=seed).batch(batch_size, drop_remainder=True)
        return ds.map(lambda a, b: (a * 2.0, b), num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    return ModelSpec(model=model, loss=keras.losses.MeanSquaredError(reduction=None), make_dataset=make_dataset,
                     name="input_pipe")
'''


# The default is the kernel's sharing: SCHED_IDLE input starves beside any busy neighbour (bench/RESULTS.md, round seven).
@pytest.mark.parametrize(("priority", "moves"), [("idle", True), ("normal", False), (None, False)])
def test_the_loop_moves_its_pipelines_threads_on_one_cpu_replica(file_run, tmp_path, monkeypatch, priority, moves):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "input_pipe_model.py").write_text(PIPE_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    before = _policies()
    chosen = {} if priority is None else {"input_priority": priority}
    loop = _loop(file_run.uri, tmp_path / "work", tmp_path / "code", **chosen)
    loop.build()
    loop.restore()
    assert loop.train() is False and loop.state.step == 6
    loop.events.close()
    assert loop.input_threads.enabled is moves
    assert bool(loop.input_threads.moved) is moves
    now = _policies()
    assert all(now.get(t, os.SCHED_IDLE) == os.SCHED_IDLE for t in loop.input_threads.moved)
    assert {t: now[t] for t in before if t in now} == {t: p for t, p in before.items() if t in now}
    python = [t.native_id for t in threading.enumerate()]
    assert python and {now[t] for t in python if t in now} == {os.SCHED_OTHER}  # the main thread, the trainer's


class _Readings:
    """Stands in for /proc/stat, the process's CPU and the clock: one reading per look, as given."""

    def __init__(self, looks):
        self.looks = list(looks)  # (busy s, idle s, own s, when)
        self.at = -1

    def machine(self):
        self.at += 1
        busy, idle, _own, _when = self.looks[self.at]
        return busy, idle

    def own(self):
        return self.looks[self.at][2]

    def clock(self):
        return self.looks[self.at][3]


@pytest.mark.parametrize(("looks", "told", "read"), [
    # 2 cores, 1 s a call: the trainer 1.9 cores, others 0.1: quiet
    ([(0, 0, 0, 0), (2.0, 0.0, 1.9, 1), (4.0, 0.0, 3.8, 2)], None, 3),
    # others take 1.2 cores and leave none idle: told once, at the look that saw it, and no more looks after
    ([(0, 0, 0, 0), (2.0, 0.0, 0.8, 1), (4.0, 0.0, 1.6, 2)], 1.2, 2),
    # others busy (1.2 cores) but the machine has idle cores (a larger one): the input is not short of any
    ([(0, 0, 0, 0), (3.0, 5.0, 1.8, 1), (6.0, 10.0, 3.6, 2)], None, 3),
    # a short call (0.1 s) is not judged: 10 ms ticks make its share noise; the window grows to the next look
    ([(0, 0, 0, 0), (0.1, 0.0, 0.0, 0.1), (2.0, 0.0, 1.9, 1)], None, 3),
    # only the last call has a neighbour (0.5 cores: at the bound)
    ([(0, 0, 0, 0), (2.0, 0.0, 1.9, 1), (4.0, 0.1, 3.4, 2)], 0.5, 3),
])
def test_a_neighbour_taking_the_idle_cores_is_said_once(monkeypatch, capsys, looks, told, read):
    readings = _Readings(looks)
    threads = InputThreads(enabled=True, machine=readings.machine, own=readings.own, clock=readings.clock)
    monkeypatch.setattr(input_threads, "thread_ids", lambda: threads.known | {10**9 + readings.at + 1})
    monkeypatch.setattr(input_threads.os, "sched_setscheduler", lambda tid, policy, param: None)
    for _ in looks:
        threads.settle()
    assert readings.at == read - 1
    err = capsys.readouterr().err
    if told is None:
        assert threads.neighbours is None and err == ""
    else:
        assert threads.neighbours == pytest.approx(told)
        assert err.count("--input-priority normal") == 1 and f"used {told:.1f} cores" in err, err


def test_the_machines_readings_are_there_on_linux():
    busy, idle = input_threads.machine_cpu_s()
    assert busy > 0 and idle >= 0 and input_threads.own_cpu_s() > 0
