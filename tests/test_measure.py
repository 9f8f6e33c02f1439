"""Measurement primitives (percentiles, output comparison, timing, memory) and sweep progress."""

from __future__ import annotations

import io
import math
import time

import psutil
import pytest
import torch

from compiler.measure import (
    TOLERANCE,
    back_to_back_ms,
    compare_outputs,
    peak_memory_bytes,
    time_calls,
)
from compiler.statistics import percentile, summarize
from orchestrator.fleet.progress import Progress, format_duration

# --- percentile and summarize ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0, 1.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 50, 3.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 100, 5.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 10, 1.4),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 90, 4.6),
        ([0.0, 10.0], 25, 2.5),
        ([7.0], 90, 7.0),
    ],
)
def test_percentile(values, q, expected):
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))


def test_summarize_known_list():
    samples = [float(x) for x in [10, 1, 9, 2, 8, 3, 7, 4, 6, 5, 11]]  # 1..11, shuffled
    s = summarize(samples)
    assert s.median_ms == 6.0
    assert s.p10_ms == pytest.approx(2.0)  # position 1.0 of the sorted list
    assert s.p90_ms == pytest.approx(10.0)  # position 9.0
    assert s.samples_ms == tuple(samples)  # raw samples kept in call order


def test_summarize_even_count_and_outlier():
    s = summarize([4.0, 1.0, 3.0, 2.0, 1000.0, 2.5])
    assert s.median_ms == pytest.approx(2.75)
    assert s.p10_ms == pytest.approx(1.5)  # 1 + (2 - 1) * 0.5
    assert s.p90_ms == pytest.approx(502.0)  # 4 + (1000 - 4) * 0.5
    assert s.p10_ms <= s.median_ms <= s.p90_ms


# --- compare_outputs ------------------------------------------------------------------------------


@pytest.fixture
def ref():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 16, generator=g), torch.randn(3, generator=g) * 100]


def test_identical_outputs_are_ok(ref):
    c = compare_outputs(ref, [t.clone() for t in ref], "fp32")
    assert c.ok and c.max_abs_err == 0.0 and c.max_rel_err == 0.0 and c.detail == ""


def test_small_noise_within_fp32_tolerance(ref):
    noisy = [t + 1e-5 * t.abs().max() for t in ref]
    c = compare_outputs(ref, noisy, "fp32")
    assert c.ok
    assert 0 < c.max_rel_err <= TOLERANCE["fp32"]
    assert c.max_abs_err == pytest.approx(1e-5 * ref[1].abs().max().item(), rel=1e-3)


def test_large_error_is_not_ok(ref):
    bad = [ref[0] + 0.5 * ref[0].abs().max(), ref[1].clone()]
    c = compare_outputs(ref, bad, "fp32")
    assert not c.ok
    assert c.max_rel_err == pytest.approx(0.5, rel=1e-3)
    assert "max relative error" in c.detail and "tolerance" in c.detail


def test_tolerance_depends_on_precision(ref):
    off = [t + 0.02 * t.abs().max() for t in ref]
    assert not compare_outputs(ref, off, "fp32").ok
    assert not compare_outputs(ref, off, "fp16").ok
    assert compare_outputs(ref, off, "bf16").ok


def test_bf16_outputs_are_compared_in_float64():
    ref = [torch.linspace(-3, 3, 64).to(torch.bfloat16)]
    assert compare_outputs(ref, [ref[0].clone()], "bf16").ok


def test_chunked_comparison_matches_the_whole_tensors_in_float64(monkeypatch):
    """A large output is compared a chunk at a time: the same errors as over the whole tensors at
    once, wherever in it the largest difference and the largest magnitude fall, and a non-finite
    mismatch in a later chunk is still found."""
    import compiler.measure as measure

    g = torch.Generator().manual_seed(1)
    ref = torch.randn(10, 37, generator=g)
    out = ref + 1e-4 * torch.randn(10, 37, generator=g)
    ref[9, 30], out[9, 30] = 50.0, 50.5  # both maxima in the last, short chunk
    ref[0, 1], out[0, 1] = float("nan"), float("nan")  # non-finite alike: skipped
    whole = (ref.double() - out.double()).nan_to_num().abs().max().item(), 50.0
    monkeypatch.setattr(measure, "COMPARE_CHUNK", 64)  # 370 elements: six chunks
    c = compare_outputs([ref], [out], "bf16")
    assert c.max_abs_err == pytest.approx(whole[0], rel=1e-12)
    assert c.max_rel_err == pytest.approx(whole[0] / whole[1], rel=1e-12)
    late = out.clone()
    late[8, 20] = float("inf")
    bad = compare_outputs([ref], [late], "bf16")
    assert not bad.ok and "inf/nan" in bad.detail


def test_outputs_with_no_finite_element_compare_as_nothing():
    nan = torch.full((3, 2), float("nan"))
    assert compare_outputs([nan, torch.zeros(0)], [nan.clone(), torch.zeros(0)], "fp32").ok


def test_shape_mismatch(ref):
    c = compare_outputs(ref, [ref[0].reshape(16, 4), ref[1]], "fp32")
    assert not c.ok and math.isinf(c.max_abs_err)
    assert "output 0" in c.detail and "(16, 4)" in c.detail and "(4, 16)" in c.detail


def test_count_mismatch(ref):
    c = compare_outputs(ref, ref[:1], "fp32")
    assert not c.ok and math.isinf(c.max_rel_err)
    assert "1 output tensors" in c.detail and "eager gave 2" in c.detail


