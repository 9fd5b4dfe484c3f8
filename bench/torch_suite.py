#!/usr/bin/env python3
"""Run torch's own distributed test suite against the ferrocoll backend and gloo.

The suite is ``DistributedTest._DistTestBase`` from the installed torch wheel
(``torch/testing/_internal/distributed/distributed_test.py``), driven the way
torch's ``test/distributed/test_distributed_spawn.py`` drives it (that file is
not in the wheel): one ``TestDistBackend`` subclass whose ``setUp`` spawns
WORLD_SIZE ranks per test, each of which calls
``init_process_group(BACKEND, init_method="file://...")``.

ferrocoll enters as a *plugin* backend: every rank imports ``ferrocoll.torch``
(which registers "ferrocoll"), and before the suite is imported "ferrocoll" is
added to ``DistTestCases.backend_feature`` ("plugin", "ddp", "gpu",
"subgroup": the tables gloo is in that do not mean CUDA).

Many tests are not gated by those tables but by the literal backend name
(``BACKEND != "gloo"``, ``require_backend_is_available({"gloo"})``).
``--gates gloo`` evaluates the suite's decorators as if BACKEND were "gloo" and
then runs the ranks on ferrocoll (test bodies see BACKEND=ferrocoll), so
ferrocoll faces exactly the tests gloo runs. A few test bodies branch on the
name as well (``_test_accumulate_gradients_no_sync``); ``--gates gloo-all``
shows them BACKEND=gloo too and makes the default group a ferrocoll one.

``--c10d`` runs, instead, checks of the Python-backend plugin path on the
subjects of test_c10d_common.py's PythonProcessGroupExtensionTest (that file
is not in the wheel and drives a dummy ProcessGroup).

Needs torch's test dependency ``expecttest`` (``pip install expecttest``).

Each backend runs in its own worker process (the suite reads BACKEND at
import) with TMPDIR and TEMP_DIR in one temporary directory that is removed at
the end.

Examples:
  python bench/torch_suite.py                         # gloo, then ferrocoll; compare
  python bench/torch_suite.py --backend ferrocoll -k 'test_all_reduce*'
  python bench/torch_suite.py --backend ferrocoll --gates gloo --save fc.json
  python bench/torch_suite.py --load gloo.json --load fc.json   # compare saved runs
  python bench/torch_suite.py --list
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

WORKER_ENV = "_FERROCOLL_TORCH_SUITE_CONF"
GATES_ENV = "_FERROCOLL_TORCH_SUITE_GATES"
BUILTIN = ("gloo", "nccl", "ucc", "mpi")

#: The default selection: collectives, groups, DDP, error paths and timeouts.
DEFAULT_PATTERNS = [
    "test_all_reduce*",
    "test_sparse_all_reduce*",
    "test_broadcast*",
    "test_reduce*",
    "test_all_gather*",
    "test_gather*",
    "test_scatter*",
    "test_all_to_all*",
    "test_barrier*",
    "test_send_recv*",
    "test_isend*",
    "test_irecv*",
    "test_batch_isend_irecv*",
    "test_new_subgroups*",
    "test_get_rank*",
    "test_get_backend",
    "test_destroy_*group",
    "test_coalescing_manager*",
    "test_get_future",
    "test_DistributedDataParallel*",
    "test_ddp*",
    "test_accumulate_gradients*",
    "test_monitored_barrier*",
    "test_*_err*",
    "test_*exception*",
    "test_*timeout*",
]

# ---------------------------------------------------------------------------
# The suite, set up at import: in the worker and in every rank it spawns (the
# spawn start method imports this file again as __mp_main__ in each rank).
# ---------------------------------------------------------------------------

if os.environ.get(WORKER_ENV):
    _real = os.environ["BACKEND"]
    _gates = os.environ.get(GATES_ENV, "native")

    if _real == "ferrocoll":
        import ferrocoll.torch  # noqa: F401,E402  (registers the backend)

    try:
        import expecttest  # noqa: F401,E402  (torch.testing._internal needs it)
    except ImportError:
        sys.exit("torch_suite.py: torch's test helpers need expecttest: pip install expecttest")
    from torch.testing._internal import common_distributed as _cd  # noqa: E402

    if _real not in BUILTIN:
        _tables = _cd.DistTestCases.backend_feature
        # "gpu" and "subgroup" also gate CPU tests that gloo runs (gather_object,
        # broadcast_object_list, ddp_ignore_params_arg...); each carries its own
        # GPU-count skip. "cuda" (DDP hooks on CUDA tensors) stays gloo-only.
        for _feature in ("plugin", "ddp", "gpu", "subgroup"):
            _tables.setdefault(_feature, set()).add(_real)

    if _gates in ("gloo", "gloo-all"):
        os.environ["BACKEND"] = "gloo"  # what the decorators see at import
    from torch.testing._internal.distributed import distributed_test as _dt  # noqa: E402
    from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
        DistributedTest,
        TestDistBackend,
    )

    os.environ["BACKEND"] = _real
    _dt.BACKEND = _real  # what init_process_group and the test bodies see
    if _gates == "gloo-all" and _real not in BUILTIN:
        # The test bodies see "gloo" too (some branch on the name); the groups
        # they create with the default backend ("gloo" here) are _real ones.
        import torch.distributed as _dist  # noqa: E402

        _dt.BACKEND = "gloo"
        _init_pg = _dist.init_process_group

        def _init_as_real(*a, **kw):
            if kw.get("backend") == "gloo":
                kw["backend"] = _real
            elif a and len(a) > 0 and a[0] == "gloo":
                a = (_real,) + tuple(a[1:])
            return _init_pg(*a, **kw)

        _dist.init_process_group = _init_as_real

    # Per-test limit for every test (the suite raises some to 400-500 s).
    _limit = int(os.environ.get("DISTRIBUTED_TESTS_DEFAULT_TIMEOUT", "300"))
    for _k in list(_cd.TIMEOUT_OVERRIDE):
        _cd.TIMEOUT_OVERRIDE[_k] = min(_cd.TIMEOUT_OVERRIDE[_k], _limit)

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._spawn_processes()


# ---------------------------------------------------------------------------
# The worker: runs the selected tests of one backend, one JSON line per test.
# ---------------------------------------------------------------------------

_PROC_ERR = re.compile(r"Process (\d+) exited with error code \d+ and exception:\n")


def _exception_line(tb: str) -> str:
    """The first line of the exception a traceback ends with."""
    tb = tb.split("\nTo execute this test", 1)[0]
    lines = [ln for ln in tb.splitlines() if ln.strip()]
    frames = [i for i, ln in enumerate(lines) if ln.startswith("  File ")]
    if frames:
        for ln in lines[frames[-1] + 1 :]:
            if not ln.startswith(" "):
                return ln.strip()
    for ln in reversed(lines):
        if not ln.startswith(" ") and ln != "Traceback (most recent call last):":
            return ln.strip()
    return lines[0].strip() if lines else "?"


def key_line(text: str) -> str:
    """What went wrong: the exception line of each failing rank's traceback
    (deduplicated), else that of the parent's."""
    parts = _PROC_ERR.split(text)
    if len(parts) > 1:
        seen: List[str] = []
        for i in range(1, len(parts), 2):
            line = _exception_line(parts[i + 1])
            if line not in seen:
                seen.append(line)
        return " | ".join(seen)
    return _exception_line(text)


