"""The trace store in core: records an engine's traces per step and per key, with no Lightning involved."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from composer_bridge.core import Algorithm, Engine, Event, Logger, State
from composer_bridge.core.trace_store import TraceStore


class Code(Algorithm):
    def __init__(self, exit_code=None):
        self.exit_code = exit_code

    def match(self, event, state):
        return event == Event.BATCH_END

    def apply(self, event, state, logger):
        return self.exit_code


def test_the_store_keeps_two_instances_of_one_class_apart():
    store = TraceStore()
    logger = Logger([store])
    engine = Engine(State(torch.nn.Linear(1, 1), algorithms=[Code(None), Code(7)]), logger)
    for step in range(3):
        logger.step = step
        engine.run_event(Event.BATCH_END)
    assert store.keys_at(2) == ["Code#2/BATCH_END", "Code/BATCH_END"]  # an after-event: reversed
    first, second = store.stats["Code/BATCH_END"], store.stats["Code#2/BATCH_END"]
    assert (first.count, first.last_exit_code, first.orders) == (3, None, {1})
    assert (second.count, second.last_exit_code, second.orders) == (3, 7, {0})
    assert store.timeline.rows == {"Code#2/BATCH_END": [1, 1, 1], "Code/BATCH_END": [1, 1, 1]}


def test_core_modules_import_no_lightning():
    import composer_bridge.core as core

    for path in Path(core.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")], path.name


def _plain_copy(traces):
    return {key: trace for key, trace in traces.items()}


def test_counting_a_plan_once_per_event_gives_the_same_totals_and_timeline_as_counting_every_key():
    """The store counts a repeated PlanTraces once per event and adds it to its keys when read; the
    totals, latest steps, exit codes and timeline rows must equal those of counting every key every time."""
    import random

    from composer_bridge.core.trace import PlanTraces, Trace

    def plan(*names, event=Event.BATCH_END, code=None):
        traces = PlanTraces((f"{n}/{event.name}", Trace(n, event, None, i, True)) for i, n in enumerate(names))
        if code is not None:  # an exit code: the engine hands a fresh plain dict then
            first = next(iter(traces))
            return {**traces, first: Trace(traces[first].name, event, code, 0, True)}
        return traces

    plans = [plan("A", "B", "C"), plan("A", "C"), plan("B", event=Event.EPOCH_END), plan("A", "B", "C", code=3)]
    lazy, eager = TraceStore(max_steps=40, max_traces_per_step=6), TraceStore(max_steps=40, max_traces_per_step=6)
    lazy.timeline.max_columns = eager.timeline.max_columns = 8  # many halvings over 300 steps
    draw = random.Random(0)
    for step in range(300):
        for _ in range(draw.randint(0, 3)):
            traces = draw.choice(plans)
            lazy.log_traces(traces, step)
            eager.log_traces(_plain_copy(traces), step)
        if step % 37 == 0:  # reading in the middle of the run must not change what comes later
            assert lazy.stats == eager.stats
    assert lazy.stats == eager.stats and set(lazy.stats) == {"A/BATCH_END", "B/BATCH_END", "C/BATCH_END", "B/EPOCH_END"}
    assert lazy.timeline.rows == eager.timeline.rows
    assert lazy.timeline.bin_size == eager.timeline.bin_size > 1
    assert list(lazy) == list(eager) and all(lazy[s] == eager[s] for s in lazy) and lazy.dropped == eager.dropped


def test_steps_that_repeat_the_same_plans_are_counted_as_if_every_key_were_counted():
    """A training loop fires the same events with the same algorithms step after step: the store counts such a
    step once (its plans in one go). Totals, latest steps, exit codes, timeline rows and each step's traces must
    equal those of counting every key of every event, through runs of repeated steps, changes of the step's
    plans (a plan appearing twice in a step, or in another order), reads in the middle and timeline halvings."""
    import random

    from composer_bridge.core.trace import PlanTraces, Trace

    def plan(*names, event=Event.BATCH_END):
        return PlanTraces((f"{n}/{event.name}", Trace(n, event, None, i, True)) for i, n in enumerate(names))

    a, b = plan("A", "B"), plan("A", event=Event.BATCH_START)
    c, d = plan("B", "C", event=Event.AFTER_BACKWARD), plan("C", "A")
    shapes = [[b, c, a], [b, c, a], [b, a], [b, c, a, a], [a, b, c], [d, c], [b, c, a, d]]
    for limit in (None, 7):
        lazy, eager = TraceStore(max_steps=30, max_traces_per_step=limit), TraceStore(max_steps=30, max_traces_per_step=limit)
        lazy.timeline.max_columns = eager.timeline.max_columns = 16  # halvings over the run
        draw = random.Random(1)
        step = 0
        while step < 400:
            shape, repeats = draw.choice(shapes), draw.randint(1, 12)
            for _ in range(repeats):
                for traces in shape:
                    lazy.log_traces(traces, step)
                    eager.log_traces(_plain_copy(traces), step)
                if draw.random() < 0.03:  # a read mid-run: it must not change what comes later
                    assert lazy.stats == eager.stats, step
                step += 1
        assert lazy.stats == eager.stats
        assert lazy.timeline.rows == eager.timeline.rows and lazy.timeline.bin_size == eager.timeline.bin_size > 1
        assert list(lazy) == list(eager) and all(lazy[s] == eager[s] for s in lazy) and lazy.dropped == eager.dropped


def _step_plans():
    from composer_bridge.core.trace import PlanTraces, Trace

    def plan(*names, event=Event.BATCH_END):
        return PlanTraces((f"{n}/{event.name}", Trace(n, event, None, i, True)) for i, n in enumerate(names))

    return plan


def test_an_algorithm_on_an_interval_leaves_every_step_counted_in_one_go(monkeypatch):
    """An algorithm that runs every 4th step (an update interval) makes two kinds of step take turns. Once each
    kind has been seen twice, every step must be counted in one go (no event recorded on its own), and nothing
    may be folded into the keys' rows until they are read; the totals and rows stay exact."""
    from composer_bridge.core import trace_store

    plan = _step_plans()
    keys = [f"K{i:02d}" for i in range(16)]
    start, every = plan(*keys, event=Event.BATCH_START), plan(*keys)
    interval = plan("Interval", event=Event.BATCH_END)
    recorded: list[int] = []
    widths: list[int] = []
    record, fold = trace_store.TraceStore._record, trace_store.Timeline._fold_one

    def counted_record(self, traces, step, kept, column):
        recorded.append(step)
        record(self, traces, step, kept, column)

    def measured_fold(self, members, group_row):
        widths.append(len(group_row))
        fold(self, members, group_row)

    monkeypatch.setattr(trace_store.TraceStore, "_record", counted_record)
    monkeypatch.setattr(trace_store.Timeline, "_fold_one", measured_fold)
    lazy, eager = TraceStore(), TraceStore()
    for step in range(3000):  # past the timeline's 1,024 columns: halvings while the groups are live
        shape = [start, every, interval] if step % 4 == 0 else [start, every]
        for traces in shape:
            lazy.log_traces(traces, step)
            monkeypatch.setattr(trace_store.TraceStore, "_record", record)
            eager.log_traces(_plain_copy(traces), step)
            monkeypatch.setattr(trace_store.TraceStore, "_record", counted_record)
    lazy.log_traces(start, 3000)  # the last step is recorded when the next begins
    assert max(recorded) < 16, sorted(set(recorded))
    assert not widths, widths[:5]
    monkeypatch.setattr(trace_store.TraceStore, "_record", record)
    eager.log_traces(_plain_copy(start), 3000)
    assert lazy.stats == eager.stats and lazy.timeline.rows == eager.timeline.rows


