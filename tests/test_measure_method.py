"""The measurement method: warm-up until stable, interleaved rounds, the fp64
accuracy rule, FLOPs, capture statistics, environment, precision, and one real job end to end.

Most timing tests run on a fake clock (`compiler.measure.time` replaced by a clock that each call
advances by a chosen latency), so they are exact and cannot flake; a few use real sleeps."""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from itertools import groupby

import pyarrow as pa
import pytest
import torch

from compiler import capture, env, measure
from compiler.config import CompileConfig
from compiler.job import PHASES, Job, MeasureSpec, ModelSpec
from compiler.measure import (
    check_against_fp64,
    compare_outputs,
    count_flops,
    interleaved_samples,
    warmup_until_stable,
)
from compiler.precision import apply_precision
from compiler.statistics import ratio_interval, split_groups, summarize
from store.rows import make_row
from store.schema import rows_to_table
from tests.columns import MEASUREMENT_COLUMNS, assert_pinned_or_says_why
from workers.runner import run_job

WINDOW = 5  # warmup_until_stable's default window


class FakeClock:
    """Stands in for the `time` module inside compiler.measure: perf_counter() only moves when a
    fake call advances it."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1e3


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(measure, "time", fake)
    return fake


def fake_call(clock: FakeClock, latency_ms):
    """A `call(i)` whose n-th invocation (0-based) takes latency_ms(n) on the fake clock; the
    latencies it took are in `.latencies`."""
    latencies: list[float] = []

    def call(_index: int) -> None:
        ms = latency_ms(len(latencies))
        latencies.append(ms)
        clock.advance_ms(ms)

    call.latencies = latencies
    return call


# --- warmup_until_stable --------------------------------------------------------------------------


@pytest.mark.parametrize("slow_calls", [1, 3, 5, 7])
def test_warmup_stops_once_latency_settles(clock, slow_calls):
    call = fake_call(clock, lambda n: 20.0 if n < slow_calls else 1.0)
    calls = warmup_until_stable(call, "cpu", min_calls=2, max_calls=200)
    assert len(call.latencies) == calls
    assert slow_calls < calls <= slow_calls + 2 * WINDOW  # after the settling, within two windows
    assert calls < 200
    # The stop was decided on two windows whose medians are both the settled latency.
    assert statistics.median(call.latencies[-WINDOW:]) == 1.0
    assert statistics.median(call.latencies[-2 * WINDOW : -WINDOW]) == 1.0


@pytest.mark.parametrize("slow_calls", [8, 9])
def test_warmup_does_not_declare_a_fading_slow_phase_stable(clock, slow_calls):
    call = fake_call(clock, lambda n: 20.0 if n < slow_calls else 1.0)
    calls = warmup_until_stable(call, "cpu", min_calls=2, max_calls=200)
    assert statistics.median(call.latencies[-WINDOW:]) == 1.0, call.latencies
    assert calls >= slow_calls + WINDOW


def test_warmup_leaves_no_unsettled_call_to_the_timed_phase(clock):
    call = fake_call(clock, lambda n: 20.0 if n < 8 else 10.0 if n < 13 else 1.0)
    calls = warmup_until_stable(call, "cpu", min_calls=2, max_calls=200)
    assert calls >= 13, f"stopped after {calls} calls: {call.latencies}"


def test_warmup_with_real_sleeps_stops_after_settling():
    n = [0]

    def call(_i):
        time.sleep(0.02 if n[0] < 3 else 0.001)
        n[0] += 1

    calls = warmup_until_stable(call, "cpu", min_calls=2, max_calls=60, rel_tol=0.5)
    assert calls == n[0]
    assert 3 + WINDOW // 2 < calls <= 3 + 2 * WINDOW + 2, calls


@pytest.mark.parametrize(("min_calls", "expected"), [(0, 10), (3, 10), (10, 10), (25, 25), (57, 57)])
def test_warmup_respects_min_calls(clock, min_calls, expected):
    call = fake_call(clock, lambda n: 1.0)  # stable from the start: two windows are needed
    assert warmup_until_stable(call, "cpu", min_calls=min_calls, max_calls=100) == expected


def test_warmup_min_calls_above_max_calls_stops_at_max_calls(clock):
    call = fake_call(clock, lambda n: 1.0)
    assert warmup_until_stable(call, "cpu", min_calls=50, max_calls=12) == 12


def test_warmup_never_stable_stops_at_max_calls(clock):
    call = fake_call(clock, lambda n: 1.0 if n % 2 == 0 else 5.0)  # window medians flip 1 <-> 5
    assert warmup_until_stable(call, "cpu", min_calls=2, max_calls=40, rel_tol=1e-9) == 40
    assert len(call.latencies) == 40


def test_warmup_never_stable_with_real_sleeps_stops_at_max_calls():
    n = [0]

    def call(_i):
        time.sleep(0.001 if n[0] % 2 == 0 else 0.005)
        n[0] += 1

    assert warmup_until_stable(call, "cpu", min_calls=2, max_calls=30, rel_tol=1e-6) == 30
    assert n[0] == 30


def test_warmup_stops_at_max_s(clock):
    call = fake_call(clock, lambda n: 1.0 if n % 2 == 0 else 5.0)
    calls = warmup_until_stable(call, "cpu", min_calls=2, max_calls=10_000, rel_tol=1e-9, max_s=0.05)
    # 1+5+1+5...: 49 ms after 17 calls, 54 ms after 18; it stops at the first call past 50 ms.
    assert calls == 18
    assert 0.05 < clock.now <= 0.05 + 0.005


def test_warmup_max_s_with_real_sleeps():
    n = [0]

    def call(_i):
        time.sleep(0.001 if n[0] % 2 == 0 else 0.005)
        n[0] += 1

    t0 = time.perf_counter()
    calls = warmup_until_stable(call, "cpu", min_calls=2, max_calls=100_000, rel_tol=1e-9, max_s=0.1)
    took = time.perf_counter() - t0
    assert 0.1 <= took < 0.5, took
    assert 2 < calls < 100, calls


def test_warmup_min_calls_wins_over_max_s(clock):
    call = fake_call(clock, lambda n: 1.0 if n % 2 == 0 else 5.0)
    calls = warmup_until_stable(call, "cpu", min_calls=30, max_calls=10_000, rel_tol=1e-9, max_s=0.01)
    assert calls == 30


def test_warmup_passes_the_call_index(clock):
    seen = []
    warmup_until_stable(seen.append, "cpu", min_calls=12, max_calls=12)
    assert seen == list(range(12))


# --- interleaved_samples --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("iterations", "rounds"),
    [(6, 3), (20, 10), (7, 3), (5, 1), (10, 4), (3, 10), (1, 5), (6, 6), (2, 100)],
)
def test_interleaved_samples_alternate_in_blocks(clock, iterations, rounds):
    order: list[tuple[str, int]] = []

    def side(name: str, ms_per_index: float):
        def call(i: int) -> None:
            order.append((name, i))
            clock.advance_ms(ms_per_index * (i + 1))

        return call

    eager_ms, compiled_ms = interleaved_samples(side("e", 1.0), side("c", 0.5), "cpu", iterations, rounds)

    assert len(eager_ms) == len(compiled_ms) == iterations
    # Samples are in index order and each is the latency of that call.
    assert eager_ms == pytest.approx([1.0 * (i + 1) for i in range(iterations)])
    assert compiled_ms == pytest.approx([0.5 * (i + 1) for i in range(iterations)])

    blocks = [(name, [i for _, i in group]) for name, group in groupby(order, key=lambda c: c[0])]
    expected_rounds = min(rounds, iterations)
    assert [name for name, _ in blocks] == ["e", "c"] * expected_rounds
    for (_, eager_idx), (_, compiled_idx) in zip(blocks[::2], blocks[1::2], strict=True):
        assert eager_idx == compiled_idx  # the same inputs on both sides within a round
    sizes = [len(idx) for _, idx in blocks[::2]]
    assert max(sizes) - min(sizes) <= 1  # rounds are even
    for name in ("e", "c"):
        indices = [i for n, i in order if n == name]
        assert sorted(indices) == list(range(iterations))  # every index exactly once
        per_input = Counter(i % 3 for i in indices)  # the job rotates 3 input sets by index
        assert max(per_input.values()) - min(per_input.values()) <= 1


def test_interleaved_samples_run_the_between_rounds_hook_untimed(clock):
    marks = []
    eager, compiled = interleaved_samples(
        fake_call(clock, lambda n: 1.0),
        fake_call(clock, lambda n: 2.0),
        "cpu",
        6,
        3,
        after_round=lambda: (marks.append(len(marks)), clock.advance_ms(1000.0)),
    )
    assert marks == [0, 1, 2]
    assert eager == [pytest.approx(1.0)] * 6 and compiled == [pytest.approx(2.0)] * 6


def test_interleaved_samples_with_real_calls():
    x = torch.randn(32, 32)
    eager_ms, compiled_ms = interleaved_samples(lambda i: x @ x, lambda i: x + x, "cpu", 7, 3)
    assert len(eager_ms) == len(compiled_ms) == 7
    assert all(isinstance(s, float) and s > 0 for s in eager_ms + compiled_ms)


def test_interleaved_samples_zero_iterations_makes_no_call():
    calls = []
    assert interleaved_samples(calls.append, calls.append, "cpu", 0, 5) == ([], [])
    assert calls == []


# --- summarize, compare_outputs (the pieces the job uses around them) ----------------------------


def test_summarize_of_interleaved_samples():
    s = summarize([3.0, 1.0, 2.0, 100.0, 2.5, 1.5])
    assert s.median_ms == pytest.approx(2.25)
    assert s.p10_ms == pytest.approx(1.25)
    assert s.p10_ms <= s.median_ms <= s.p90_ms < 100.0
    assert s.samples_ms == (3.0, 1.0, 2.0, 100.0, 2.5, 1.5)


def test_compare_outputs_accepts_nan_at_the_same_places():
    ref = torch.tensor([float("nan"), 1.0, 2.0])
    c = compare_outputs([ref], [torch.tensor([float("nan"), 1.0, 2.0 + 2**-20])], "fp32")
    assert c.ok and c.max_abs_err == 2**-20 and c.max_rel_err == 2**-21


# --- check_against_fp64 ---------------------------------------------------------------------------


@pytest.fixture
def outputs():
    g = torch.Generator().manual_seed(0)
    fp64 = [torch.randn(4, 16, generator=g, dtype=torch.float64), 10 * torch.randn(3, generator=g).double()]
    return [t.float() for t in fp64], fp64


def test_fp64_check_passes_when_compiled_equals_eager(outputs):
    eager, fp64 = outputs
    check = check_against_fp64(eager, [t.clone() for t in eager], fp64, "fp32")
    assert check.ok and check.detail == ""
    assert check.rmse_eager == check.rmse_compiled
    assert 0 < check.rmse_eager < 1e-6  # fp32 rounding of the fp64 values


def test_fp64_check_passes_with_tiny_noise(outputs):
    eager, fp64 = outputs
    noisy = [t * (1 + 1e-6) for t in eager]
    check = check_against_fp64(eager, noisy, fp64, "fp32")
    assert check.ok
    assert check.rmse_compiled > check.rmse_eager


def test_fp64_check_rmse_is_the_worst_output(outputs):
    eager, fp64 = outputs
    compiled = [eager[0] + 1e-5, eager[1].clone()]
    check = check_against_fp64(eager, compiled, fp64, "fp32")
    assert check.ok
    expected = torch.sqrt(torch.mean((fp64[0] - compiled[0].double()) ** 2)).item()
    assert check.rmse_compiled == pytest.approx(expected, rel=1e-6)


def test_fp64_check_fails_on_a_large_error_and_names_the_output(outputs):
    eager, fp64 = outputs
    check = check_against_fp64(eager, [eager[0].clone(), eager[1] + 1.0], fp64, "fp32")
    assert not check.ok
    assert "output 1" in check.detail and "(3,)" in check.detail
    assert check.rmse_compiled == pytest.approx(1.0, rel=1e-3)


def test_fp64_check_accepts_compiled_closer_to_fp64_than_eager():
    g = torch.Generator().manual_seed(1)
    x64 = torch.randn(64, 64, generator=g, dtype=torch.float64)
    noise = torch.randn(64, 64, generator=g, dtype=torch.float64)
    eager = (x64 + 0.1 * noise).float()
    assert check_against_fp64([eager], [(x64 + 0.05 * noise).float()], [x64], "fp32").ok
    assert not check_against_fp64([eager], [(x64 + 0.5 * noise).float()], [x64], "fp32").ok


def test_fp64_check_integer_outputs():
    labels = torch.tensor([3, 1, 2])
    ok = check_against_fp64([labels], [labels.clone()], [labels.double()], "fp32")
    assert ok.ok and ok.rmse_eager == 0.0
    bad = check_against_fp64([labels], [torch.tensor([3, 1, 0])], [labels.double()], "fp32")
    assert not bad.ok and "output 0" in bad.detail and "integer" in bad.detail


def test_fp64_check_bf16_outputs():
    g = torch.Generator().manual_seed(2)
    x64 = torch.randn(16, 16, generator=g, dtype=torch.float64)
    eager = x64.to(torch.bfloat16)
    same = check_against_fp64([eager], [eager.clone()], [x64], "bf16")
    assert same.ok
    assert same.rmse_eager > 1e-4  # bf16 rounding is visible against fp64
    assert not check_against_fp64([eager], [(x64 + 0.5).to(torch.bfloat16)], [x64], "bf16").ok


def test_fp64_check_output_count_mismatch(outputs):
    eager, fp64 = outputs
    check = check_against_fp64(eager, eager[:1], fp64, "fp32")
    assert not check.ok and "output counts differ" in check.detail
    assert math.isnan(check.rmse_compiled)


@pytest.mark.parametrize("reshape", [(16, 4), (1, 16), (4, 1)])
def test_fp64_check_shape_mismatch_is_a_failure_not_an_exception(reshape):
    eager = torch.randn(4, 16)
    compiled = eager.reshape(reshape) if reshape == (16, 4) else eager[tuple(slice(0, n) for n in reshape)]
    check = check_against_fp64([eager], [compiled], [eager.double()], "fp32")
    assert not check.ok and "output 0" in check.detail


class WrongShapeWhenCompiled(torch.nn.Module):
    """Returns its output transposed when traced by Dynamo: a compiled output of the wrong shape."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y.t().contiguous() if torch.compiler.is_compiling() else y