def selected_names(patterns: List[str], exclude: List[str]) -> List[str]:
    names = sorted(n for n in dir(DistributedTest._DistTestBase) if n.startswith("test_"))
    return [
        n
        for n in names
        if any(fnmatch.fnmatchcase(n, p) for p in patterns)
        and not any(fnmatch.fnmatchcase(n, p) for p in exclude)
    ]


def worker_main(conf: Dict[str, Any]) -> int:
    import unittest

    names = selected_names(conf["patterns"], conf.get("exclude", []))
    out_path = conf["out"]
    if conf.get("list"):
        with open(out_path, "w") as f:
            for n in names:
                fn = getattr(TestDistBackendWithSpawn, n)
                skip = (
                    getattr(fn, "__unittest_skip_why__", None)
                    if getattr(fn, "__unittest_skip__", False)
                    else None
                )
                f.write(json.dumps({"name": n, "static_skip": skip}) + "\n")
        return 0

    class Recorder(unittest.TestResult):
        def __init__(self) -> None:
            super().__init__()
            self.t0 = 0.0

        def startTest(self, test):  # noqa: N802
            super().startTest(test)
            self.t0 = time.time()

        def _write(self, test, status, detail=""):
            name = test.id().split(".")[-1]
            rec = {
                "name": name,
                "status": status,
                "time": round(time.time() - self.t0, 2),
                "reason": key_line(detail) if status in ("fail", "error") else detail,
                "detail": detail[-20000:],
            }
            with open(out_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(
                f"[{conf['label']}] {status.upper():5} {name} ({rec['time']} s)"
                + (f": {rec['reason'][:160]}" if status != "pass" else ""),
                flush=True,
            )

        def addSuccess(self, test):  # noqa: N802
            super().addSuccess(test)
            self._write(test, "pass")

        def addFailure(self, test, err):  # noqa: N802
            super().addFailure(test, err)
            self._write(test, "fail", self.failures[-1][1])

        def addError(self, test, err):  # noqa: N802
            super().addError(test, err)
            self._write(test, "error", self.errors[-1][1])

        def addSkip(self, test, reason):  # noqa: N802
            super().addSkip(test, reason)
            self._write(test, "skip", str(reason))

        def addExpectedFailure(self, test, err):  # noqa: N802
            super().addExpectedFailure(test, err)
            self._write(test, "pass", "expected failure")

        def addUnexpectedSuccess(self, test):  # noqa: N802
            super().addUnexpectedSuccess(test)
            self._write(test, "fail", "unexpected success")

    suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names)
    suite.run(Recorder())
    return 0


