"""A histogram read off a /metrics page and the bucket bound that holds a quantile (a local HTTP
server only)."""

from __future__ import annotations

import math

import pytest

from postroom.devkit.histograms import SENT_MARK_WINDOW as WINDOW
from postroom.devkit.histograms import Buckets, parse_histogram, scrape, scrape_histogram
from postroom.health import serve
from postroom.metrics import LEDGER_MARK_SECONDS, SENT_MARK_WINDOW_SECONDS, WINDOW_BUCKETS_S, Metrics


def window_of(*observations: float) -> Buckets:
    metrics = Metrics()
    for value in observations:
        metrics.observe(SENT_MARK_WINDOW_SECONDS, value)
    return parse_histogram(metrics.render(), WINDOW)


def test_the_quantile_is_bounded_by_the_bucket_that_holds_it() -> None:
    window = window_of(*[0.0012] * 98, 0.04, 0.04)
    assert window.count == 100
    assert window.quantile_bound(0.5) == 0.0015
    assert window.quantile_bound(0.98) == 0.0015  # the 98th of 100 is still 1.2 ms
    assert window.quantile_bound(0.99) == 0.05    # the 99th is 40 ms, in (30 ms, 50 ms]
    assert window.quantile_bound(1.0) == 0.05


def test_a_value_on_a_bound_is_in_that_bucket_and_the_rank_survives_float_error() -> None:
    assert window_of(0.002).quantile_bound(0.5) == 0.002
    # 0.07 * 100 is 7.000000000000001: the 7th observation, not the 8th.
    assert window_of(*[0.001] * 7, *[0.01] * 93).quantile_bound(0.07) == 0.001


def test_no_observations_give_no_figure_and_a_tail_past_the_buckets_gives_inf() -> None:
    assert window_of().quantile_bound(0.5) is None
    assert parse_histogram("", WINDOW).quantile_bound(0.99) is None
    assert window_of(0.001, 60.0).quantile_bound(0.99) == math.inf
    assert max(WINDOW_BUCKETS_S) < 60.0
    with pytest.raises(ValueError, match="q must be"):
        window_of(0.001).quantile_bound(0.0)


def test_labels_pick_the_series_and_processes_and_readings_combine() -> None:
    metrics = Metrics()
    metrics.observe(LEDGER_MARK_SECONDS, 0.003, operation="sent")
    metrics.observe(LEDGER_MARK_SECONDS, 20.0, operation="release")
    sent = parse_histogram(metrics.render(), "postroom_ledger_mark_seconds", operation="sent")
    assert (sent.count, sent.quantile_bound(1.0)) == (1, 0.005)
    both = parse_histogram(metrics.render(), "postroom_ledger_mark_seconds")
    assert (both.count, both.quantile_bound(1.0)) == (2, 30.0)

    early = window_of(0.0004)
    later = window_of(0.0004, 0.02, 0.02)
    assert (later - early).count == 2
    assert (later - early).quantile_bound(0.5) == 0.02  # the early observation is gone
    assert (early + later).count == 4
    assert (Buckets(()) + early, early - Buckets(())) == (early, early)
    with pytest.raises(ValueError, match="different buckets"):
        _ = early + sent


def test_scrape_reads_a_served_page() -> None:
    metrics = Metrics()
    metrics.observe(SENT_MARK_WINDOW_SECONDS, 0.004)
    server = serve(metrics, 0)
    try:
        window = parse_histogram(scrape(server.server_address[1]), WINDOW)
    finally:
        server.shutdown()
        server.server_close()
    assert (window.count, window.quantile_bound(0.5)) == (1, 0.004)


def test_the_histograms_of_several_processes_are_summed() -> None:
    first, second = Metrics(), Metrics()
    first.observe(SENT_MARK_WINDOW_SECONDS, 0.004)
    second.observe(SENT_MARK_WINDOW_SECONDS, 0.02)
    second.observe(SENT_MARK_WINDOW_SECONDS, 0.02)
    servers = [serve(first, 0), serve(second, 0)]
    try:
        window = scrape_histogram([s.server_address[1] for s in servers], WINDOW)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
    assert (window.count, window.quantile_bound(0.3), window.quantile_bound(0.5)) == (3, 0.004,
                                                                                      0.02)
    assert scrape_histogram([], WINDOW) == Buckets(())