def wrong_shape_when_compiled(batch_size, input_size=None, overrides=None):
    """`python:tests.test_measure_method:wrong_shape_when_compiled` for the job below."""
    torch.manual_seed(0)
    return WrongShapeWhenCompiled().eval(), {"x": torch.randn(batch_size, 8)}


def test_job_with_wrong_compiled_shape_is_accuracy_fail():
    job = Job(
        sweep="measure",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:tests.test_measure_method:wrong_shape_when_compiled", name="wrong"),
        batch_size=2,
        dtype="fp32",
        config=CompileConfig(name="c", backend="eager"),
        measure=MeasureSpec(warmup=1, iterations=3, rounds=1, flops=False),
        timeout_s=120,
    )
    result = run_job(job, threads=1)
    assert result["eager_ms"] > 0 and result["compiled_ms"] > 0  # it ran through the timing
    assert result["status"] == "accuracy_fail", result.get("error")
    assert "output 0" in result["error"]


# --- count_flops ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "k", "n"), [(8, 32, 16), (1, 7, 3), (5, 64, 64)])
def test_count_flops_linear_is_2mnk(m, k, n):
    lin = torch.nn.Linear(k, n)
    x = torch.randn(m, k)
    with torch.inference_mode():
        assert count_flops(lambda: lin(x)) == 2 * m * n * k