def test_a_timeline_group_made_late_in_a_run_folds_only_its_own_columns(monkeypatch):
    """A group (the keys of one kind of step) made at step 1,000 and retired four steps later must touch 5 columns
    of its keys' rows, not 1,000: with 144 keys that fold cost 2.5 ms a change of the step's plans."""
    from composer_bridge.core.trace_store import Timeline

    widths: list[int] = []
    fold = Timeline._fold_one

    def measured(self, members, group_row):
        widths.append(len(group_row))
        fold(self, members, group_row)

    monkeypatch.setattr(Timeline, "_fold_one", measured)
    timeline = Timeline(max_columns=4096)
    for step in range(1000):
        timeline.add("A", step)
    group = timeline.group(["A", "B"])
    for step in range(1000, 1004):
        timeline.add_group(group, timeline.column(step))
    timeline.retire_group(group)
    assert widths == [5]  # its first column is the one it was made in (a step may still be counted there)
    assert timeline.rows["A"] == [1] * 1004 and timeline.rows["B"] == [0] * 1000 + [1] * 4


def test_a_step_logged_again_after_later_steps_and_timeline_reads_mid_run_count_as_every_key_would():
    """Group rows start where they were made and restart after a read: a later record at an earlier step (a
    logger replaying a step) and reads of the timeline in the middle must still give every key's exact rows."""
    import random

    plan = _step_plans()
    a, b, c = plan("A", "B"), plan("A", event=Event.BATCH_START), plan("C")
    lazy, eager = TraceStore(), TraceStore()
    lazy.timeline.max_columns = eager.timeline.max_columns = 16
    draw = random.Random(2)
    step = 0
    while step < 500:
        for _ in range(draw.randint(1, 9)):
            for traces in ([b, a] if draw.random() < 0.8 else [b, a, c]):
                lazy.log_traces(traces, step)
                eager.log_traces(_plain_copy(traces), step)
            step += 1
        if draw.random() < 0.3:
            back = max(0, step - draw.randint(1, 40))
            lazy.log_traces(a, back)
            eager.log_traces(_plain_copy(a), back)
        if draw.random() < 0.2:
            assert lazy.timeline.rows == eager.timeline.rows, step
    assert lazy.stats == eager.stats and lazy.timeline.rows == eager.timeline.rows
    assert lazy.timeline.bin_size == eager.timeline.bin_size > 1


