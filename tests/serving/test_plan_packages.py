"""Preparing a buckets plan of packages (`compiler.serving.plan_packages.load_buckets`): one eager
reference at the largest bucket, the buckets captured largest first, each checked against the
reference's first rows, and a package that does not reproduce eager named by its bucket. The
stand-in package here runs a real model eagerly; the real packages are loaded by
`tests/serving/test_export_plan.py`."""

from __future__ import annotations

import pytest
import torch

from compiler.serving.plan_packages import (
    STEPS,
    BucketPackages,
    PlanLoadError,
    load_buckets,
)
from workers.toy import mlp as toy_mlp


class EagerPackage:
    """What `load_buckets` needs of a `compiler.serving.packaged.PackagedModel`: `capture`, `pool`, a call."""

    def __init__(self, model, captured: list[int]):
        self.model, self.captured, self.pool = model, captured, None

    def capture(self, args, kwargs, pool=None):
        self.captured.append(kwargs["x"].shape[0])
        return {"first_run_s": 0.0}

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)


def _sizes_seen(model) -> list[int]:
    seen: list[int] = []
    model.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append(kwargs["x"].shape[0]), with_kwargs=True
    )
    return seen


def test_one_eager_reference_at_the_largest_bucket_and_buckets_captured_largest_first():
    model, inputs = toy_mlp(3)
    twin, _ = toy_mlp(3)
    twin.load_state_dict(model.state_dict())
    eager_sizes, captured = _sizes_seen(model), []
    loaded = load_buckets(
        [2, 8, 4], lambda b: EagerPackage(twin, captured), model, ((), inputs), "fp32", True
    )
    assert eager_sizes == [8]  # one reference, not one per bucket
    assert captured == [8, 4, 2]
    assert list(loaded.packages) == [2, 4, 8] and set(loaded.steps) == set(STEPS)
    assert all(v >= 0 for v in loaded.steps.values()) and loaded.memory_gib == {}  # CPU: no pool
    served = BucketPackages(loaded.packages)
    x = torch.randn(4, inputs["x"].shape[1])
    with torch.no_grad():
        assert torch.allclose(served(x=x), model(x=x))


def test_each_bucket_is_timed_apart_from_the_one_reference_every_set_of_them_takes():
    """`bucket_s` is what the export's bucket choice weighs against a prepare budget: a bucket
    whose capture takes long is charged with it, and the one eager reference is no bucket's."""
    import time

    class SlowCapture(EagerPackage):
        def capture(self, args, kwargs, pool=None):
            if kwargs["x"].shape[0] == 8:
                time.sleep(0.3)
            return super().capture(args, kwargs, pool)

    model, inputs = toy_mlp(3)
    loaded = load_buckets([2, 8, 4], lambda b: SlowCapture(model, []), model, ((), inputs), "fp32", True)
    assert list(loaded.bucket_s) == [2, 4, 8] and loaded.bucket_s[8] >= 0.3, loaded.bucket_s
    assert loaded.steps["capture_s"] >= 0.3 and loaded.fixed_s() >= 0.0
    assert sum(loaded.bucket_s.values()) >= sum(loaded.steps.values()) - loaded.steps["reference_s"] - 1e-9


def test_a_packages_first_run_is_timed_apart_from_its_capture():
    """`first_run_s` is each package's first run at its size (`PackagedModel.capture` reports it:
    folding the weights, loading its kernels), `capture_s` the rest of warming up and capturing."""
    import time

    class SlowFirstRun(EagerPackage):
        def capture(self, args, kwargs, pool=None):
            t = time.perf_counter()
            time.sleep(0.2)  # the first run
            first = time.perf_counter() - t
            time.sleep(0.1)  # the capture
            return {"first_run_s": first}

    model, inputs = toy_mlp(3)
    loaded = load_buckets([2, 4], lambda b: SlowFirstRun(model, []), model, ((), inputs), "fp32", True)
    assert loaded.steps["first_run_s"] >= 0.4, loaded.steps
    assert 0.2 <= loaded.steps["capture_s"] < loaded.steps["first_run_s"], loaded.steps