def test_count_flops_two_layer_mlp():
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(3, 16)
    assert count_flops(lambda: model(x)) == 2 * 3 * (16 * 32 + 32 * 4)


def test_count_flops_conv():
    conv = torch.nn.Conv2d(3, 4, kernel_size=3)
    x = torch.randn(2, 3, 10, 10)
    # 2 * batch * out_channels * out_h * out_w * in_channels * kh * kw
    assert count_flops(lambda: conv(x)) == 2 * 2 * 4 * 8 * 8 * 3 * 3 * 3


def test_count_flops_of_elementwise_only_is_zero():
    x = torch.randn(100)
    assert count_flops(lambda: x.sin().relu()) == 0


@pytest.mark.filterwarnings("ignore:.*nested tensors.*:UserWarning")
def test_count_flops_is_none_when_the_counter_cannot_follow():
    # A nested (strided) tensor through Linear runs fine, but the flop counter asks it for sizes.
    lin = torch.nn.Linear(4, 5)
    nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)])
    assert lin(nt).is_nested  # the call itself works
    assert count_flops(lambda: lin(nt)) is None


# --- compiler.capture -------------------------------------------------------------------------------


@pytest.fixture
def fresh_dynamo():
    capture.reset()
    yield
    capture.reset()


def _with_print_break(x):
    y = x.sin()
    print("graph break here")
    return y.cos()