# ---------------------------------------------------------------------------
# The driver: one worker per backend in a temporary directory, then the report.
# ---------------------------------------------------------------------------

_children: List[subprocess.Popen] = []
#: Labels of the runs a signal cut short (the driver stops after reporting them).
interrupted: List[str] = []


def _on_term(signum, frame):  # turn `timeout`'s SIGTERM into cleanup
    raise KeyboardInterrupt(f"signal {signum}")


def run_backend(backend: str, args, label: str) -> List[Dict[str, Any]]:
    tmp = tempfile.mkdtemp(prefix=f"torch-suite-{backend}-")
    try:
        os.mkdir(os.path.join(tmp, "barrier"))
        out = os.path.join(tmp, "results.jsonl")
        conf = {
            "patterns": args.k or DEFAULT_PATTERNS,
            "exclude": args.exclude or [],
            "out": out,
            "list": args.list,
            "label": label,
        }
        conf_path = os.path.join(tmp, "conf.json")
        with open(conf_path, "w") as f:
            json.dump(conf, f)
        env = dict(os.environ)
        for var in ("CI", "SANDCASTLE", "TW_JOB_USER", "PYTEST_CURRENT_TEST"):
            env.pop(var, None)
        env.update(
            {
                WORKER_ENV: conf_path,
                GATES_ENV: args.gates if backend not in BUILTIN else "native",
                "BACKEND": backend,
                "WORLD_SIZE": str(args.world_size),
                "TEMP_DIR": tmp,
                "INIT_METHOD": "env://"
                if args.init_method == "env"
                else "file://" + os.path.join(tmp, "init_file"),
                "TMPDIR": tmp,
                "TORCHINDUCTOR_CACHE_DIR": os.path.join(tmp, "inductor"),
                "TRITON_CACHE_DIR": os.path.join(tmp, "triton"),
                "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(args.test_timeout),
                "PYTHONUNBUFFERED": "1",
                "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",
            }
        )
        log = open(args.log, "a") if args.log else None
        try:
            proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__)],
                env=env,
                cwd=tmp,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            _children.append(proc)
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    if log:
                        log.write(line)
                    if line.startswith(f"[{label}] "):
                        if not args.quiet:
                            print(line, end="", flush=True)
                    elif args.verbose:
                        print(line, end="", flush=True)
                proc.wait()
            except KeyboardInterrupt:
                print(f"[{label}] interrupted: the results so far follow", file=sys.stderr, flush=True)
                interrupted.append(label)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
                else:
                    try:  # ranks a crashed worker left behind
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        finally:
            if log:
                log.close()
        recs = []
        if os.path.exists(out):
            with open(out) as f:
                recs = [json.loads(ln) for ln in f if ln.strip()]
        if proc.returncode not in (0, None) and not recs:
            print(f"[{label}] worker exited with {proc.returncode}; rerun with -v", file=sys.stderr)
        return recs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def counts(recs: List[Dict[str, Any]]) -> Dict[str, int]:
    c = {"pass": 0, "fail": 0, "skip": 0}
    for r in recs:
        c["fail" if r["status"] in ("fail", "error") else r["status"]] += 1
    c["total"] = len(recs)
    return c


