"""The linearizability checker against histories of a real register, and anomalies put into them.

Histories are made by simulation: clients invoke operations on a dict of
registers; each operation takes effect at one moment between its invocation
and its completion (the register answers a read then), or, when it fails,
never; one of unknown outcome is abandoned by its client and takes effect
later or never. Every such history is linearizable by construction. Then
an anomaly is added (a stale read, a lost acknowledged write, a value nobody
wrote), and the checker must find it, on the key it was put in.
"""

from __future__ import annotations

import io
import itertools
import math
import random
import time
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mininet_scenarios.linearizability import (
    Kind,
    Op,
    Outcome,
    Recorder,
    Value,
    check,
    check_key,
    parse_history,
)

pytestmark = pytest.mark.timeout(300)


@dataclass
class _Flight:
    client: str
    key: str
    kind: Kind
    value: Value
    invoke: float
    fate: Outcome
    effected: bool = False
    answers: list[Value] = field(default_factory=list)


def simulate(rng: random.Random, ops: int, keys: int, clients: int, odd: float = 0.0) -> list[Op]:
    """``ops`` operations of ``clients`` clients on ``keys`` registers; a
    fraction ``odd`` of them fails, another ``odd`` has an unknown outcome.
    Writes write unique values, never None. One event per time step."""
    registers: dict[str, Value] = {}
    names = [f"k{i}" for i in range(keys)]
    idle = [f"c{i}" for i in range(clients)]
    flying: list[_Flight] = []
    abandoned: list[_Flight] = []
    history: list[Op] = []
    started = 0
    now = 0.0

    def take_effect(op: _Flight) -> None:
        op.effected = True
        if op.kind == "write":
            registers[op.key] = op.value
        else:
            op.answers.append(registers.get(op.key))

    while started < ops or flying:
        now += 1
        actions = ["invoke"] * bool(idle and started < ops) + ["advance"] * bool(flying) + \
            ["late"] * bool(abandoned)
        action = rng.choice(actions)
        if action == "invoke":
            client = idle.pop(rng.randrange(len(idle)))
            kind: Kind = rng.choice(("read", "write"))
            roll = rng.random()
            fate: Outcome = "fail" if roll < odd else "unknown" if roll < 2 * odd else "ok"
            value: Value = f"{client}-{started}" if kind == "write" else None
            flying.append(_Flight(client, rng.choice(names), kind, value, now, fate))
            started += 1
            continue
        if action == "late":  # an abandoned operation takes effect after all
            take_effect(abandoned.pop(rng.randrange(len(abandoned))))
            continue
        op = rng.choice(flying)
        if not op.effected and (op.fate == "ok" or op.fate == "unknown" and rng.random() < 0.5):
            take_effect(op)
            continue
        flying.remove(op)
        idle.append(op.client)
        if op.fate == "unknown" and not op.effected:
            abandoned.append(op)  # the client gives up; it may still take effect later
        value = op.value if op.kind == "write" else (op.answers[0] if op.answers else None)
        history.append(Op(op.client, op.key, op.kind, value, op.invoke, now, op.fate))
    return history


@st.composite
def histories(draw: st.DrawFn, max_ops: int = 40) -> list[Op]:
    rng = draw(st.randoms(use_true_random=False))
    return simulate(rng, draw(st.integers(1, max_ops)), draw(st.integers(1, 3)), draw(st.integers(1, 5)),
                    draw(st.sampled_from([0.0, 0.1, 0.25])))


@settings(max_examples=300)
@given(histories())
def test_histories_of_a_real_register_are_linearizable(history: list[Op]) -> None:
    result = check(history)
    assert result.ok, result.explain()


def _span(history: list[Op]) -> tuple[float, float]:
    finite = [t for op in history for t in (op.invoke, op.complete) if not math.isinf(t)]
    return min(finite), max(finite)


def _moment(data: st.DataObject, history: list[Op]) -> float:
    """A moment inside the history, between two of its (integer) event times."""
    first, last = _span(history)
    return data.draw(st.integers(int(first), int(last))) + 0.5


def _key(data: st.DataObject, history: list[Op]) -> str:
    return data.draw(st.sampled_from(sorted({op.key for op in history})))


@settings(max_examples=200)
@given(histories(), st.data())
def test_a_stale_read_after_a_completed_write_is_found(history: list[Op], data: st.DataObject) -> None:
    """w(a) completes, then w(b) completes, then a read returns a: whatever
    else runs concurrently (a is written only once)."""
    t, key = _moment(data, history), _key(data, history)
    anomaly = [Op("x1", key, "write", "a", t, t + 0.1), Op("x2", key, "write", "b", t + 0.2, t + 0.3),
               Op("x3", key, "read", "a", t + 0.35, t + 0.4)]
    result = check(history + anomaly)
    assert not result.ok and result.key == key