def test_capture_stats_graph_break_and_recompile(fresh_dynamo, capsys):
    compiled = torch.compile(_with_print_break, backend="eager", dynamic=False)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), x.sin().cos())
    s = capture.capture_stats()
    assert s.graph_breaks >= 1
    assert s.break_reasons and all(r.strip() for r in s.break_reasons)
    assert s.graph_count >= 2
    assert s.recompiles == 0 and s.recompile_reasons == ()
    assert s.guard_count is not None and s.guard_count > 0
    assert s.dynamo_s is not None and s.dynamo_s > 0
    assert s.inductor_s is None  # no Inductor ran
    assert s.cudagraph_skip_reasons == ()

    compiled(torch.randn(5))  # a second shape, static shapes: a recompile
    s2 = capture.capture_stats()
    assert s2.recompiles >= 1
    assert any("size" in r for r in s2.recompile_reasons), s2.recompile_reasons
    assert s2.graph_count > s.graph_count
    d = s2.to_dict()
    assert isinstance(d["recompile_reasons"], list) and d["recompiles"] == s2.recompiles

    capture.reset()
    cleared = capture.capture_stats()
    assert cleared.graph_count == 0 and cleared.graph_breaks == 0 and cleared.break_reasons == ()
    assert cleared.recompiles == 0 and cleared.recompile_reasons == ()
    assert cleared.guard_count is None and cleared.dynamo_s is None
    assert cleared.kernel_count in (0, None)