def write_junit(path: str, runs: Dict[str, List[Dict[str, Any]]]) -> None:
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites")
    for label, recs in runs.items():
        c = counts(recs)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"torch_distributed[{label}]",
            tests=str(c["total"]),
            failures=str(c["fail"]),
            skipped=str(c["skip"]),
            errors="0",
            time=str(round(sum(r.get("time", 0) for r in recs), 2)),
        )
        for r in recs:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"DistributedTest.{label}",
                name=r["name"],
                time=str(r.get("time", 0)),
            )
            if r["status"] in ("fail", "error"):
                el = ET.SubElement(case, "failure", message=r["reason"][:500])
                el.text = r.get("detail", "")
            elif r["status"] == "skip":
                ET.SubElement(case, "skipped", message=r["reason"][:500])
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def report(runs: Dict[str, List[Dict[str, Any]]]) -> None:
    labels = list(runs)
    print()
    print(f"{'counts':<8}" + "".join(f"{lab:>24}" for lab in labels))
    for key in ("pass", "fail", "skip", "total"):
        print(f"{key:<8}" + "".join(f"{counts(runs[lab])[key]:>24}" for lab in labels))
    base = next((lab for lab in labels if lab == "gloo"), None)
    if base is None:
        return
    gloo_pass = {r["name"] for r in runs[base] if r["status"] == "pass"}
    for lab in labels:
        if lab == base:
            continue
        worse = [r for r in runs[lab] if r["name"] in gloo_pass and r["status"] != "pass"]
        print(f"\ngloo passes, {lab} does not ({len(worse)}):")
        for r in worse:
            print(f"  {r['status'].upper():5} {r['name']}: {r['reason'][:300]}")
        better = [r["name"] for r in runs[lab] if r["status"] == "pass" and r["name"] not in gloo_pass]
        if better:
            print(f"{lab} passes, gloo does not ({len(better)}): {' '.join(better)}")


# ---------------------------------------------------------------------------
# --c10d: checks on the subjects of test_c10d_common.py's Python-backend tests
# (PythonProcessGroupExtensionTest, not in the wheel; it drives a dummy
# ProcessGroup). Written here for a real backend, with real expected values.
# ---------------------------------------------------------------------------

C10D_ENV = "_FERROCOLL_TORCH_SUITE_C10D"