def test_more_kinds_of_step_than_the_store_keeps_tallies_for_still_count_as_every_key_would():
    """Twelve kinds of step taking turns at random (more than the store keeps a tally for: the oldest kinds are
    folded and forgotten, and made again), with the per-step limit and without: every total, latest step, row and
    step's traces must equal those of counting every key."""
    import itertools
    import random

    plan = _step_plans()
    events = [plan("A", "B"), plan("A", event=Event.BATCH_START), plan("C", event=Event.AFTER_BACKWARD),
              plan("B", "C", event=Event.AFTER_FORWARD)]
    shapes = [list(p) for p in itertools.permutations(events, 2)][:12]
    for limit in (None, 3):
        lazy, eager = TraceStore(max_steps=50, max_traces_per_step=limit), TraceStore(max_steps=50, max_traces_per_step=limit)
        lazy.timeline.max_columns = eager.timeline.max_columns = 32
        draw = random.Random(3)
        for step in range(1500):
            for traces in draw.choice(shapes[:draw.choice((3, 12))]):
                lazy.log_traces(traces, step)
                eager.log_traces(_plain_copy(traces), step)
            if draw.random() < 0.01:
                assert lazy.stats == eager.stats and lazy.timeline.rows == eager.timeline.rows, step
        assert lazy.stats == eager.stats and lazy.timeline.rows == eager.timeline.rows
        assert list(lazy) == list(eager) and all(lazy[s] == eager[s] for s in lazy) and lazy.dropped == eager.dropped