def test_capture_stats_single_graph_aot_eager(fresh_dynamo):
    compiled = torch.compile(lambda x: (x * 2).relu() + 1, backend="aot_eager")
    compiled(torch.randn(8))
    s = capture.capture_stats()
    assert s.graph_count == 1 and s.graph_breaks == 0 and s.break_reasons == ()
    assert s.recompiles == 0


def test_capture_stats_inductor_kernels_and_compile_time(fresh_dynamo):
    def fn(x):
        return (x.sin() + 1).relu() * 3

    x = torch.randn(64)
    # A warm FX graph / AOTAutograd cache would skip Inductor (no inductor time): compile for real.
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        torch.testing.assert_close(torch.compile(fn)(x), fn(x))
    s = capture.capture_stats()
    assert s.kernel_count is not None and s.kernel_count >= 1
    assert s.inductor_s is not None and s.inductor_s > 0
    # Dynamo's own record: usually it holds the backend's time too, but not always in torch 2.13
    # (0.13 s against Inductor's 14.2 s in one CI run on a loaded 2-core machine), so only its presence
    assert s.dynamo_s is not None and s.dynamo_s > 0
    assert s.graph_count == 1


# --- compiler.env and compiler.precision ----------------------------------------------------------


def test_describe_cpu():
    d = env.describe("cpu")
    assert d["torch_version"] == torch.__version__
    assert d["python_version"].count(".") == 2
    assert isinstance(d["device_name"], str) and d["device_name"]
    for key in (
        "cuda_version",
        "driver_version",
        "sm_clock_mhz",
        "sm_clock_max_mhz",
        "gpu_uuid",
        "gpu_index",
    ):
        assert d.get(key) is None, key


def test_the_numa_nodes_of_a_gpu_and_of_cores_come_from_sysfs(tmp_path):
    """Which host NUMA node a GPU hangs off (its PCI device's `numa_node`, NVML's bus id written
    as sysfs writes it) and which nodes a set of cores sits on; none where the host shows none."""
    dev = tmp_path / "bus/pci/devices/0000:1b:00.0"
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text("1\n")
    assert env.pci_numa_node("00000000:1B:00.0", str(tmp_path)) == 1
    assert env.pci_numa_node("0000:1b:00.0", str(tmp_path)) == 1
    (dev / "numa_node").write_text("-1\n")  # one node, or a VM that hides them
    assert env.pci_numa_node("00000000:1B:00.0", str(tmp_path)) is None
    assert env.pci_numa_node("00000000:3D:00.0", str(tmp_path)) is None  # no such device
    assert env.pci_numa_node(None, str(tmp_path)) is None
    for cpu, node in ((0, 0), (1, 0), (32, 1)):
        (tmp_path / f"devices/system/cpu/cpu{cpu}/node{node}").mkdir(parents=True)
    assert env.cpu_numa_nodes({0, 1}, str(tmp_path)) == "0"
    assert env.cpu_numa_nodes({0, 32}, str(tmp_path)) == "0-1"
    assert env.cpu_numa_nodes({5}, str(tmp_path)) is None


