"""The dlinspect command through a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("jax", reason="jax is not installed (pip install jax)")

import dlinspect  # noqa: E402


def cli(*args: str, env: dict[str, str] | None = None, pre: str = "") -> subprocess.CompletedProcess:
    code = pre + "import sys; from dlinspect.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})})


@pytest.mark.slow
def test_doctor_text_lists_every_device_type():
    proc = cli("doctor")
    assert proc.returncode == 0, proc.stderr
    assert re.match(r"dlinspect \S+ works here: to_jax imports into jax \S+ on cpu \(1 device\) "
                    r"through jaxlib directly, viewing host memory aligned to \d+ bytes", proc.stdout)
    for dt in dlinspect.DLDeviceType:
        assert f"  {dt.name} " in proc.stdout
    assert "import path: direct (jaxlib)" in proc.stdout
    assert "torch.Tensor" in proc.stdout or "torch" not in sys.modules


@pytest.mark.slow
def test_doctor_json():
    proc = cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {"verdict", "versions", "jax", "device_types", "producers"}
    assert report["verdict"] == cli("doctor").stdout.splitlines()[0]
    assert [row["value"] for row in report["device_types"]] == [int(d) for d in dlinspect.DLDeviceType]
    assert {row["route"] for row in report["device_types"]} <= {"zero-copy", "copy", "host-fallback", "error"}
    cpu = next(row for row in report["device_types"] if row["name"] == "kDLCPU")
    assert cpu["route"] == "zero-copy"
    assert report["jax"]["direct_import"] is True
    numpy_row = report["producers"]["numpy"]
    assert numpy_row["type"] == "numpy.ndarray" and numpy_row["exchange_api"] is None
    symbols = report["jax"]["private_symbols"]
    assert [s["purpose"] for s in symbols][0] == "DLPack import (the fast path)"
    try:
        import torch
    except ImportError:
        return
    has_api = "__dlpack_c_exchange_api__" in vars(torch.Tensor)
    assert (report["producers"]["torch"]["exchange_api"] is not None) == has_api


@pytest.mark.slow
def test_python_dash_m():
    proc = subprocess.run([sys.executable, "-m", "dlinspect", "doctor", "--json"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["versions"]["dlinspect"]


@pytest.mark.slow
def test_inspect_npy_and_expressions(tmp_path):
    path = tmp_path / "batch.npy"
    np.save(path, np.ones((4, 4), np.float32))
    before = path.read_bytes()
    proc = cli("inspect", str(path))  # .npy data starts 64-byte aligned: zero-copy
    assert proc.returncode == 0 and "route to jax: zero-copy" in proc.stdout, proc.stdout
    assert path.read_bytes() == before
    np.save(path, np.asfortranarray(np.ones((4, 16), np.float32)))   # saved F-order
    proc = cli("inspect", str(path), "--copy", "false")   # (copied into row-major order)
    assert proc.returncode == 2 and "F-contiguous" in proc.stdout
    proc = cli("inspect", "--expr", "np.ones((4, 4))[:, ::2]", "--copy", "false")
    assert proc.returncode == 2 and "CopyRequiredError" in proc.stdout
    proc = cli("inspect", "--expr", "dlinspect.testing.FakeProducer(np.ones(3), (7, 0))",
               "--fallback", "raise")
    assert proc.returncode == 2 and "kDLVulkan" in proc.stdout
    proc = cli("inspect", "--expr", "np.arange(3)", "--target", "host")
    assert proc.returncode == 0 and "route to host: zero-copy" in proc.stdout
    assert cli("inspect").returncode == 1


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (("inspect", "no/such/file.npy"), "np.load cannot read no/such/file.npy (to inspect an "
                                      "expression instead, pass --expr): FileNotFoundError"),
    (("inspect", __file__), "is not a .npy file"),
    (("inspect", "torch.ones(3)"), "an expression instead, pass --expr"),
    (("inspect", "--expr", "1/0"), "ZeroDivisionError"),
    (("inspect", "--expr", "np.ones("), "SyntaxError"),
    (("inspect", "--expr", "[np.ones(3)]"), "expected a tensor"),
    (("inspect", "--expr", "np.array(['ab', 'c'])"), "dtype <U2 (str64)"),
    (("inspect", "--expr", "np.array(['2020-01-01'], 'datetime64[D]')"), "datetime64[D]"),
    (("inspect", "--copy", "maybe", "--expr", "1"), "invalid choice"),
    (("bench", "nosuch"), "unknown suite(s) nosuch"),
    (("bench", "peek", "--repeat", "0"), "--repeat must be at least 1"),
    (("bench", "sweep", "--plot", "/no/such/dir/x.png"), "does not exist"),
    (("bench", "peek", "--plot", "x.png"), "--plot draws the sweep suite"),
    (("bench", "sweep", "--plot", "x.txt"), ".png, .svg or .pdf"),
])
def test_usage_errors_exit_1_with_a_message(args, message):
    proc = cli(*args)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("args", [("inspect", "--expr", "np.ones(3)"), ("bench", "--quick"),
                                  ("bench", "to_jax", "--quick")])
def test_without_jax_one_line_and_the_install_hint(args):
    proc = cli(*args, pre="import sys; sys.modules['jax'] = None; sys.modules['jaxlib'] = None; ")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "pip install 'dlinspect[jax]'" in proc.stderr


@pytest.mark.slow
def test_what_needs_no_jax_runs_without_it():
    proc = cli("doctor", pre="import sys; sys.modules['jax'] = None; ")
    assert proc.returncode == 0 and "pip install 'dlinspect[jax]'" in proc.stdout
    proc = cli("inspect", "--target", "host", "--expr", "np.ones(3)",
               pre="import sys; sys.modules['jax'] = None; ")
    assert proc.returncode == 0 and "route to host: zero-copy" in proc.stdout


@pytest.mark.slow
def test_version():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"dlinspect {dlinspect.__version__}"


@pytest.mark.slow
def test_bench_says_at_once_what_runs_and_for_how_long_then_each_case():
    """Its first line within seconds (stderr, a pipe: no bar), with the estimate, then a
    line per case as it starts; --no-progress prints none of them."""
    code = "import sys; from dlinspect.cli import main; sys.exit(main(sys.argv[1:]))"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", code, "bench", "peek", "to_jax", "--quick"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    with proc, proc.stderr:
        first = proc.stderr.readline()
        first_after = time.monotonic() - started
        rest = proc.stderr.read()
    assert proc.returncode == 0, rest
    assert first_after < 20, first_after   # (an interpreter start and an import)
    assert re.fullmatch(r"dlinspect bench: peek, to_jax \(--quick\): about \d+ s on a 2-core machine\n",
                        first)
    cases = re.findall(r"dlinspect bench: \d+ s of about \d+ s: (\w+): ", rest)
    assert cases[0] == "peek" and cases[-1] == "to_jax" and len(cases) > 10 and "suite/s" not in rest
    quiet = cli("bench", "peek", "--quick", "--no-progress")
    assert quiet.returncode == 0 and "dlinspect bench" not in quiet.stderr


@pytest.mark.slow
def test_doctor_when_jax_cannot_start():
    proc = cli("doctor", env={"JAX_PLATFORMS": "nosuchplatform"})
    assert proc.returncode == 0 and "jax: failed to start" in proc.stdout
    verdict = proc.stdout.splitlines()[0]
    assert verdict.startswith("dlinspect ") and "to_jax cannot: JAX did not start" in verdict


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = cli("bench", "--quick", "--no-progress", "--json", str(out / "b.json"),
               "--plot", str(out / "b.png"), "--markdown", str(out / "B.md"))
    return proc, out


@pytest.mark.slow
def test_bench_quick_json_has_every_suite(quick_bench):
    proc, out = quick_bench
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "b.json").read_text())
    assert set(report["suites"]) == {"peek", "to_jax", "sweep", "loader"}
    assert report["seconds"] > 0   # (how long is the machine's business, not a test's)
    for name, suite in report["suites"].items():
        assert suite["targets"], name
        if name != "loader" or "torch" in report["versions"] and report["versions"]["torch"]:
            assert suite["rows"] and all(r["median"] > 0 for r in suite["rows"]), name
    methods = report["suites"]["sweep"]["methods"]
    assert {"to_jax", "jax.dlpack.from_dlpack", "numpy.from_dlpack"} <= set(methods)


@pytest.mark.slow
def test_bench_ends_with_one_verdict_line(quick_bench):
    proc, out = quick_bench
    report = json.loads((out / "b.json").read_text())
    from dlinspect.bench import verdict
    last = proc.stdout.rstrip().splitlines()[-len([1 for line in proc.stdout.splitlines()
                                                   if line.startswith("wrote ")]) - 1]
    assert last == verdict(report) and last.startswith("targets: ")
    assert verdict(report) in (out / "B.md").read_text()


def test_verdict_and_noisy_judgement():
    """A missed target on figures that spread over NOISY_SPREAD is NOISY, quick or not;
    the verdict line counts each status and says MET, MISSED or NOISY."""
    from dlinspect.bench import NOISY_SPREAD, _mark_noisy, verdict

    def suite(runs_a, runs_b):
        rows = [{"name": "a", "median": sorted(runs_a)[1], "runs": runs_a},
                {"name": "b", "median": sorted(runs_b)[1], "runs": runs_b}]
        return {"rows": rows, "targets": [{"target": "a <= b", "status": "FAIL", "value": 1.2,
                                           "measured": "a", "baseline": "b"}]}
    steady, busy = suite([1.2, 1.2, 1.21], [1.0, 1.0, 1.01]), suite([1.2, 3.0, 1.0], [1.0, 1.0, 1.0])
    for quick in (True, False):
        for result, want in ((steady, "FAIL"), (busy, "NOISY")):
            result["targets"][0]["status"] = "FAIL"
            _mark_noisy(result, quick)
            assert result["targets"][0]["status"] == want
    assert f"{(3.0 - 1.0) / 1.2:.0%}" in busy["targets"][0]["why"] and NOISY_SPREAD < 1.5
    passed = {"targets": [{"status": "PASS"}, {"status": "SKIP"}]}
    assert verdict({"suites": {"x": passed}}).endswith("1 met, 0 missed, 0 noisy (spread too "
                                                       "wide to judge), 1 skipped: MET")
    assert verdict({"suites": {"x": passed, "y": busy}}).endswith(": NOISY")
    assert verdict({"suites": {"x": busy, "y": steady}}).endswith(": MISSED")


def test_loader_names_no_fastest_within_the_spread():
    from dlinspect.bench.loader import _fastest
    assert _fastest({"a": {"median": 10, "runs": [9, 10, 11]},
                     "b": {"median": 5, "runs": [4, 5, 6]}}) == "a"
    assert _fastest({"a": {"median": 10, "runs": [6, 10, 11]},
                     "b": {"median": 9, "runs": [8, 9, 9.5]}}).startswith("none")


@pytest.mark.slow
def test_bench_plot_and_markdown(quick_bench):
    proc, out = quick_bench
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    assert (out / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "B.md").read_text()
    assert md.startswith("# Benchmarks") and "dlinspect bench --quick" in md and "b.png" in md


@pytest.mark.slow
def test_bench_plot_without_matplotlib(tmp_path):
    proc = cli("bench", "sweep", "--quick", "--no-progress", "--plot", str(tmp_path / "x.png"),
               pre="import sys; sys.modules['matplotlib'] = None; ")
    assert proc.returncode == 1 and "pip install matplotlib" in proc.stderr
    assert "sweep (µs per call)" not in proc.stdout  # refused before running anything


@pytest.mark.slow
def test_benchmark_scripts_are_entry_points():
    proc = subprocess.run([sys.executable, "benchmarks/bench_peek.py", "--quick", "--no-progress"],
                          capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(__file__)))
    assert proc.returncode == 0 and "peek(cap)" in proc.stdout


@pytest.mark.slow
def test_bench_stack_times_each_size_and_the_collate(tmp_path):
    """The stack suite pairs dlinspect.stack with np.stack for every size (and, with
    torch, as a DataLoader's collate_fn, and with the conversion into JAX against torch's
    default collate + to_jax and + jnp.asarray), each pair judged against its baseline."""
    proc = cli("bench", "stack", "--quick", "--no-progress", "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    suite = json.loads((tmp_path / "s.json").read_text())["suites"]["stack"]
    from dlinspect.bench.stack import SIZES
    names = {r["name"] for r in suite["rows"]}
    assert {f"stack(e{n})" for n in SIZES} | {f"np.stack(e{n})" for n in SIZES} <= names
    judged = [t for t in suite["targets"] if t["status"] != "SKIP"]
    assert len(judged) == len(SIZES) + ("collate stack" in names) + 2 * ("stack + to_jax" in names)
    if "collate stack" in names:
        assert {"stack + to_jax", "default + to_jax", "default + asarray"} <= names
    assert all(t["value"] > 0 for t in judged)