def test_a_real_package_reports_its_first_run(tmp_path):
    """A CPU AOTInductor package, loaded as a plan loads it: its first run is timed and counted."""
    from compiler import aoti
    from compiler.config import CompileConfig
    from compiler.serving.packaged import PackagedModel, no_fallback

    model, inputs = toy_mlp(2)
    info = aoti.build_package(model, inputs, CompileConfig(name="default"), tmp_path / "mlp.pt2")
    model2, _ = toy_mlp(2)
    packaged = PackagedModel.load(
        tmp_path / "mlp.pt2", model2, info["package_inputs"], False, no_fallback("mlp")
    )
    timed = packaged.capture((), inputs)
    assert set(timed) == {"first_run_s"} and timed["first_run_s"] > 0, timed


def test_a_package_that_does_not_reproduce_eager_is_named_by_its_bucket():
    model, inputs = toy_mlp(3)
    other, _ = toy_mlp(3)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    twin, _ = toy_mlp(3)
    twin.load_state_dict(model.state_dict())

    def load(bucket):
        return EagerPackage(other if bucket == 2 else twin, [])

    with pytest.raises(PlanLoadError, match="differ from eager") as caught:
        load_buckets([2, 4, 8], load, model, ((), inputs), "fp32", True)
    assert caught.value.key == 2 and caught.value.state == "failed"


def test_a_package_that_will_not_load_is_a_failure_of_its_bucket():
    model, inputs = toy_mlp(3)

    def load(bucket):
        if bucket == 4:
            raise OSError("cannot open shared object file")
        return EagerPackage(model, [])

    with pytest.raises(PlanLoadError, match="bucket 4: OSError: cannot open") as caught:
        load_buckets([2, 4, 8], load, model, ((), inputs), "fp32", True)
    assert caught.value.state == "failed"


def test_without_proof_that_rows_do_not_interact_each_bucket_has_its_own_reference():
    """A ladder of every size pads nothing, so its padding check proves nothing: a model whose
    rows interact must still pass, each bucket checked against eager at its own size."""
    from workers.toy import batch_centered

    model, inputs = batch_centered(3)
    twin, _ = batch_centered(3)
    twin.load_state_dict(model.state_dict())
    eager_sizes = _sizes_seen(model)
    loaded = load_buckets([1, 2, 3], lambda b: EagerPackage(twin, []), model, ((), inputs), "fp32", False)
    assert eager_sizes == [3, 2, 1] and list(loaded.packages) == [1, 2, 3]
    with pytest.raises(PlanLoadError, match="bucket 2: its outputs differ"):  # sliced, they would not match
        load_buckets([2, 3], lambda b: EagerPackage(twin, []), model, ((), inputs), "fp32", True)


def test_a_range_package_fits_every_batch_size_of_its_range_and_no_other_shape():
    from compiler.aoti import fits, signature

    args = (torch.zeros(4, 32), torch.zeros(7))  # the second has no batch dimension
    sig = signature(args, {}, 4)
    assert sig == [[[None, 32], "float32", "cpu"], [[7], "float32", "cpu"]]
    assert fits(sig, [torch.zeros(1, 32), torch.zeros(7)], (1, 10))
    assert fits(sig, [torch.zeros(10, 32), torch.zeros(7)], (1, 10))
    assert not fits(sig, [torch.zeros(11, 32), torch.zeros(7)], (1, 10))  # above the range
    assert not fits(sig, [torch.zeros(4, 31), torch.zeros(7)], (1, 10))  # another feature size
    assert not fits(sig, [torch.zeros(4, 32), torch.zeros(8)], (1, 10))
    assert not fits(sig, [torch.zeros(4, 32)], (1, 10))
    assert fits(signature(args, {}), list(args), None) and not fits(
        signature(args, {}), [torch.zeros(5, 32), args[1]], None
    )