@pytest.fixture
def restore_precision():
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.mark.parametrize(
    ("policy", "dtype", "matmul", "cudnn_tf32"),
    [
        ("tf32", torch.float32, "high", True),
        ("fp32", torch.float32, "highest", True),  # the stock policy: torch's defaults
        ("fp32-strict", torch.float32, "highest", False),
        ("bf16", torch.bfloat16, "highest", True),
        ("fp16", torch.float16, "highest", True),
    ],
)
def test_apply_precision(restore_precision, policy, dtype, matmul, cudnn_tf32):
    # Start from the opposite state so that every setting is really made by apply_precision.
    torch.set_float32_matmul_precision("highest" if matmul == "high" else "high")
    torch.backends.cudnn.allow_tf32 = not cudnn_tf32
    assert apply_precision(policy) is dtype
    assert torch.get_float32_matmul_precision() == matmul
    assert torch.backends.cudnn.allow_tf32 is cudnn_tf32


# --- one real job ---------------------------------------------------------------------------------

# python:workers.toy:mlp at its defaults: 128 -> 256 -> 256 -> 10; batch 2.
MLP_FLOPS = 2 * 2 * (128 * 256 + 256 * 256 + 256 * 10)


@pytest.fixture(scope="module")
def mlp_job() -> Job:
    return Job(
        sweep="measure",
        hardware="cpu",
        device="cpu",
        model=ModelSpec(id="python:workers.toy:mlp", name="mlp"),
        batch_size=2,
        dtype="fp32",
        config=CompileConfig(name="default"),  # Inductor
        # two processes: the first compiles cold and times, the second compiles against its cache
        # and times again (the warm-compile-only process of `warm_compile: true` is the seed-model
        # integration test's)
        measure=MeasureSpec(warmup=2, iterations=6, rounds=3, repeats=2),
        timeout_s=300,
    )


@pytest.fixture(scope="module")
def mlp_result(mlp_job) -> dict:
    return run_job(mlp_job, threads=1)


def test_real_job_measures_everything(mlp_result):
    r = mlp_result
    assert r["status"] == "ok", r.get("error")
    assert len(r["eager_samples_ms"]) == len(r["compiled_samples_ms"]) == 12
    assert all(s > 0 for s in r["eager_samples_ms"] + r["compiled_samples_ms"])
    assert r["eager_ms"] == pytest.approx(statistics.median(r["eager_samples_ms"]))
    assert r["compiled_ms"] == pytest.approx(statistics.median(r["compiled_samples_ms"]))
    assert r["speedup"] == pytest.approx(r["eager_ms"] / r["compiled_ms"])
    assert r["speedup_ci_low"] <= r["speedup"] <= r["speedup_ci_high"]
    assert 0 < r["warm_compile_s"] < r["compile_s"]
    assert r["rmse_eager"] is not None and r["rmse_compiled"] is not None
    assert 0 <= r["rmse_compiled"] < 1e-3
    assert r["flops"] == MLP_FLOPS
    assert r["compiled_tflops"] > 0 and r["eager_tflops"] > 0
    assert r["compiled_tflops"] == pytest.approx(MLP_FLOPS / (r["compiled_ms"] * 1e-3) / 1e12)
    assert r["memory_compression"] > 0
    assert r["memory_compression"] == pytest.approx(r["eager_peak_mem_bytes"] / r["peak_mem_bytes"])
    assert r["kernel_count"] >= 1
    assert r["dynamo_s"] > 0 and r["inductor_s"] > 0
    assert r["eager_warmup_calls"] >= 2 and r["compiled_warmup_calls"] >= 2
    assert r["graph_count"] == 1 and r["graph_breaks"] == 0 and r["recompiles"] == 0
    assert r["task"] == "other"
    assert r["device_name"] and r["torch_version"] == torch.__version__
    assert r["max_rel_err"] < 1e-3