def c10d_rank_main(rank: int, size: int, init_base: str, out: str) -> None:
    import traceback
    import unittest

    import torch
    import torch.distributed as dist

    import ferrocoll.torch as fct

    def record(name: str, fn) -> None:
        try:
            fn()
            rec = {"name": name, "rank": rank, "status": "pass", "reason": ""}
        except unittest.SkipTest as e:
            rec = {"name": name, "rank": rank, "status": "skip", "reason": str(e)}
        except BaseException as e:  # noqa: BLE001
            rec = {
                "name": name,
                "rank": rank,
                "status": "fail",
                "reason": f"{type(e).__name__}: {e}".splitlines()[0],
                "detail": traceback.format_exc(),
            }
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def eq(a, b) -> None:
        if not torch.equal(a, b):
            raise AssertionError(f"{a.flatten()[:4].tolist()} != {b.flatten()[:4].tolist()}")

    def backend_class_attr():
        # torch 2.15 sets Backend.<NAME> to the lower-case name
        assert dist.Backend.FERROCOLL == "ferrocoll", dist.Backend.FERROCOLL  # type: ignore[attr-defined]
        assert dist.Backend._plugins["FERROCOLL"].creator_fn is fct.backend._create
        assert "ferrocoll" in dist.Backend.backend_list

    def backend_config():
        for text, want in [
            ("ferrocoll", "cpu:ferrocoll"),
            ("FERROCOLL", "cpu:ferrocoll"),
            ("cpu:ferrocoll", "cpu:ferrocoll"),
            ("cpu:ferrocoll,cuda:nccl", "cpu:ferrocoll,cuda:nccl"),
            ("cpu:gloo,cuda:ferrocoll", "cpu:gloo,cuda:ferrocoll"),
        ]:
            got = str(dist.BackendConfig(text))
            assert got == want, f"BackendConfig({text!r}) = {got!r}, want {want!r}"
        for bad in ["cpu:ferrocoll,cuda:nccl,", "cpu:ferrocoll,cpu:gloo"]:
            try:
                dist.BackendConfig(bad)
            except ValueError:
                continue
            raise AssertionError(f"BackendConfig({bad!r}) did not raise ValueError")

    def collectives():
        t = torch.ones(2, 2) * (rank + 7)
        outs = [torch.zeros(2, 2) for _ in range(size)]
        dist.all_gather(outs, t)
        for r, o in enumerate(outs):
            eq(o, torch.ones(2, 2) * (r + 7))
        t = torch.ones(2, 2) * (rank + 1)
        dist.all_reduce(t)
        eq(t, torch.ones(2, 2) * (size * (size + 1) // 2))
        t = torch.ones(2, 2) * rank
        w = dist.broadcast(t, 0, async_op=True)
        assert w is not None and w.wait()
        eq(t, torch.zeros(2, 2))
        out = torch.zeros(2, 2)
        dist.reduce_scatter(out, [torch.ones(2, 2) * (i + rank) for i in range(size)])
        eq(out, torch.ones(2, 2) * (rank * size + size * (size - 1) // 2))
        dist.barrier()

    def send_recv():
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        t = torch.ones(2, 2) * rank
        got = torch.zeros(2, 2)
        if rank % 2 == 0:
            dist.send(t, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(t, nxt)
        eq(got, torch.ones(2, 2) * prv)
        try:
            dist.send(t, rank)
        except ValueError:
            pass
        else:
            raise AssertionError("send to self did not raise ValueError")
        dist.barrier()

    record("backend_class_attr", backend_class_attr)
    record("backend_config", backend_config)
    for spec in ("ferrocoll", "cpu:ferrocoll,cuda:gloo"):
        inited = []

        def init(spec=spec):
            dist.init_process_group(
                spec,
                init_method=f"{init_base}.{spec.replace(':', '_').replace(',', '_')}",
                rank=rank,
                world_size=size,
            )
            inited.append(1)
            pg = dist.distributed_c10d._get_default_group()
            want = "ferrocoll" if "," not in spec else spec
            assert dist.get_backend() == want, f"get_backend() = {dist.get_backend()!r}, want {want!r}"
            be = pg._get_backend(torch.device("cpu"))
            assert be.name() == "ferrocoll", be.name()

        record(f"init_process_group[{spec}]", init)
        if inited:
            record(f"collectives[{spec}]", collectives)
            record(f"send_recv[{spec}]", send_recv)
            record(f"destroy_process_group[{spec}]", dist.destroy_process_group)


def run_c10d(args) -> List[Dict[str, Any]]:
    tmp = tempfile.mkdtemp(prefix="torch-suite-c10d-")
    procs: List[subprocess.Popen] = []
    try:
        out = os.path.join(tmp, "results.jsonl")
        env = dict(os.environ, TMPDIR=tmp, PYTHONUNBUFFERED="1")
        for r in range(args.world_size):
            env[C10D_ENV] = json.dumps([r, args.world_size, "file://" + os.path.join(tmp, "init"), out])
            procs.append(
                subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__)],
                    env=env,
                    cwd=tmp,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        deadline = time.time() + args.test_timeout
        logs = []
        for pr in procs:
            try:
                logs.append(pr.communicate(timeout=max(1, deadline - time.time()))[0])
            except subprocess.TimeoutExpired:
                os.killpg(pr.pid, signal.SIGKILL)
                logs.append(pr.communicate()[0] + "\n(killed: timed out)")
        if args.verbose:
            for r, text in enumerate(logs):
                print(f"--- rank {r}\n{text}")
        by: Dict[str, Dict[str, Any]] = {}
        if os.path.exists(out):
            with open(out) as f:
                for ln in f:
                    rec = json.loads(ln)
                    cur = by.setdefault(
                        rec["name"],
                        {"name": rec["name"], "status": "pass", "reason": "", "time": 0, "ranks": 0},
                    )
                    cur["ranks"] += 1
                    if rec["status"] != "pass" and cur["status"] == "pass":
                        cur.update(
                            status=rec["status"],
                            reason=f"rank {rec['rank']}: {rec['reason']}",
                            detail=rec.get("detail", ""),
                        )
        for cur in by.values():
            if cur["ranks"] != args.world_size and cur["status"] == "pass":
                cur.update(status="fail", reason=f"only {cur['ranks']} of {args.world_size} ranks finished")
        return list(by.values())
    finally:
        for pr in procs:
            if pr.poll() is None:
                os.killpg(pr.pid, signal.SIGKILL)
                pr.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(
        description="Run torch's distributed_test.py suite (DistributedTest._DistTestBase) "
        "on ferrocoll and/or gloo and compare.",
        epilog="Default selection: " + " ".join(DEFAULT_PATTERNS),
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=["gloo", "ferrocoll"],
        help="backend to run (repeatable; default: gloo then ferrocoll)",
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks per test (default 2)")
    p.add_argument(
        "-k",
        action="append",
        metavar="PATTERN",
        help="test-name glob (repeatable; replaces the default selection)",
    )
    p.add_argument(
        "-x", "--exclude", action="append", metavar="PATTERN", help="test-name glob to leave out (repeatable)"
    )
    p.add_argument(
        "--gates",
        choices=["native", "gloo", "gloo-all"],
        default="native",
        help="native: ferrocoll as a plugin backend (the suite's own gating); gloo: "
        "evaluate the suite's decorators as for gloo, run the ranks on ferrocoll; "
        "gloo-all: the test bodies see BACKEND=gloo as well (the default group is "
        "still ferrocoll; tests that check the backend's name then fail)",
    )
    p.add_argument(
        "--init-method",
        choices=["env", "file"],
        default="env",
        help="INIT_METHOD the suite sees at import (torch's CI runs both; "
        "test_barrier_timeout_global needs file)",
    )
    p.add_argument("--list", action="store_true", help="list the selected tests and exit")
    p.add_argument(
        "--c10d",
        action="store_true",
        help="instead of the suite: checks of the Python-backend plugin path on the "
        "subjects of test_c10d_common.py's PythonProcessGroupExtensionTest (ferrocoll)",
    )
    p.add_argument("--junit", metavar="PATH", help="write a JUnit XML report")
    p.add_argument("--save", metavar="PATH", help="write the results as JSON (one run)")
    p.add_argument(
        "--load", action="append", metavar="PATH", help="compare saved runs instead of running (repeatable)"
    )
    p.add_argument(
        "--test-timeout",
        type=int,
        default=180,
        help="seconds per test before its ranks are killed (default 180)",
    )
    p.add_argument("--log", metavar="PATH", help="append the workers' full output here")
    p.add_argument("-v", "--verbose", action="store_true", help="show the ranks' output")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-test lines")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _on_term)

    runs: Dict[str, List[Dict[str, Any]]] = {}
    if args.c10d:
        recs = run_c10d(args)
        for r in recs:
            print(f"[c10d] {r['status'].upper():5} {r['name']}" + (f": {r['reason']}" if r["reason"] else ""))
        runs["ferrocoll c10d checks"] = recs
        if args.junit:
            write_junit(args.junit, runs)
        return 0 if recs and all(r["status"] == "pass" for r in recs) else 1
    if args.load:
        for path in args.load:
            with open(path) as f:
                data = json.load(f)
            # Runs of one label (a selection split over several runs) merge.
            merged = {r["name"]: r for r in runs.get(data["label"], [])}
            merged.update({r["name"]: r for r in data["results"]})
            for r in merged.values():  # the reason, by this version's rule
                if r["status"] in ("fail", "error") and r.get("detail"):
                    r["reason"] = key_line(r["detail"])
            runs[data["label"]] = sorted(merged.values(), key=lambda r: r["name"])
    else:
        for backend in args.backend or ["gloo", "ferrocoll"]:
            label = (
                backend
                if (backend in BUILTIN or args.gates == "native")
                else f"{backend}({args.gates}-gates)"
            )
            t0 = time.time()
            recs = run_backend(backend, args, label)
            if args.list:
                print(f"{label}: {len(recs)} tests selected")
                for r in recs:
                    why = f"  (skipped at import: {r['static_skip']})" if r["static_skip"] else ""
                    print(f"  {r['name']}{why}")
                continue
            print(f"[{label}] {len(recs)} tests in {time.time() - t0:.0f} s")
            runs[label] = recs
            if args.save:
                save = args.save if len(args.backend or [1, 2]) == 1 else f"{args.save}.{backend}"
                with open(save, "w") as f:
                    json.dump(
                        {
                            "label": label,
                            "world_size": args.world_size,
                            "patterns": args.k or DEFAULT_PATTERNS,
                            "exclude": args.exclude or [],
                            "results": recs,
                        },
                        f,
                        indent=1,
                    )
            if interrupted:
                break
    if args.list:
        return 0
    report(runs)
    if args.junit:
        write_junit(args.junit, runs)
    if interrupted:
        return 130
    return 0 if all(counts(r)["fail"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    if os.environ.get(C10D_ENV):
        c10d_rank_main(*json.loads(os.environ[C10D_ENV]))
        sys.exit(0)
    _conf = os.environ.get(WORKER_ENV)
    if _conf:
        with open(_conf) as _f:
            sys.exit(worker_main(json.load(_f)))
    sys.exit(main())