@settings(max_examples=200)
@given(histories(), st.data())
def test_a_lost_acknowledged_write_is_found(history: list[Op], data: st.DataObject) -> None:
    """An acknowledged write, then a read that finds the key absent (nothing
    in these histories deletes)."""
    t, key = _moment(data, history), _key(data, history)
    anomaly = [Op("x1", key, "write", "a", t, t + 0.1), Op("x2", key, "read", None, t + 0.2, t + 0.3)]
    result = check(history + anomaly)
    assert not result.ok and result.key == key


@settings(max_examples=200)
@given(histories(), st.data())
def test_a_read_of_a_value_never_written_is_found(history: list[Op], data: st.DataObject) -> None:
    reads = [i for i, op in enumerate(history) if op.kind == "read" and op.outcome == "ok"]
    if reads:
        i = data.draw(st.sampled_from(reads))
        key, broken = history[i].key, history[:i] + [replace(history[i], value="ghost")] + history[i + 1:]
    else:
        t, key = _moment(data, history), _key(data, history)
        broken = history + [Op("x1", key, "read", "ghost", t, t + 0.1)]
    result = check(broken)
    assert not result.ok and result.key == key and result.stuck is not None
    assert result.stuck.value == "ghost"


def _brute_force(history: list[Op]) -> bool:
    """Linearizability from the definition: some subset of the operations of
    unknown outcome took effect, and some order of those and the ``ok`` ones
    respects real time and the register. Exponential; for a handful of ops."""
    certain = [op for op in history if op.outcome == "ok"]
    maybe = [op for op in history if op.outcome == "unknown" and op.kind == "write"]
    subsets = itertools.chain.from_iterable(itertools.combinations(maybe, n) for n in range(len(maybe) + 1))
    for chosen in subsets:
        for order in itertools.permutations(certain + list(chosen)):
            if any(later.complete < earlier.invoke
                   for i, earlier in enumerate(order) for later in order[i + 1:]):
                continue
            state: Value = None
            for op in order:
                if op.kind == "write":
                    state = op.value
                elif op.value != state:
                    break
            else:
                return True
    return False


small_ops = st.builds(
    lambda start, length, kind, value, outcome: Op("c", "k", kind, value, start, start + length, outcome),
    st.integers(0, 8), st.integers(0, 4), st.sampled_from(["read", "write"]),
    st.sampled_from([None, 1, 2, 3]), st.sampled_from(["ok", "ok", "ok", "fail", "unknown"]))


@settings(max_examples=1000)
@given(st.lists(small_ops, max_size=6))
def test_agrees_with_the_definition_on_small_histories(history: list[Op]) -> None:
    """Any values (repeated, deletes), any outcomes, linearizable or not."""
    assert check(history).ok == _brute_force(history)


# -- by hand: the cases the rules are about ---------------------------------------------


def test_a_read_concurrent_with_a_write_sees_either_value_but_never_goes_back() -> None:
    base = [Op("a", "k", "write", 1, 0, 1), Op("a", "k", "write", 2, 2, 10)]
    assert check(base + [Op("b", "k", "read", 1, 3, 4)]).ok
    assert check(base + [Op("b", "k", "read", 2, 3, 4)]).ok
    assert check(base + [Op("b", "k", "read", 2, 3, 4), Op("b", "k", "read", 1, 5, 6)]).ok is False
    assert check(base + [Op("b", "k", "read", 2, 3, 4), Op("c", "k", "read", 1, 5, 6)]).ok is False


def test_touching_intervals_overlap() -> None:
    """Equal timestamps count as concurrent: the read may come first."""
    assert check([Op("a", "k", "write", 1, 0, 5), Op("b", "k", "read", None, 5, 6)]).ok
    assert not check([Op("a", "k", "write", 1, 0, 5), Op("b", "k", "read", None, 5.001, 6)]).ok


def test_a_failed_write_never_took_effect() -> None:
    failed = Op("a", "k", "write", 1, 0, 1, "fail")
    assert check([failed, Op("b", "k", "read", None, 2, 3)]).ok
    assert not check([failed, Op("b", "k", "read", 1, 2, 3)]).ok


def test_an_unknown_write_may_take_effect_any_time_later_or_never() -> None:
    lost = Op("a", "k", "write", 1, 0, 1, "unknown")
    assert math.isinf(lost.complete)
    assert check([lost, Op("b", "k", "read", None, 50, 51)]).ok  # not yet, or never
    assert check([lost, Op("b", "k", "read", None, 50, 51), Op("b", "k", "read", 1, 60, 61)]).ok  # late
    assert not check([Op("b", "k", "read", 1, -2, -1), lost]).ok  # never before its invocation
    # once seen, it happened: it cannot be unseen
    assert not check([lost, Op("b", "k", "read", 1, 50, 51), Op("b", "k", "read", None, 60, 61)]).ok


