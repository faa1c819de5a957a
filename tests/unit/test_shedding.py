"""The gateway sheds a refused (model, variant, priority) class for a short while."""

from __future__ import annotations

from tiermesh.gateway.shedding import Shedder

MS = 1_000_000
LOW = ("minilm-l6", "fp32", 2)
HIGH = ("minilm-l6", "fp32", 1)


def test_a_refusal_sheds_only_its_class_for_the_retry_after() -> None:
    shed = Shedder(max_shed_ms=100)
    shed.refused(LOW, retry_after_ms=40, now_ns=0)
    assert shed.remaining_ms(LOW, 10 * MS) == 30
    assert shed.remaining_ms(HIGH, 10 * MS) == 0
    assert shed.remaining_ms(LOW, 40 * MS) == 0


def test_shedding_is_capped_and_never_shortened() -> None:
    shed = Shedder(max_shed_ms=100)
    shed.refused(LOW, retry_after_ms=5_000, now_ns=0)
    assert shed.remaining_ms(LOW, 0) == 100
    shed.refused(LOW, retry_after_ms=10, now_ns=MS)
    assert shed.remaining_ms(LOW, 50 * MS) == 50


def test_no_retry_after_means_no_shedding() -> None:
    shed = Shedder()
    shed.refused(LOW, retry_after_ms=None, now_ns=0)
    shed.refused(HIGH, retry_after_ms=0, now_ns=0)
    assert shed.remaining_ms(LOW, 1) == 0 and shed.remaining_ms(HIGH, 1) == 0


def test_a_late_refusal_sheds_only_requests_with_as_little_time() -> None:
    """Found by the hostile-input run: requests with a 1 us `timeout`, refused as late,
    made the gateway refuse every caller's requests of that class (RESOURCE_EXHAUSTED)."""
    shed = Shedder(max_shed_ms=100)
    shed.refused(LOW, retry_after_ms=40, now_ns=0, late=True)  # the queue needs ~40 ms
    assert shed.remaining_ms(LOW, 10 * MS, deadline_ns=10 * MS + 30_000 * MS) == 0
    assert shed.remaining_ms(LOW, 10 * MS, deadline_ns=40 * MS) == 0  # just enough time
    assert shed.remaining_ms(LOW, 10 * MS, deadline_ns=20 * MS) == 30
    assert shed.remaining_ms(LOW, 10 * MS) == 30  # no deadline known: shed as before
    assert shed.remaining_ms(LOW, 41 * MS, deadline_ns=42 * MS) == 0  # over


def test_a_full_queue_sheds_whatever_the_deadline() -> None:
    shed = Shedder(max_shed_ms=100)
    shed.refused(LOW, retry_after_ms=40, now_ns=0)
    shed.refused(LOW, retry_after_ms=10, now_ns=0, late=True)
    assert shed.remaining_ms(LOW, 10 * MS, deadline_ns=10**15) == 30