def test_real_job_becomes_a_results_row(mlp_job, mlp_result):
    row = make_row(mlp_job, {**mlp_result, "node_id": "n1", "hostname": "h1"}, run_id="r1", wall_s=1.0)
    table = rows_to_table([row])
    for key in ("eager_samples_ms", "compiled_samples_ms"):
        assert table.schema.field(key).type == pa.list_(pa.float64())
    got = table.to_pylist()[0]
    assert got["status"] == "ok" and got["error"] is None
    assert got["model_id"] == "python:workers.toy:mlp" and got["task"] == "other"
    nulls = [c for c in MEASUREMENT_COLUMNS if got[c] is None]
    assert not nulls, f"null measurement columns: {nulls}"
    for key in MEASUREMENT_COLUMNS:
        if key != "started_at":
            assert got[key] == pytest.approx(mlp_result[key]), key
    assert len(got["eager_samples_ms"]) == len(got["compiled_samples_ms"]) == 12
    assert got["started_at"].isoformat() == mlp_result["started_at"]


def test_real_job_row_has_its_efficiency(mlp_job, mlp_result):
    row = make_row(mlp_job, mlp_result, run_id="r1", wall_s=mlp_result["subprocess_s"] + 1.0)
    measured = row["phase_compile_s"] + row["phase_timing_s"] + row["phase_accuracy_s"]
    assert row["phase_accuracy_s"] > 0  # the fp64 check is work, as the sweep's summary counts it
    assert row["job_efficiency"] == pytest.approx(measured / row["wall_s"])
    assert 0 < row["job_efficiency"] < 1


def test_real_job_phases_account_for_its_processes(mlp_result):
    r = mlp_result
    phases = sum(r[f"phase_{p}_s"] for p in PHASES)
    # the cold process and the warm one, from spawn to exit: all of their time,
    # within the runner's 0.1 s polling per process
    assert r["job_processes"] == 2
    assert phases == pytest.approx(r["subprocess_s"], abs=0.3)
    assert r["phase_compile_s"] == pytest.approx(r["compile_s"] + r["warm_compile_s"], rel=0.2)
    assert_pinned_or_says_why(r, cores=1)


def test_real_job_on_a_node_without_spare_cores_starts_no_process_ahead(mlp_result):
    """Jobs of one core each, as many as this machine has cores: no core is left for the second
    process to start on while the first times (workers.ahead), so it starts after it, and the
    row says why (or that the job was not pinned at all, where other tests hold the cores)."""
    r = mlp_result
    assert r["started_ahead"] == [False, False] and r["gate_wait_s"] == [0.0, 0.0]
    assert r["ahead_hidden_s"] == 0.0 and r["ahead_cpus"] is None
    off = r["ahead_off"] or ""
    assert off.startswith(("no spare core: this node's", "the job's processes are not pinned to cores")), off


def test_real_job_with_repeats_times_in_two_fresh_processes(mlp_result):
    r = mlp_result
    assert r["status"] == "ok", r.get("error")
    assert r["repeats"] == 2 and r["job_processes"] == 2 and r["ci_scope"] == "processes"
    assert r["samples_per_repeat"] == [6, 6]
    assert len(r["eager_samples_ms"]) == len(r["compiled_samples_ms"]) == 12
    groups = split_groups(r["compiled_samples_ms"], r["samples_per_repeat"])
    assert r["compiled_repeat_ms"] == [pytest.approx(statistics.median(g)) for g in groups]
    assert r["compiled_ms"] == pytest.approx(statistics.median(r["compiled_samples_ms"]))
    iv = ratio_interval(split_groups(r["eager_samples_ms"], r["samples_per_repeat"]), groups, paired=True)
    assert (r["speedup_ci_low"], r["speedup_ci_high"]) == (pytest.approx(iv.low), pytest.approx(iv.high))
    # the later processes compiled against the first one's cache: warm, and a cache hit
    cold, *warm = r["repeat_compile_s"]
    assert len(warm) == 1 and all(w < cold for w in warm)
    assert r["compile_s"] == cold and r["warm_compile_s"] == pytest.approx(statistics.median(warm))
    assert r["warm_cache_hits"] >= 1 and r["warm_cache_misses"] == 0
    assert r["rmse_compiled"] is not None and r["flops"] == MLP_FLOPS  # from the first process


def test_real_job_with_repeats_becomes_a_results_row(mlp_job, mlp_result):
    got = rows_to_table([make_row(mlp_job, mlp_result, run_id="r1", wall_s=60.0)]).to_pylist()[0]
    assert got["samples_per_repeat"] == [6, 6] and len(got["repeat_compile_s"]) == 2
    assert got["ci_scope"] == "processes" and got["repeats"] == 2
    nulls = [c for c in MEASUREMENT_COLUMNS if got[c] is None]
    assert not nulls, f"null measurement columns: {nulls}"