def test_reads_that_failed_or_timed_out_say_nothing() -> None:
    assert check([Op("b", "k", "read", "junk", 0, 1, "fail"), Op("b", "k", "read", None, 2, 3, "unknown")]).ok


def test_keys_are_checked_separately_and_the_first_bad_one_reported() -> None:
    history = [Op("a", "x", "write", 1, 0, 1), Op("a", "y", "read", 7, 2, 3), Op("a", "z", "read", 9, 2, 3)]
    result = check(history)
    assert (result.ok, result.keys, result.key) == (False, 3, "y")
    assert check_key("x", history).ok and not check_key("z", history).ok


def test_the_counterexample_says_what_could_not_happen() -> None:
    history = [Op("a", "k", "write", "v1", 0, 1), Op("b", "k", "write", "v2", 2, 3),
               Op("c", "k", "read", "v3", 3.5, 9), Op("d", "k", "read", "v1", 4, 5)]
    result = check(history)
    assert not result.ok
    assert result.stuck == history[3] and result.prefix == tuple(history[:2]) and result.state == "v2"
    assert result.pending == (history[2],)
    text = result.explain()
    assert "key 'k' is not linearizable" in text and "d read() -> 'v1'" in text and "c read() -> 'v3'" in text


def test_an_operation_must_not_end_before_it_starts() -> None:
    with pytest.raises(ValueError, match="completes before it is invoked"):
        Op("a", "k", "read", None, 2, 1)
    with pytest.raises(ValueError, match="kind must be read or write"):
        Op("a", "k", "cas", None, 0, 1)  # type: ignore[arg-type]


# -- the history file ---------------------------------------------------------------------


def test_recorded_events_read_back_as_the_operations() -> None:
    sink = io.StringIO()
    one, two = Recorder(sink, "c1"), Recorder(sink, "c2")
    w = one.invoke("/k", "write", "v1", 1.0)
    r = two.invoke("/k", "read", None, 1.5)
    one.invoke("/k", "write", "v2", 2.5)  # the client dies: no completion
    one.complete(w, "ok", 2.0)
    two.complete(r, "ok", 3.0, "v1")
    refused = two.invoke("/j", "write", 5, 4.0)
    two.complete(refused, "fail", 4.5)
    ops = parse_history(io.StringIO(sink.getvalue()))
    assert sorted(ops, key=lambda op: op.invoke) == [
        Op("c1", "/k", "write", "v1", 1.0, 2.0), Op("c2", "/k", "read", "v1", 1.5, 3.0),
        Op("c1", "/k", "write", "v2", 2.5, math.inf, "unknown"), Op("c2", "/j", "write", 5, 4.0, 4.5, "fail")]
    assert check(ops).ok


@pytest.mark.parametrize(("lines", "message"), [
    (['{"event":"ok","client":"c","seq":1,"time":1}'], "line 1: c #1 completes but was never invoked"),
    (["not json"], "line 1"),
    (['{"event":"invoke","client":"c","seq":1,"key":"k","kind":"cas","time":0}'], "kind must be"),
    (['{"event":"invoke","client":"c","seq":1,"key":"k","kind":"write","value":[1],"time":0}'],
     "a value must be"),
    (['{"event":"invoke","client":"c","seq":1,"key":"k","kind":"read","time":0}', "",
      '{"event":"ok","client":"c","seq":1,"time":1}', '{"event":"ok","client":"c","seq":1,"time":2}'],
     "line 4: c #1 has a second ok event"),
    (['{"event":"invoke","client":"c","seq":1,"key":"k","kind":"read","time":5}',
      '{"event":"ok","client":"c","seq":1,"time":1}'], "line 1: .*completes before it is invoked"),
    (['{"event":"done","client":"c","seq":1,"time":1}'], "unknown event 'done'"),
])
def test_a_bad_history_is_refused_naming_the_line(lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_history(lines)


# -- size -------------------------------------------------------------------------------


@pytest.mark.parametrize("broken", [False, True])
def test_thousands_of_operations_on_a_few_hot_keys(broken: bool) -> None:
    """Not a speed target (that is for benchmarks): the search must not blow
    up on a nemesis-sized history. Prints how long it took."""
    history = simulate(random.Random(11), ops=4000, keys=5, clients=8, odd=0.05)
    if broken:  # a stale read near the end of the busiest key
        last = max(op.complete for op in history if not math.isinf(op.complete))
        history += [Op("x1", "k0", "write", "a", last + 1, last + 2),
                    Op("x2", "k0", "write", "b", last + 3, last + 4),
                    Op("x3", "k0", "read", "a", last + 5, last + 6)]
    started = time.perf_counter()
    result = check(history)
    elapsed = time.perf_counter() - started
    print(f"\n{len(history)} operations on 5 keys by 8 clients ({'with' if broken else 'without'} "
          f"an anomaly): checked in {elapsed:.2f} s")
    assert result.ok is not broken
