"""The ``dlinspect`` command (also ``python -m dlinspect``; docs/cli.md): ``doctor`` (what
this installation can do; ``--json``), ``inspect`` (``explain()`` of a ``.npy`` file, read
memory-mapped copy-on-write, or of ``--expr``; exit code 0 for a route that works, 2 for an
error route, 1 for input that cannot be read or is not a tensor, and any usage error) and
``bench`` (the benchmark suites of :mod:`dlinspect.bench` against plain ``from_dlpack``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

import dlinspect

from ._core import PRODUCERS, aligned_empty, exchange_api_version, header_capsule, is_tensor, jax_caps
from ._tables import as_device_type
from ._words import INSTALL_JAX, explain_one, first_line, type_name
from .bench._common import optional, versions

__all__ = ["main", "doctor_report", "producers_report"]

EXIT_USAGE = 1
EXIT_ERROR_ROUTE = 2
_KEYWORDS = ("max_version", "dl_device", "copy")   # of __dlpack__, as doctor reports them
_ANSWERS = {None: "?", True: "yes", False: "no"}   # (a keyword: not known, taken, not taken)


def _fail(message: str) -> int:
    print(f"dlinspect: {message}", file=sys.stderr)
    return EXIT_USAGE


def doctor_report(producers: bool = True) -> dict[str, Any]:
    """Everything ``dlinspect doctor`` prints, as a JSON-able dict (``producers=False``:
    without the producers' probes, which take a few seconds).

    Keys: ``verdict`` (the line the command opens with); ``versions``; ``jax``
    (``platforms``, ``devices``, ``direct_import``, ``direct_reason``,
    ``cpu_alignment``, ``dlpack_platforms``, ``private_symbols``: one row per
    private JAX/jaxlib symbol, with what was found or the fallback used and why);
    ``device_types`` (one row per DLDeviceType: ``name``, ``value``, ``route``,
    ``reason``); ``producers`` (see :func:`producers_report`).
    JAX starts on whatever platforms it finds (a GPU is reported as a GPU);
    ``JAX_PLATFORMS`` is honoured, never set.
    """
    report: dict[str, Any] = {"versions": versions(), "jax": None}
    jax = optional("jax")
    try:
        devices = [] if jax is None else jax.devices()
    except Exception as exc:  # e.g. JAX_PLATFORMS names a backend this jaxlib lacks
        report["jax_error"], jax = first_line(exc), None
    if jax is not None:
        c = jax_caps()
        report["jax"] = {
            "platforms": sorted({d.platform for d in devices}), "devices": list(map(str, devices)),
            "direct_import": c.direct, "direct_reason": c.direct_reason,
            # (c.target, built before the symbols are read: its probes say which are used)
            "cpu_alignment": c.target.cpu_align,
            "dlpack_platforms": {str(as_device_type(k)): v for k, v in sorted(c.mapping.items())},
            "private_symbols": [s._asdict() for s in c.symbols.values()],   # purpose, found, reason
        }
    report["device_types"] = rows = []
    x = aligned_empty((4, 4), np.float32)   # (its header is planned: no value is read)
    for dt in dlinspect.DLDeviceType:
        row = {"name": str(dt), "value": int(dt), "route": "error",
               "reason": report.get("jax_error") or f"jax is not installed ({INSTALL_JAX})"}
        if jax is not None:   # the header of a float32 tensor on that device, as a producer's
            route = dlinspect.plan(dlinspect.peek(header_capsule(
                x, x.ctypes.data, x.shape, (4, 1), 2, 32, 1, dt)))
            row.update(route=route.kind, reason=route.reason)
        rows.append(row)
    if producers:
        report["producers"] = producers_report()
    report["verdict"] = doctor_verdict(report)
    return report


def producers_report(each: Any = None) -> dict[str, Any]:
    """Per DLPack producer importable here: its tensor type, the DLPack C exchange API
    version it offers, and which of ``__dlpack__``'s keywords it takes.

    Each producer is looked at in its own subprocess (some cannot be imported after
    another: paddlepaddle after tensorflow crashes). Values: ``{"type", "exchange_api",
    "max_version", "dl_device", "copy"}`` (True, False or None where the signature is
    not readable), or ``{"error": ...}``; producers not installed are left out.
    ``each(module, row)``, where given, is called as each probe ends.
    """
    import subprocess

    out: dict[str, Any] = {}
    for module, expr in (row.doctor for row in PRODUCERS.values() if row.doctor):
        if _missing(module.split(".")[0]):
            continue
        code = (f"import json, sys; from dlinspect.cli import _probe_producer; "
                f"print(json.dumps(_probe_producer({module!r}, {expr!r})))")
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=120)
            out[module] = (json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0
                           else {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]})
        except (subprocess.TimeoutExpired, ValueError, IndexError) as exc:
            out[module] = {"error": f"{type(exc).__name__}: {exc}"}
        if each:
            each(module, out[module])
    return out


def _probe_producer(module: str, expr: str) -> dict[str, Any]:
    import inspect

    tp = eval(expr, {"m": importlib.import_module(module)})  # noqa: S307 - the producer table's own expression
    version = exchange_api_version(tp)
    row: dict[str, Any] = {"type": type_name(tp),
                           "exchange_api": list(version) if version else None}
    try:
        params = inspect.signature(tp.__dlpack__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        row.update({key: key in params or takes_any for key in _KEYWORDS})
    except (TypeError, ValueError, AttributeError):   # a C method without a signature
        row.update(dict.fromkeys(_KEYWORDS))
    return row


def doctor_verdict(r: dict[str, Any]) -> str:
    """The one line ``dlinspect doctor`` opens with: whether ``to_jax`` works here, by which
    import, and what host memory goes in without a copy (``r``: :func:`doctor_report`'s)."""
    head = f"dlinspect {r['versions']['dlinspect']}"
    j = r["jax"]
    if j is None:
        why = (f"JAX did not start ({r['jax_error']}); check JAX_PLATFORMS and the jax plugins"
               if r.get("jax_error") else f"jax is not installed ({INSTALL_JAX})")
        return f"{head}: peek and to_host work; to_jax cannot: {why}."
    missing = sum(not s["found"] for s in j["private_symbols"])
    devices = f"{len(j['devices'])} device" + ("s" if len(j["devices"]) != 1 else "")
    return (f"{head} works here: to_jax imports into jax {r['versions']['jax']} on "
            f"{', '.join(j['platforms'])} ({devices}) through "
            f"{'jaxlib directly' if j['direct_import'] else 'the public jax.dlpack.from_dlpack'}, "
            f"viewing host memory aligned to {j['cpu_alignment']} bytes without a copy"
            + (f"; {missing} private JAX symbols not found (slower fallbacks, below)." if missing else "."))


def _print_doctor(r: dict[str, Any]) -> None:
    print(f"{doctor_verdict(r)}\n")
    print("versions: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in r["versions"].items()))
    j = r["jax"]
    if r.get("jax_error"):   # (then no jax entry)
        print(f"jax: failed to start ({r['jax_error']}); check JAX_PLATFORMS and the jax plugins")
    elif j is None:
        print(f"jax: not installed; to_jax is unavailable ({INSTALL_JAX})")
    else:
        print(f"jax platforms: {', '.join(j['platforms'])}; devices: {', '.join(j['devices'])}")
        print(f"import path: {'direct (jaxlib)' if j['direct_import'] else 'public jax.dlpack.from_dlpack'}"
              f" -- {j['direct_reason']}")
        print(f"XLA:CPU zero-copy alignment: {j['cpu_alignment']} bytes")
        print("private JAX symbols used:")
        for s in j["private_symbols"]:
            print(f"  {s['purpose']}: " + (f"{s['found']} ({s['reason']})" if s["found"]
                                            else s["reason"]))
    print("\nto_jax of a float32 tensor from each DLDeviceType, here:")
    width = max(len(row["name"]) for row in r["device_types"])
    for row in r["device_types"]:
        print(f"  {row['name']:<{width}} ({row['value']:>2})  {row['route']:<13} {row['reason']}")
    print("\nDLPack producers here (each in its own process): C exchange API, __dlpack__ keywords",
          flush=True)


def _print_producer(name: str, row: dict[str, Any]) -> None:
    if "error" in row:
        print(f"  {name}: cannot be imported here ({row['error']})", flush=True)
        return
    api = row["exchange_api"]
    words = [f"exchange API {api[0]}.{api[1]}" if api else "no exchange API"]
    words += [f"{key}: {_ANSWERS[row[key]]}" for key in _KEYWORDS]
    print(f"  {row['type']}: {', '.join(words)}", flush=True)


def _inspect(args: argparse.Namespace) -> int:
    try:
        x = _load_subject(args)
    except Exception as exc:  # the user's file or expression: report it, no traceback
        if args.path is not None and not _is_npy(args.path):
            return _fail(f"inspect: {args.path} is not a .npy file (it does not start with NumPy's "
                         f"magic string \\x93NUMPY); give a file np.save wrote, or --expr EXPRESSION")
        what = f"--expr {args.expr!r} failed"
        if args.path is not None:
            what = f"np.load cannot read {args.path} (to inspect an expression instead, pass --expr)"
        return _fail(f"inspect: {what}: {type(exc).__name__}: {exc}")
    if not is_tensor(x):
        if isinstance(x, np.ndarray):  # a dtype DLPack has no type for: the core words it
            try:
                dlinspect.peek(x)
            except dlinspect.NotNumericError as exc:
                return _fail(f"inspect: {args.path or args.expr}: {exc}")
        return _fail(f"inspect: expected a tensor (an object with __dlpack__ or a DLPack capsule), "
                     f"got {type_name(type(x))}; inspect looks at one tensor at a time (for a "
                     f"dict or list, inspect each leaf).")
    options: dict[str, Any] = {"copy": {"none": None, "true": True, "false": False}[args.copy]}
    if args.target == "jax":
        options.update(fallback=args.fallback, readonly=args.readonly)
    try:
        route = dlinspect.plan(x, args.target, **options)
    except dlinspect.DLInspectError as exc:
        print(f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR_ROUTE
    print(explain_one(route, x))   # (dlinspect.explain's words of the route just planned)
    return EXIT_ERROR_ROUTE if route.kind == "error" else 0


def _is_npy(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"\x93NUMPY"
    except OSError:
        return True   # (not readable: np.load's own words say why)


def _load_subject(args: argparse.Namespace) -> Any:
    if args.path is not None:
        # Copy-on-write mapping: the file is never written, and the array is as
        # writable as np.load's would be (mode "r" would always read "read-only").
        return np.load(args.path, mmap_mode="c", allow_pickle=False)
    # (dlinspect.testing, which the package imports, in scope for --expr: FakeProducer...)
    scope: dict[str, Any] = {"np": np, "numpy": np, "dlinspect": dlinspect}
    for name, module in (("torch", "torch"), ("jax", "jax"), ("jnp", "jax.numpy")):
        if mod := optional(module):
            scope[name] = mod
    return eval(args.expr, scope)  # noqa: S307 - the user's own expression, on their machine


def _bench_problem(args: argparse.Namespace, suites: list[str], known: Sequence[str]) -> str | None:
    """What is wrong with a bench command line, before a run that may take minutes."""
    if unknown := [s for s in suites if s not in known]:
        return f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(known)}"
    if args.repeat is not None and args.repeat < 1:
        return f"--repeat must be at least 1, not {args.repeat}"
    for path in (p for p in (args.json, args.plot, args.markdown) if p):
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            return f"cannot write {path}: the folder {folder} does not exist"
        if not os.access(folder, os.W_OK):
            return f"cannot write {path}: the folder {folder} is not writable"
    if not args.plot:
        return None
    if "sweep" not in suites:
        return "--plot draws the sweep suite; add it (dlinspect bench sweep ...)"
    if os.path.splitext(args.plot)[1].lower() not in (".png", ".svg", ".pdf"):
        return f"--plot writes .png, .svg or .pdf, not {args.plot}"
    if _missing("matplotlib"):
        return ("--plot draws with matplotlib, which is not installed; install it with: "
                "pip install matplotlib")
    return None


def _bench(args: argparse.Namespace) -> int:
    from dlinspect import bench
    suites = list(args.suites or bench.DEFAULT_SUITES)
    if args.instructions and "instructions" not in suites:
        suites.append("instructions")
    if problem := _bench_problem(args, suites, bench.SUITES):
        return _fail(f"bench: {problem}")
    report = bench.run_suites(suites, quick=args.quick, repeat=args.repeat,
                              progress=not args.no_progress)
    print(bench.format_report(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        bench.plot_sweep(report, args.plot)
        print(f"wrote {args.plot}")
    if args.markdown:
        bench.write_markdown(report, args.markdown, f"dlinspect {' '.join(args.words)}",
                             os.path.relpath(args.plot, os.path.dirname(args.markdown) or ".")
                             if args.plot else None)
        print(f"wrote {args.markdown}")
    failed = any(t["status"] == "FAIL" for s in report["suites"].values() for t in s["targets"])
    return 1 if args.check and failed else 0


def _missing(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # e.g. sys.modules[module] is None
        return True


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1: exit code 2 means "the route is an error" (inspect)."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dlinspect", description="Read DLPack tensor headers "
                                     "without consuming them, and route tensors into JAX.")
    parser.add_argument("--version", action="version", version=f"dlinspect {dlinspect.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("doctor", help="what this installation can do",
                       description="Print what this installation can do: versions, JAX's "
                                   "platforms and devices, how dlinspect imports into JAX, the "
                                   "route of a tensor from each DLDeviceType, and each "
                                   "installed DLPack producer (probed in its own process).")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p = sub.add_parser(
        "inspect", help="explain the route of a .npy file or an expression",
        description="Print dlinspect.explain() for one tensor. Exit code 0 when the route "
                    "works (zero-copy, copy, host-fallback), 2 when it is an error, 1 when the "
                    "input cannot be read or is not a tensor.")
    one = p.add_mutually_exclusive_group(required=True)   # (argparse says when neither or both)
    one.add_argument("path", nargs="?", help="a .npy file (memory-mapped copy-on-write; never written)")
    one.add_argument("--expr", help="a Python expression giving a tensor, with np, torch, jax, jnp "
                                  "and dlinspect in scope, e.g. 'np.ones((3, 4))[:, ::2]'")
    for flag, choices, text in (   # (the first choice is the default)
            ("--target", ("jax", "host"), "route into JAX (to_jax) or NumPy (to_host); default jax"),
            ("--copy", ("none", "true", "false"),
             "the copy= option: none copies only where needed, true always, false never"),
            ("--fallback", ("host", "raise"),
             "for devices this JAX has no backend for: through host memory, or an error"),
            ("--readonly", ("copy", "share"),
             "read-only memory: copy it (default) or import it without a copy")):
        p.add_argument(flag, choices=choices, default=choices[0], help=text)
    p = sub.add_parser("bench", help="benchmark suites against plain from_dlpack",
                       description="Time dlinspect against plain from_dlpack, jax.device_put, "
                                   "jnp.asarray and NumPy's own copy, and check each target "
                                   "(a ratio against a baseline measured in the same run).")
    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help="suites to run (default: peek, to_jax, sweep, loader); also "
                        "instructions, copies, stack")
    for flag, text in (   # (switches, off by default)
            ("--instructions", "also count instructions per call under valgrind's callgrind "
                               "(a minute or two; stable on a noisy machine)"),
            ("--quick", "fewer, shorter runs (noisier figures)"),
            ("--check", "exit 1 when a target fails"),
            ("--no-progress", "no progress bar")):
        p.add_argument(flag, action="store_true", help=text)
    p.add_argument("--repeat", type=int, help="runs per measurement (default 15; 3 with --quick)")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="plot per-call cost against size (matplotlib)")
    p.add_argument("--markdown", metavar="FILE.md", help="write the report as Markdown")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``dlinspect`` command.

    Parameters
    ----------
    argv : sequence of str or None
        The arguments after the program name (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code: 0; 2 from ``inspect`` for an error route; 1 for a usage
        error, an ``inspect`` input that cannot be read or is not a tensor, a missing
        plot library, or ``bench --check`` with a failed target.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.words = argv   # (what bench's Markdown names as the command that made it)
    try:
        if args.command == "doctor":
            if args.json:
                print(json.dumps(doctor_report(), indent=2))
            else:   # each part as soon as it is known
                _print_doctor(doctor_report(producers=False))
                producers_report(_print_producer)
            return 0
        return _inspect(args) if args.command == "inspect" else _bench(args)
    except BrokenPipeError:  # e.g. `dlinspect doctor | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ImportError as exc:
        if "jax" not in str(exc) and exc.name not in ("jax", "jaxlib"):
            raise
        # One line, no traceback: the install hint is all there is to do.
        return _fail(f"{args.command}: this needs jax, which is not installed here; install it "
                     f"with: {INSTALL_JAX}")


if __name__ == "__main__":
    sys.exit(main())
