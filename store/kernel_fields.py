"""The columns of the job's side tables (`store.schema.KERNEL_CHOICES_SCHEMA` and
`TRITON_KERNELS_SCHEMA`): what max-autotune timed per op, and the Triton kernels the compile
generated, each with its type and description."""

from __future__ import annotations

import pyarrow as pa

KERNEL_CHOICE_FIELDS: list[tuple[str, pa.DataType, str]] = [
    ("job_id", pa.string(), "the job whose cold compile autotuned (join results on job_id, run_id)"),
    ("run_id", pa.string(), "the `orchestrate sweep` invocation that ran the job"),
    ("hardware", pa.string(), "hardware class of the job"),
    (
        "op",
        pa.string(),
        "the autotuned op as Inductor names it (mm, addmm, bmm, convolution, packed_linear, ...)",
    ),
    ("op_index", pa.int32(), "order of the op among the job's autotuned ops"),
    ("input_shapes", pa.list_(pa.string()), "shape of each input, e.g. 32x256"),
    ("input_strides", pa.list_(pa.string()), "stride of each input, e.g. 256x1"),
    ("input_dtypes", pa.list_(pa.string()), "dtype of each input, e.g. float32"),
    ("choice", pa.string(), "the candidate kernel's name"),
    ("kind", pa.string(), "extern (an ATen/library kernel), triton_template or cpp_template"),
    ("config", pa.string(), "the candidate's configuration as JSON (tile shape, warps, stages, ...)"),
    ("time_ms", pa.float64(), "its benchmarked time, ms (null: it failed to compile or run)"),
    ("rank", pa.int32(), "1 for the fastest candidate of the op"),
    ("is_winner", pa.bool_(), "the candidate autotuning picked (exactly one per op)"),
    ("from_cache", pa.bool_(), "the timings came from Inductor's autotune cache, not a fresh benchmark"),
    (
        "emitted",
        pa.bool_(),
        "this candidate's kernel is the one in the generated code (exactly one per op): the winner, or "
        "another where Inductor's epilogue-fusion benchmarking chose it (a template fused with the op's "
        "epilogue beating the fastest kernel plus a separate epilogue kernel); null where unknown",
    ),
    (
        "fusion_benchmarked",
        pa.bool_(),
        "the op was settled by that epilogue-fusion benchmarking (a MultiTemplateBuffer), so `emitted` "
        "could differ from the winner; false: selected at once, the winner emitted",
    ),
    (
        "partial",
        pa.bool_(),
        "the row comes from a compile that did not finish (the job timed out, crashed or failed while "
        "compiling; results.autotuned_ops says how far it got): the op's candidates were all timed, but no "
        "code was generated, so `emitted` and `fusion_benchmarked` are null; false or null: a finished compile",
    ),
]


TRITON_KERNEL_FIELDS: list[tuple[str, pa.DataType, str]] = [
    (
        "job_id",
        pa.string(),
        "the job whose cold compile generated the kernel (join results on job_id, run_id)",
    ),
    ("run_id", pa.string(), "the `orchestrate sweep` invocation that ran the job"),
    ("hardware", pa.string(), "hardware class of the job"),
    ("kernel", pa.string(), "the generated kernel's name, e.g. triton_poi_fused_add_relu_3"),
    ("heuristic", pa.string(), "POINTWISE, REDUCTION, PERSISTENT_REDUCTION, TEMPLATE, ..."),
    ("size_hints", pa.string(), "the iteration sizes it was tuned for, as JSON"),
    ("config", pa.string(), "the block sizes it settled on after its first run, as JSON (null: never ran)"),
    ("num_warps", pa.int32(), "warps of the settled config"),
    ("num_stages", pa.int32(), "pipeline stages of the settled config"),
    ("coordinate_descent", pa.bool_(), "coordinate-descent tuning was on for the kernel"),
    ("found_by_coordesc", pa.bool_(), "the settled config came out of coordinate descent"),
    ("autotune_ms", pa.float64(), "time its first-run tuning took (compiling and timing its configs), ms"),
]