def test_integer_tensors_compared_exactly():
    labels = torch.tensor([1, 2, 3])
    assert compare_outputs([labels], [labels.clone()], "fp32").ok
    c = compare_outputs([labels], [torch.tensor([1, 2, 4])], "fp32")
    assert not c.ok and "integer outputs differ" in c.detail
    masks = torch.tensor([True, False])
    assert not compare_outputs([masks], [~masks], "fp32").ok


def test_nan_in_compiled_output(ref):
    bad = [ref[0].clone(), ref[1].clone()]
    bad[1][0] = float("nan")
    c = compare_outputs(ref, bad, "fp32")
    assert not c.ok
    assert "output 1" in c.detail and "inf/nan" in c.detail
    bad[1][0] = float("inf")
    assert not compare_outputs(ref, bad, "fp32").ok


def test_nan_in_compiled_output_when_eager_has_a_nan_elsewhere():
    nan = float("nan")
    c = compare_outputs([torch.tensor([nan, 1.0, 2.0])], [torch.tensor([0.5, nan, 2.0])], "fp32")
    assert not c.ok


def test_no_outputs_is_ok():
    assert compare_outputs([], [], "fp32").ok


# --- timing and memory ----------------------------------------------------------------------------


def test_time_calls_on_cpu():
    x = torch.randn(64, 64)
    calls = []

    def fn():
        calls.append(1)
        return x @ x

    samples = time_calls(fn, 7, "cpu")
    assert len(samples) == 7 and len(calls) == 7
    assert all(isinstance(s, float) and s > 0 for s in samples)


def test_time_calls_measures_milliseconds():
    samples = time_calls(lambda: time.sleep(0.02), 3, "cpu")
    assert all(15.0 <= s < 2000.0 for s in samples), samples


def test_back_to_back_passes_indices_and_averages_ms():
    seen = []

    def call(i):
        seen.append(i)
        time.sleep(0.01)

    ms = back_to_back_ms(call, 5, "cpu")
    assert seen == [0, 1, 2, 3, 4]
    assert 8.0 <= ms < 500.0, ms


def test_peak_memory_on_cpu_grows_after_allocating():
    before = peak_memory_bytes("cpu")
    assert before > 0
    rss = psutil.Process().memory_info().rss
    # Peak RSS never goes down: allocate enough to pass the old peak by ~200 MB.
    nbytes = max(0, before - rss) + 200 * 2**20
    block = torch.ones(nbytes // 4, dtype=torch.float32)  # written, so resident
    after = peak_memory_bytes("cpu")
    del block
    assert after >= before + 150 * 2**20, (before, after)


# --- progress -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "--"),
        (0, "0s"),
        (4.4, "4s"),
        (59.6, "1m00s"),
        (61, "1m01s"),
        (3599, "59m59s"),
        (3600, "1h00m00s"),
        (3 * 3600 + 5 * 60 + 7, "3h05m07s"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_eta_none_before_any_job_then_extrapolated(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    p = Progress(total=10, already_done=2, stream=stream, live=False)
    assert p.eta_s() is None
    assert "ETA --" in p.status_line() and "no results yet" in p.status_line()

    p.started_job()
    p.started_job()
    assert p.running == 2
    assert stream.getvalue() == ""  # not live: nothing until a job finishes
    clock[0] += 30.0
    p.finished_job("cpu/mlp/bs1/fp32/default", "ok", 29.5)
    clock[0] += 30.0
    p.finished_job("cpu/mlp/bs4/fp32/ro", "timeout", None)
    # 2 jobs in 60 s, 6 of 10 left (2 were done before this run): 180 s.
    assert p.eta_s() == pytest.approx(180.0)
    assert p.done == 2 and p.running == 0

    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "ok" in lines[0] and "cpu/mlp/bs1/fp32/default" in lines[0] and "in 29.5s" in lines[0]
    assert "[ 3/10]" in lines[0]
    assert "timeout" in lines[1] and "cpu/mlp/bs4/fp32/ro" in lines[1]
    assert "[ 4/10] ok=1 timeout=1" in lines[1] and "ETA 3m00s" in lines[1] and "elapsed 1m00s" in lines[1]
    p.close()
    assert len(stream.getvalue().splitlines()) == 2


def test_live_progress_redraws_one_line():
    stream = io.StringIO()
    p = Progress(total=3, stream=stream, live=True)
    p.started_job()
    p.finished_job("cpu/a/bs1/fp32/default", "ok", 1.0)
    p.close()
    text = stream.getvalue()
    assert "\r\033[K" in text
    assert text.endswith("\n") and text.count("\n") == 1
    assert "[1/3] ok=1" in text


def test_progress_not_live_on_a_non_tty_stream():
    assert Progress(total=1, stream=io.StringIO()).live is False


def test_the_slowdown_hook_applies_to_its_classes_only(monkeypatch):
    from workers.bench import SLOWDOWN_ENV, slowdown_hook

    monkeypatch.delenv(SLOWDOWN_ENV, raising=False)
    assert slowdown_hook("H100") == 1.0
    monkeypatch.setenv(SLOWDOWN_ENV, "H100=1.10, cpu=2")
    assert slowdown_hook("H100") == 1.10 and slowdown_hook("cpu") == 2.0 and slowdown_hook("A100") == 1.0
    monkeypatch.setenv(SLOWDOWN_ENV, "H100=fast")
    with pytest.raises(ValueError, match="'fast' is not a number"):
        slowdown_hook("H100")
