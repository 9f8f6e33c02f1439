"""Bad flag values, unusable outputs and dead addresses: one `error:` line, exit 2, before Ray
starts and before anything is written. (Each is tried on a real sweep output as well, in
tests/integration/test_damaged_output.py.)"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.conftest import default_sigint

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "sweeps" / "smoke.yaml"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


FLAG_CASES = {
    "--cpus-per-job 0": (["--cpus-per-job", "0"], "error: --cpus-per-job: must be at least 1, got 0"),
    "--max-attempts -1": (["--max-attempts", "-1"], "error: --max-attempts: must be at least 1, got -1"),
    "--max-attempts 1.5": (
        ["--max-attempts", "1.5"],
        "error: --max-attempts: expected a whole number, got '1.5'",
    ),
    "--timeout-cap abc": (["--timeout-cap", "abc"], "error: --timeout-cap: expected a number, got 'abc'"),
    "--timeout-cap nan": (
        ["--timeout-cap", "nan"],
        "error: --timeout-cap: must be a positive number, got 'nan'",
    ),
    "--timeout-cap -5": (
        ["--timeout-cap", "-5"],
        "error: --timeout-cap: must be a positive number, got '-5'",
    ),
    "--address with nothing listening": (
        ["--address", "127.0.0.1:{port}"],
        "error: --address 127.0.0.1:{port}: nothing answers at 127.0.0.1:{port} (Connection refused)",
    ),
    "--address ray:// with nothing listening": (
        ["--address", "ray://127.0.0.1:{port}"],
        "error: --address ray://127.0.0.1:{port}: nothing answers at 127.0.0.1:{port}",
    ),
    "--address a dashboard URL": (
        ["--address", "http://127.0.0.1:8265"],
        "error: --address http://127.0.0.1:8265: give HOST:PORT",
    ),
    "--address without a port": (["--address", "headnode"], "error: --address headnode: expected HOST:PORT"),
    "--unknown-flag": (["--turbo"], "error: unrecognized arguments: --turbo"),
    # an empty --only (an unset shell variable) ran every job of the sweep
    "--only ''": (["--only", ""], "error: --only: an empty pattern ''"),
    "--only ' , '": (["--only", " , "], "error: --only: an empty pattern ' , '"),
    # an unset variable: the run went to a private local Ray, not the cluster
    "--address ''": (["--address", ""], "error: --address: an empty address ''"),
}


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("command", "case"),
    [
        (command, case)
        for command in ("sweep", "tune", "nightly")
        for case in FLAG_CASES
        if command == "sweep" or "--max-attempts" not in case  # a flag of sweep only
    ],
)
def test_bad_flag_values_are_one_line_before_ray(case, command, tmp_path, capsys, no_ray):
    port = closed_port()
    flags, expected = FLAG_CASES[case]
    flags = [f.format(port=port) for f in flags]
    out = tmp_path / "out"
    target = ["--history", str(out)] if command == "nightly" else ["--out", str(out)]
    assert main([command, str(SMOKE), *target, *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(expected.format(port=port)), line
    assert not out.exists()


@pytest.mark.parametrize("command", ["sweep", "tune"])
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", "error: --deadline: must be a positive duration, got '0'"),
        ("5x", "error: --deadline: expected seconds, or a number with s, m or h (30m), got '5x'"),
        ("inf", "error: --deadline: must be a positive duration, got 'inf'"),
    ],
)
def test_a_deadline_that_is_no_duration_is_one_line_before_ray(
    command, value, expected, tmp_path, capsys, no_ray
):
    out = tmp_path / "out"
    assert main([command, str(SMOKE), "--out", str(out), "--deadline", value]) == 2
    assert _one_line(capsys.readouterr().err).startswith(expected)
    assert not out.exists()


def test_deadline_durations_read_seconds_minutes_and_hours():
    from orchestrator.commands.common import duration

    assert [duration(t) for t in ("90", "90s", "1.5m", "2h")] == [90.0, 90.0, 90.0, 7200.0]


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody can write: a read-only tmpfs as root (root ignores file modes), a
    mode-555 directory otherwise."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"running as root without mount permission, so no read-only directory: {done.stderr!r}")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", str(path)], check=False)


def test_a_read_only_output_is_one_line_before_ray(read_only_dir, capsys, no_ray):
    out = read_only_dir / "run"
    assert main(["sweep", str(SMOKE), "--out", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"error: {out}: cannot write there ("), line
    assert "Read-only file system" in line or "Permission denied" in line, line


@pytest.mark.parametrize("command", ["sweep", "tune", "nightly"])
@pytest.mark.parametrize("where", ["a file", "under a file", "/proc", "read-only"])
def test_a_scratch_where_no_directory_can_be_made_is_one_line_before_ray(
    command, where, tmp_path, read_only_dir, capsys, no_ray
):
    """`sweep --scratch README.md` made every job a crash row and exited 0 (FileExistsError in
    each job's Ray task); --out was write-tested before Ray started, --scratch was not."""
    scratch = {
        "a file": str(REPO / "README.md"),
        "under a file": str(REPO / "README.md" / "scratch"),
        "/proc": "/proc/orchestrate-scratch",
        "read-only": str(read_only_dir / "scratch"),
    }[where]
    out = tmp_path / "out"
    target = ["--history", str(out)] if command == "nightly" else ["--out", str(out)]
    assert main([command, str(SMOKE), *target, "--scratch", scratch]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"error: --scratch {scratch}: no directory can be made there ("), line
    assert line.endswith("name a writable directory"), line
    assert not out.exists()


def test_an_out_that_is_a_device_is_named_as_one(capsys, no_ray):
    """`--out /dev/full` was called "a regular file"."""
    assert main(["sweep", str(SMOKE), "--out", "/dev/full"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: /dev/full: it is a device, FIFO or socket, not a directory"), line


def test_an_out_that_is_a_regular_file_is_one_line(tmp_path, capsys, no_ray):
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    assert main(["sweep", str(SMOKE), "--out", str(target)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (
        f"error: {target}: it is a regular file, not a directory; an output is a directory "
        "(created if missing): pick another path"
    )
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("link", ["loop", "dangling"])
@pytest.mark.parametrize("command", ["sweep", "report", "presets"])
def test_an_out_that_is_a_broken_symlink_is_one_line(command, link, tmp_path, capsys, no_ray):
    """A symlink loop as --out: the lock's mkdir raised FileExistsError, a traceback."""
    target = tmp_path / "out"
    target.symlink_to("out" if link == "loop" else tmp_path / "gone")
    argv = ["sweep", str(SMOKE), "--out", str(target)] if command == "sweep" else [command, str(target)]
    assert main(argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == f"error: {target}: a symbolic link to a missing target, or a loop of them; pick another", (
        line
    )


@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_an_out_under_a_symlink_loop_is_one_line(command, tmp_path, capsys, no_ray):
    """The lock's mkdir under the loop raised OSError ELOOP, a traceback."""
    (tmp_path / "loop").symlink_to("loop")
    target = tmp_path / "loop" / "out"
    assert main([command, str(SMOKE), "--out", str(target)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert (
        line
        == f"error: {target}: {tmp_path / 'loop'} is a symbolic link to a missing target, or a loop of them; pick another path"
    )


def test_a_sweep_and_a_tune_do_not_write_into_each_others_output(two_runs, tmp_path, capsys, no_ray):
    """`sweep --out` a tune's folder ran the sweep into it (its results/ beside rung0/, and
    `presets` there then replaced the tune's presets); `tune --out` a sweep output likewise."""
    tune_out = tmp_path / "tuned"
    (tune_out / "rung0").mkdir(parents=True)
    (tune_out / "tune.json").write_text("{}")
    assert main(["sweep", str(SMOKE), "--out", str(tune_out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: {tune_out}: holds a tune's output (rung0, tune.json), which a sweep must not"
    )
    after, _ = two_runs
    assert main(["tune", str(SMOKE), "--out", str(after)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: {after}: holds a sweep's output (results), which a tune must not write into"
    )
    assert sorted(p.name for p in tune_out.iterdir()) == ["rung0", "tune.json"]


def _orchestrate(*args, env=None, close_stdout=False):
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *map(str, args)],
        cwd=REPO,
        stdout=None if close_stdout else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        preexec_fn=(lambda: os.close(1)) if close_stdout else None,
    )


def test_a_closed_standard_output_is_one_line(two_runs):
    """`orchestrate report OUT >&-`: Python gives sys.stdout = None, and the first print raised
    AttributeError, a traceback."""
    after, _ = two_runs
    done = _orchestrate("report", after, close_stdout=True)
    assert done.returncode == 2 and _one_line(done.stderr) == (
        "error: cannot write to standard output: [Errno 9] standard out is closed"
    )


@pytest.mark.parametrize("raises", ["ImportError('shadowed')", "OSError('broken')"])
def test_a_module_that_fails_on_import_from_the_environment_is_one_line(raises, two_runs, tmp_path):
    """A `yaml.py` on PYTHONPATH that shadows PyYAML (or a package that fails on import for an
    environment variable, e.g. TORCHINDUCTOR_CACHE_DIR naming a file): the command is not at fault."""
    (tmp_path / "shadow").mkdir()
    (tmp_path / "shadow" / "yaml.py").write_text(f"raise {raises}\n")
    done = _orchestrate("validate", SMOKE, env={"PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{REPO}"})
    line = _one_line(done.stderr)
    assert done.returncode == 2 and line.startswith(
        f"error: importing a module failed in {tmp_path / 'shadow' / 'yaml.py'}: "
    ), line
    assert raises.split("(")[0] in line and "The Python environment needs fixing" in line


@pytest.mark.parametrize("where", ["the output", "its results folder"])
def test_nightly_history_in_a_sweep_output_is_refused(where, two_runs, capsys, no_ray):
    """`nightly --history OUT/results` wrote tonight's run inside OUT's results table."""
    after, _ = two_runs
    history = after if where == "the output" else after / "results"
    before = sorted(p.relative_to(after) for p in after.rglob("*"))
    assert main(["nightly", str(SMOKE), "--history", str(history)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"error: --history {history}: ") and f"the sweep output {after}" in line, line
    assert sorted(p.relative_to(after) for p in after.rglob("*")) == before


@pytest.mark.parametrize("classes", ["", "\x01", "a/b", " , "])
def test_plan_hardware_names_are_checked_as_the_sweep_file_checks_them(classes, capsys, no_ray):
    """`plan --hardware $'\\x01'` planned jobs on a class named with a control character."""
    assert main(["plan", str(SMOKE), "--hardware", classes]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: --hardware: expected classes such as H100,cpu"), line


@pytest.mark.parametrize("command", ["plan", "sweep", "sweep --address local"])
def test_cpus_per_job_above_every_node_is_one_line_not_a_sweep_of_nothing(command, tmp_path, capsys, no_ray):
    """`--cpus-per-job 1000` on a 2-core machine left no hardware class: "0 jobs planned", exit 0;
    `sweep` found it only once its private Ray had started (10-40 s), and `--address local`, which
    is that private Ray, skipped the checks before it."""
    command, *extra = command.split()
    if command == "sweep":
        extra += ["--out", str(tmp_path / "out")]
    assert main([command, str(SMOKE), "--cpus-per-job", str(100 * (os.cpu_count() or 1)), *extra]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: no node of the cluster can run a job (classes present: none)"), line


def _own_pid_namespace() -> list[str] | None:
    """`unshare` arguments that run a command in a PID namespace of its own (root only), where no
    other process of the machine, a Ray cluster included, can be seen; None where that fails."""
    args = ["unshare", "--pid", "--fork", "--mount-proc"]
    try:
        ok = subprocess.run([*args, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return args if ok else None


def test_address_auto_without_a_local_cluster_is_one_line(tmp_path, monkeypatch):
    """Another test (or a user) may run a Ray on this machine, and `--address auto` would rightly
    find it: the command runs where no other process is visible (its own PID namespace) and Ray's
    temp dir, which names the last cluster started, is empty."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    command = [sys.executable, "-m", "orchestrator", "sweep", str(SMOKE), "--out", str(tmp_path / "out")]
    isolated = _own_pid_namespace()
    if isolated is None:
        from ray._private.services import find_bootstrap_address, find_gcs_addresses

        if find_gcs_addresses() or find_bootstrap_address(None):
            pytest.skip("a Ray cluster runs on this machine, and no PID namespace of its own (unshare, root)")
        isolated = []
    env = {**os.environ, "RAY_TMPDIR": str(tmp_path / "ray-tmp")}
    proc = subprocess.run(
        [*isolated, *command, "--address", "auto"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith("error: --address auto: no Ray cluster runs on this machine (start one with"), line


# --- pages, destinations, addresses and special files: one line, exit 2, no hang --------------------


@pytest.fixture
def two_runs(tmp_path, table_jobs, make_result):
    """Two tiny sweep outputs to compare."""
    from contextlib import closing

    from store.rows import make_row
    from store.sink import ResultSink

    for name in ("before", "after"):
        with closing(ResultSink(tmp_path / name)) as sink:
            for job in table_jobs.values():
                sink.add(make_row(job, make_result("ok", 10.0, 5.0), run_id=name))
    return tmp_path / "after", tmp_path / "before"


@pytest.mark.parametrize(
    ("flag", "target", "expected"),
    [
        ("--md", "{tmp}/no/such/dir/x.md", "the directory {tmp}/no/such/dir does not exist"),
        ("--json", "{tmp}", "is a directory; give a file name"),
        ("--html", "/dev/full", "error: --html /dev/full: cannot write it: No space left on device"),
        ("--md", "{tmp}/fifo", "is a FIFO or a socket; give a regular file name"),  # opening it would wait
        ("--md", "{tmp}/loop", "a symbolic link to a missing target, or a loop"),  # resolve(): RuntimeError
    ],
)
def test_report_pages_that_cannot_be_written_are_one_line(flag, target, expected, two_runs, tmp_path, capsys):
    after, before = two_runs
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop").symlink_to("loop")
    target, expected = target.format(tmp=tmp_path), expected.format(tmp=tmp_path)
    assert main(["report", str(after), "--baseline", str(before), flag, target]) == 2
    assert expected in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    ("dest", "expected"),
    [
        ("{file}", "is a file, not a directory"),
        ("/proc/co-export", "cannot write there"),
        # an export compiled into an output's own folders (a tune's results/ was made and filled)
        ("{out}/results/x", "is the sweep output {out}'s own data (its results/); export into a directory"),
        ("{tune}/results", "is the tune output {tune}'s own data (its results); export into a directory"),
        ("{tune}/rung0/x", "is the tune output {tune}'s own data (its rung0/)"),
        ("{loop}", "cannot write there"),  # resolving the loop to check the above raised RuntimeError
    ],
)
def test_export_destinations_are_checked_before_any_compile(
    dest, expected, two_runs, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # a URI taken as a path would appear here
    file = tmp_path / "a-file"
    file.write_text("x")
    after, _ = two_runs
    tune = tmp_path / "tuned"
    (tune / "rung0").mkdir(parents=True)
    (tune / "tune.json").write_text("{}")
    (tmp_path / "loop").symlink_to("loop")
    dest, expected = (
        x.format(file=file, out=after, tune=tune, loop=tmp_path / "loop") for x in (dest, expected)
    )
    assert main(["export", str(after), "--hardware", "cpu", "--dest", dest]) == 2
    assert expected in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists()


@pytest.mark.parametrize(
    ("command", "address", "expected"),
    [
        ("status", "::::", "error: bad address 'http://::::': expected http://HOST:PORT"),
        ("logs", "http://[::1:5", "error: bad address"),
        ("status", "http://" + "a" * 300 + ":80", "error: bad address"),
        ("logs", "ray://127.0.0.1:1", "error: ray://127.0.0.1:1: ray:// is Ray Client"),
    ],
)
def test_jobs_commands_refuse_bad_addresses_at_once(command, address, expected, capsys, no_ray):
    import time

    t0 = time.monotonic()
    assert main([command, "--address", address, "raysubmit_x"]) == 2
    assert _one_line(capsys.readouterr().err).startswith(expected)
    assert time.monotonic() - t0 < 15


def test_submit_to_a_ray_client_address_is_refused_at_once(capsys, no_ray):
    assert main(["submit", str(SMOKE), "--address", "ray://127.0.0.1:1"]) == 2
    assert "ray:// is Ray Client" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom", "fifo"])
def test_a_device_or_pipe_as_sweep_file_is_refused_without_reading(special, tmp_path, capsys):
    path = special
    if special == "fifo":
        path = str(tmp_path / "fifo.yaml")
        os.mkfifo(path)  # nobody writes it: reading would block for good
    assert main(["validate", path]) == 2
    assert "is not a regular file" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("kind", ["fifo", "deep", "huge"])
def test_a_thresholds_file_that_cannot_be_read_is_one_line(kind, two_runs, tmp_path, capsys):
    after, before = two_runs
    path = tmp_path / "t.json"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it
    else:
        path.write_text("[" * 100_000 + "]" * 100_000 if kind == "huge" else "[" * 5_000 + "]" * 5_000)
    assert main(["report", str(after), "--baseline", str(before), "--thresholds", str(path)]) == 2
    assert "cannot read the thresholds" in _one_line(capsys.readouterr().err)


def test_a_page_name_too_long_for_the_file_system_is_one_line(two_runs, tmp_path, capsys):
    after, before = two_runs
    assert main(["report", str(after), "--baseline", str(before), "--md", str(tmp_path / ("x" * 300))]) == 2
    assert "unusable path" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "command",
    [
        ["validate", "{smoke}"],
        ["plan", "{smoke}"],
        ["report", "{after}"],
        ["report", "{after}", "--baseline", "{before}"],
    ],
)
def test_a_full_disk_under_stdout_is_one_line(command, two_runs, tmp_path):
    """`orchestrate plan SWEEP > /dev/full`: one line naming stdout, exit 2, no traceback (at exit either)."""
    import sys

    after, before = two_runs
    argv = [a.format(smoke=SMOKE, after=after, before=before) for a in command]
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", *argv],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert (
        proc.stderr.splitlines()[-1]
        == "error: cannot write to standard output: [Errno 28] No space left on device"
    )
    assert proc.stderr.count("error:") == 1


@pytest.mark.parametrize(
    ("flag", "target", "expected"),
    [
        ("--md", "", "error: --md: an empty file name"),
        ("--json", "", "error: --json: an empty file name"),
        ("--html", "", "error: --html: an empty file name"),
        ("--html", "-", "error: --html -: pages are written to files, not to standard output"),
        ("--json", "{after}/run.json", "is the sweep output {after}'s own data (its run.json)"),
        ("--md", "{part}", "is the sweep output {after}'s own data (its results/)"),
        ("--html", "{after}/quarantine/x.html", "is the sweep output {after}'s own data (its quarantine/)"),
        ("--html", "{smoke}", "exists and is not an HTML page this tool wrote"),
        ("--md", "{other}.json", "exists and is not a Markdown summary this tool wrote"),
    ],
)
def test_report_pages_never_replace_data(flag, target, expected, two_runs, tmp_path, capsys):
    """A page path inside an output's data, or naming a file that is no page of this kind: refused
    before anything is written (it would be lost); an empty name or `-` is refused too."""
    after, before = two_runs
    (after / "run.json").write_text('{"runs": []}')
    (after / "quarantine").mkdir(exist_ok=True)
    part = next((after / "results").rglob("*.parquet"))
    (tmp_path / "other.json").write_text('{"mine": 1}')
    fmt = {"after": after, "part": part, "smoke": SMOKE, "other": tmp_path / "other"}
    target, expected = target.format(**fmt), expected.format(**fmt)
    kept = {p: p.read_bytes() for p in (after / "run.json", part, SMOKE, tmp_path / "other.json")}
    assert main(["report", str(after), "--baseline", str(before), flag, target]) == 2
    assert expected in _one_line(capsys.readouterr().err)
    assert {p: p.read_bytes() for p in kept} == kept
    assert not Path("-").exists()


def test_report_pages_of_an_earlier_run_are_replaced(two_runs, tmp_path, capsys):
    """A nightly job that writes its pages to the same names (also beside an output's data) each time."""
    after, before = two_runs
    pages = [
        "--md",
        str(after / "summary.md"),
        "--json",
        str(tmp_path / "r.json"),
        "--html",
        str(tmp_path / "r.html"),
    ]
    (tmp_path / "r.html").write_text("")  # empty: nothing to lose
    for _ in range(2):
        assert main(["report", str(after), "--baseline", str(before), *pages]) == 0
    assert (after / "summary.md").read_text().startswith("## Regression report")
    assert '"cells"' in (tmp_path / "r.json").read_text() and "<svg" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("command", ["sweep", "nightly", "tune"])
def test_an_only_typo_is_found_before_ray_starts(command, tmp_path, capsys, no_ray):
    """On this machine (no --address) the plan is checked before its private Ray starts: a typo in
    --only cost Ray's start first (10-40 s on a loaded 2-core machine). `tune` checks its
    candidates' names, which its --only selects from."""
    out = tmp_path / "out"
    target = ["--history", str(out)] if command == "nightly" else ["--out", str(out)]
    assert main([command, str(SMOKE), *target, "--only", "vit-tiny/bs3"]) == 2
    line = _one_line(capsys.readouterr().err)
    whose = "the tune's" if command == "tune" else "the sweep's"
    assert line.startswith(f"error: --only 'vit-tiny/bs3' matches none of {whose}"), line
    assert "e.g. cpu/vit-tiny/bs" in line, line
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        # an unset shell variable: the tune ran without the precisions or knobs it was asked to try
        (["--precisions", ""], "error: --precisions: an empty list of precision policies ''"),
        (["--precisions", " , "], "error: --precisions: an empty list of precision policies ' , '"),
        (["--knobs", ""], "error: --knobs: an empty list of knobs ''"),
        (["--only", "default+freezing"], None),  # a knob's candidate: matches no sweep job, yet runs
    ],
)
def test_tune_list_flags_are_checked_before_ray_starts(
    flags, expected, tmp_path, capsys, no_ray, monkeypatch
):
    from orchestrator.tune import search

    out = tmp_path / "out"

    def started(spec, opts):  # the checks passed: where Ray would start
        raise SystemExit(f"run_tune {opts.sweep.only}")

    monkeypatch.setattr(search, "run_tune", started)
    if expected is None:
        with pytest.raises(SystemExit, match="run_tune default"):
            main(["tune", str(SMOKE), "--out", str(out), *flags])
        return
    assert main(["tune", str(SMOKE), "--out", str(out), *flags]) == 2
    assert _one_line(capsys.readouterr().err).startswith(expected)
    assert not out.exists()


@pytest.mark.parametrize("command", ["plan", "sweep"])
def test_an_only_pattern_that_matches_no_job_is_one_line(command, tmp_path, capsys, monkeypatch, no_ray):
    """A typo in --only is no sweep of 0 jobs: one line naming the pattern and the closest job names."""
    from orchestrator.fleet import driver
    from orchestrator.fleet.inventory import HardwareClass

    cpu = {"cpu": HardwareClass("cpu", "cpu", slots=1)}
    monkeypatch.setattr(driver, "ray_session", lambda address: contextlib.nullcontext())
    monkeypatch.setattr(driver, "cluster_classes", lambda cpus_per_job: cpu)
    extra = ["--hardware", "cpu"] if command == "plan" else ["--out", str(tmp_path / "out")]
    assert main([command, str(SMOKE), "--only", "vit-tiny/bs3", *extra]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: --only 'vit-tiny/bs3' matches none of the sweep's 12 jobs")
    assert "e.g. cpu/vit-tiny/bs" in line
    assert not (tmp_path / "out" / "results").exists()


def test_a_huge_only_pattern_is_not_echoed_in_full(capsys):
    """A 50,000-character --only (a pasted file) is shortened in its error line, with its length."""
    assert main(["plan", str(SMOKE), "--hardware", "cpu", "--only", "x" * 50_000]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "matches none" in line and "(50,000 characters)" in line
    assert len(line) < 1_000


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["sweep", str(SMOKE), "--address", "localhost:1\n"],
            "error: --address 'localhost:1\\n': expected HOST:PORT",
        ),
        (["status", "--address", "localhost:1\n", "raysubmit_x"], "at 'http://localhost:1\\n'"),
        (
            ["sweep", str(SMOKE), "--shared-cache", "--cache-redis", "localhost:1\n"],
            "error: --cache-redis 'localhost:1\\n':",
        ),
    ],
)
def test_an_address_with_a_control_character_stays_on_one_line(argv, expected, tmp_path, capsys, no_ray):
    assert main([*argv, *(["--out", str(tmp_path / "out")] if argv[0] == "sweep" else [])]) == 2
    assert expected in _one_line(capsys.readouterr().err)


def test_resuming_another_sweep_into_an_output_is_one_line_before_ray(two_runs, tmp_path, capsys, no_ray):
    """An output holds one sweep: `--resume` with another sweep file ran that sweep's jobs into it,
    mixing two sweeps under one report. Its rows' `sweep` column says which (run.json too, below)."""
    after, _ = two_runs
    assert main(["sweep", str(SMOKE), "--out", str(after), "--resume"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == (
        f"error: {after} holds sweep 'tables', and {SMOKE} is sweep 'smoke': an output holds one sweep. "
        "Resume 'tables' with its own file, or give 'smoke' another --out; no job of 'smoke' ran"
    )


@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_an_output_whose_run_json_names_another_sweep_is_refused(command, tmp_path, capsys, no_ray):
    """No rows yet (the first run was stopped before any finished): run.json names the sweep."""
    import json

    out = tmp_path / "out"
    runs = out / "rung0" if command == "tune" else out
    runs.mkdir(parents=True)
    run = {"run_id": "r1", "spec_file": "sweeps/vision.yaml", "spec": {"name": "vision"}}
    (runs / "run.json").write_text(json.dumps({"runs": [run]}))
    assert main([command, str(SMOKE), "--out", str(out), "--resume"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(
        f"error: {runs} holds sweep 'vision' (sweeps/vision.yaml), and {SMOKE} is sweep 'smoke'"
    )


def test_ctrl_c_outside_a_sweeps_job_loop_is_one_line(tmp_path):
    """Ctrl-C while a command imports torch, waits for a check or starts Ray printed a Python
    traceback (a sweep's job loop says how to resume; everything else says it was interrupted)."""
    import signal
    import time

    (tmp_path / "co_slow").mkdir()
    (tmp_path / "co_slow" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    (tmp_path / "co_slow" / "sub.py").write_text("def f():\n    pass\n")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(SMOKE.read_text().replace("python:workers.toy:mlp", "python:co_slow.sub:f"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "validate", str(sweep)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and _one_line(err) == "interrupted", err[-2000:]


INTERRUPTED_IN_EXEC = """
import dataclasses, sys, time
from orchestrator import cli

def busy(argv):  # where `import transformers` was when a loaded machine's Ctrl-C came: exec()'d code
    print("ready", flush=True)
    deadline = time.monotonic() + 60  # never a process that spins on after its test is gone
    while time.monotonic() < deadline:
        dataclasses.make_dataclass("A", ["a", "b", "c"], frozen=True)
    return 3

cli._main = busy
cli.run()
"""


def test_ctrl_c_inside_code_that_exec_ran_still_exits_130(tmp_path):
    """CPython ends a process by SIGINT (returncode -2) when a KeyboardInterrupt was raised in code
    exec() ran from a string, caught or not; `orchestrate` exits 130 all the same. Five tries: on the
    old entry point (`sys.exit(main())`) 2 to 4 of 5 ended by SIGINT (3.11.7, here)."""
    import signal

    # run as `python -m` runs it (`-c` exits from inside the interpreter before the check that
    # turns the exit into SIGINT)
    (tmp_path / "co_interrupt.py").write_text(INTERRUPTED_IN_EXEC)
    for _ in range(5):
        proc = subprocess.Popen(
            [sys.executable, "-m", "co_interrupt"],
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_sigint,
        )
        try:
            assert proc.stdout.readline() == "ready\n"
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 130 and _one_line(err) == "interrupted", (proc.returncode, err[-2000:])
