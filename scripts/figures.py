"""Write every figure of README.md and docs/ from the committed files that hold them.

Usage: python scripts/figures.py [--check]

A figure lives in a generated block of a Markdown file::

    <!-- generated: NAME (python scripts/figures.py) -->
    ...
    <!-- end generated: NAME -->

and this script writes what is between the two lines from the block's source:

    run, compare, speed, summary, per-call, loader,     benchmarks/results.json (the run
    copies
                                                        that wrote BENCHMARKS.md)
    stacks                                              .ci/stacks.json (what CI tests)
    requirements                                        pyproject.toml (what is declared)
    producers                                           scripts/interop.sh (the pinned
                                                        producers and loaders)
    gpu                                                 benchmarks/gpu/ (the GPU check's
                                                        files, when a run is committed)
    tpu                                                 benchmarks/tpu/ (the TPU check's
                                                        files, when a run is committed)
    pipelines                                           benchmarks/loaders.json (the run of
                                                        benchmarks/bench_loaders.py)
    setup                                               benchmarks/setup.json (what the
                                                        README's commands took)
    layout                                              the code (scripts/layout.py: each
                                                        file's lines and what it reads)
    pip-NAME                                            scripts/interop.sh (a loader page's
                                                        install line: NAME's pins)

--check writes nothing and exits 1, naming each block, when a file holds anything else
(tests/test_packaging.py runs it). ``draw_plots(folder)`` draws the plots of the
Performance page from benchmarks/results.json (docs/conf.py calls it at every build).
"""

from __future__ import annotations

import collections
import json
import re
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.json"
LOADERS = ROOT / "benchmarks" / "loaders.json"
GPU_DIR = ROOT / "benchmarks" / "gpu"
TPU_DIR = ROOT / "benchmarks" / "tpu"

BLOCK = re.compile(r"(<!-- generated: ([a-z-]+) \(python scripts/figures\.py\) -->\n)"
                   r"(.*?)"
                   r"(<!-- end generated: \2 -->)", re.S)


def markdown_files() -> list[Path]:
    """Every file that may hold generated blocks: README.md and the site's pages."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md")
                                        if not p.relative_to(ROOT / "docs").parts[0].startswith("_"))]


def results() -> dict[str, Any]:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def _rows(suite: str) -> dict[str, float]:
    return {r["name"]: r["median"] for r in results()["suites"][suite]["rows"]}


def _us(value: float) -> str:
    return f"{value:.3g} µs"


def _ratio(value: float) -> str:
    return f"{value:.3g}"


def bench_command() -> str:
    """The command of the published run, as the run wrote it at the head of BENCHMARKS.md."""
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    m = re.search(r"```\n(dlinspect bench [^\n]+)\n```", text)
    if not m:
        raise SystemExit("BENCHMARKS.md names no `dlinspect bench ...` command")
    return m.group(1)


def run_line() -> str:
    """The machine and versions of the published run, and the command that made it."""
    report = results()
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    return (f"Run: {report['machine']}, JAX platform {report['jax_platform']}; {versions}; "
            f"written by `{bench_command()}`.")


# ---- the blocks -----------------------------------------------------------------------

COMPARE_ROW = "| per call, 32×32 float32 NumPy array, CPU |"


def compare(old: str) -> str:
    """README's first table, as written, with its per-call row from the published run."""
    rows = _rows("to_jax")
    row = (f"{COMPARE_ROW} {_us(rows['from_dlpack(x)'])} (64-byte aligned), "
           f"{_us(rows['from_dlpack(x16)'])} (16-byte) | {_us(rows['to_jax(x)'])} (zero-copy), "
           f"{_us(rows['to_jax(x16)'])} (one copy in C) |")
    lines = old.splitlines()
    at = [i for i, line in enumerate(lines) if line.startswith(COMPARE_ROW)]
    if len(at) != 1:
        raise SystemExit(f"the 'compare' block needs exactly one row starting {COMPARE_ROW!r}")
    lines[at[0]] = row
    return "\n".join(lines) + "\n"


PER_CALL = [  # (what, dlinspect's row, the baseline's row, the baseline's name)
    ("32×32 float32 NumPy array, 64-byte aligned", "to_jax(x)", "from_dlpack(x)",
     "`jax.dlpack.from_dlpack`"),
    ("32×32 float32 NumPy array, 16-byte aligned (both copy)", "to_jax(x16)",
     "from_dlpack(x16)", "`jax.dlpack.from_dlpack`"),
    ("32×32 float32 torch tensor", "to_jax(t)", "from_dlpack(t)", "`jax.dlpack.from_dlpack`"),
    ("dict of 16 float32 torch tensors", "to_jax(d)", "tree_map(from_dlpack, d)",
     "`jax.tree_util.tree_map(from_dlpack, d)`"),
    ("a `jax.Array`", "to_jax(j)", "from_dlpack(j)", "`jax.dlpack.from_dlpack`"),
]


def per_call(old: str = "") -> str:
    """Median µs per call of to_jax and of its baseline on the same inputs."""
    rows = _rows("to_jax")
    out = ["| input | baseline | baseline, per call | `dlinspect.to_jax`, per call | ratio |",
           "| --- | --- | ---: | ---: | ---: |"]
    for what, mine, theirs, name in PER_CALL:
        out.append(f"| {what} | {name} | {_us(rows[theirs])} | {_us(rows[mine])} | "
                   f"{_ratio(rows[mine] / rows[theirs])} |")
    return "\n".join(out) + "\n"


def _copy_ratios() -> dict[str, dict[str, float]]:
    """to_jax over the fastest copy of JAX's own and NumPy's (the suite's targets), by
    kind of copy and size."""
    out: dict[str, dict[str, float]] = {}
    for target in results()["suites"]["copies"]["targets"]:
        kind, size = re.fullmatch(r"to_jax (.+?) ([0-9.]+ [KMG]iB)", target["measured"]).groups()
        out.setdefault(kind, {})[size] = target["value"]
    return out


def _loader_rate(name: str) -> float:
    return _rows("loader")[name]


def speed(old: str = "") -> str:
    """README's speed summary: per call, a loader loop, the copies, the targets."""
    report = results()
    targets = [dict(t, suite=name) for name, s in report["suites"].items() for t in s["targets"]]
    passed = sum(t["status"] == "PASS" for t in targets)
    copies = _copy_ratios()
    ratios = [r for sizes in copies.values() for r in sizes.values()]
    # (a run before the copies suite measured CPU time judged wall time)
    measure = ("CPU time" if report["suites"]["copies"]["targets"][0].get("figure") == "cpu_median"
               else "time")
    conv = (_loader_rate("to_jax loop [conversion]"), _loader_rate("from_dlpack loop [conversion]"),
            _loader_rate("asarray loop [conversion]"))
    return (per_call() + "\n"
            f"- A loader's batches (256 images of 3×32×32 float32, int64 labels), conversion "
            f"only: {conv[0]:,.0f} batches/s with a `to_jax` loop, {conv[1]:,.0f} with "
            f"`jax.dlpack.from_dlpack` per leaf, {conv[2]:,.0f} with `jnp.asarray`.\n"
            f"- Copies ({', '.join(copies)}; 1 KiB to 256 MiB): `to_jax` takes "
            f"{min(ratios):.2f}x to {max(ratios):.2f}x the {measure} of the fastest of "
            f"`jax.device_put`, `jnp.asarray` "
            f"and NumPy's own copy plus its import.\n"
            f"- {passed} of the run's {len(targets)} targets met{_missed(targets)}.\n\n"
            f"{run_line()}\n")


def _missed(targets: list[dict[str, Any]]) -> str:
    """Where the targets missed (or too noisy to judge) are: counted by suite, not listed."""
    missed = collections.Counter(t["suite"] for t in targets if t["status"] != "PASS")
    if not missed:
        return ""
    where = ", ".join(f"{n} in {suite}" for suite, n in sorted(missed.items()))
    return f"; the others ({where}) are listed with their figures in [BENCHMARKS.md](BENCHMARKS.md)"


def summary(old: str = "") -> str:
    """Every target of the published run (dlinspect.bench.summary_markdown)."""
    from dlinspect.bench import summary_markdown
    return summary_markdown(results()) + "\n"


def loader(old: str = "") -> str:
    """The loader suite: batches/s by method, conversion only and end to end."""
    suite = results()["suites"]["loader"]
    cols = ("conversion", "end_to_end", "end_to_end_synced")
    out = ["| method | conversion only | end to end, jitted step | end to end, loss read "
           "every step |", "| --- | ---: | ---: | ---: |"]
    for method in suite["tables"]["conversion"]:
        out.append(f"| {method} | " + " | ".join(
            f"{suite['tables'][c][method]['median']:,.0f}" for c in cols) + " |")
    sources = suite.get("sources")
    if sources:
        out += ["", "By source, conversion only: a source that hands over new memory each time, "
                "and one that refills a single staging buffer (batches/s; kept: whether "
                "batches kept over the pass hold their own values):", "",
                "| method | " + " | ".join(f"{s} | kept" for s in sources) + " |",
                "| --- |" + " ---: | --- |" * len(sources)]
        for method in next(iter(sources.values())):
            out.append(f"| {method} | " + " | ".join(
                f"{t[method]['median']:,.0f} | {'yes' if t[method]['kept_right'] else 'no'}"
                for t in sources.values()) + " |")
    out += ["", f"Sharded over {suite['sharded']['devices']} CPU devices, conversion only:", "",
            "| method | batches/s |", "| --- | ---: |"]
    out += [f"| {m} | {row['median']:,.0f} |" for m, row in suite["sharded"]["rows"].items()]
    return "\n".join(out) + "\n"


def copies(old: str = "") -> str:
    """The copies suite as one table: kind of copy by size, ratio to the fastest copy of
    JAX's own and NumPy's."""
    ratios = _copy_ratios()
    sizes = list(next(iter(ratios.values())))
    out = ["| copy | " + " | ".join(sizes) + " |", "| --- | " + " | ".join("---:" for _ in sizes)
           + " |"]
    out += [f"| {kind} | " + " | ".join(f"{by[s]:.2f}" for s in sizes) + " |"
            for kind, by in ratios.items()]
    return "\n".join(out) + "\n"


def stacks(old: str = "") -> str:
    """The version stacks of .ci/stacks.json, one row each."""
    data = json.loads((ROOT / ".ci" / "stacks.json").read_text(encoding="utf-8"))
    out = ["| stack | Python | versions | command |", "| --- | --- | --- | --- |"]
    for name, stack in data.items():
        if name.startswith("_"):
            continue
        pins = ", ".join(p.replace("==", " ") for p in stack["pins"])
        out.append(f"| {name} | {stack['python']} | {pins} | `bash scripts/stack.sh {name}` |")
    return "\n".join(out) + "\n"


def requirements(old: str = "") -> str:
    """What pyproject.toml declares: Python, the dependency and each extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    out = ["| install, in a clone of the repository | requires |", "| --- | --- |",
           f"| `pip install .` | Python {project['requires-python']}, "
           + ", ".join(f"`{d}`" for d in project["dependencies"]) + " |"]
    for extra, specs in project["optional-dependencies"].items():
        out.append(f"| `pip install \".[{extra}]\"` | "
                   + ", ".join(f"`{s}`" for s in specs) + " |")
    return "\n".join(out) + "\n"


def interop_pins() -> dict[str, str]:
    """The producers and loaders scripts/interop.sh installs, with its pins."""
    text = (ROOT / "scripts" / "interop.sh").read_text(encoding="utf-8")
    return dict(re.findall(r'^\s+([a-z_]+)\) echo "([^"]+)" ;;$', text, re.M))


def producers(old: str = "") -> str:
    out = ["| `INTEROP=` name | installs | tests |", "| --- | --- | --- |"]
    for name, spec in interop_pins().items():
        pins = ", ".join(p.replace("==", " ") for p in spec.split())
        out.append(f"| {name} | {pins} | `tests/interop/` |")
    return "\n".join(out) + "\n"


def gpu(old: str = "", folder: Path = GPU_DIR) -> str:
    """The GPU check's figures, from benchmarks/gpu/gpu-bench.json when one is committed
    (and the closing line of benchmarks/gpu/gpu-tests.log beside it)."""
    bench = folder / "gpu-bench.json"
    if not bench.exists():
        return ("No run of the GPU check is recorded in this repository "
                "(there is no `benchmarks/gpu/gpu-bench.json`).\n")
    report = json.loads(bench.read_text(encoding="utf-8"))
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    out = [f"Run: {versions}; devices {', '.join(report['devices'])}.", ""]
    log = folder / "gpu-tests.log"
    if log.exists():
        last = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        out += [f"`tests/gpu`: {last[-1].strip('= ')}.", ""] if last else []
    out += ["| call | median µs |", "| --- | ---: |"]
    out += [f"| `{k}` | {v:.3g} |" for k, v in report["per_call_us"].items()]
    out += ["", "| ratio | value |", "| --- | ---: |"]
    out += [f"| {k} | {v:.3g} |" for k, v in report["ratios"].items()]
    out += ["", "| loop beside a jitted GPU step | batches/s |", "| --- | ---: |"]
    out += [f"| {k} | {v:,.0f} |" for k, v in report["loop_batches_per_s"].items()]
    return "\n".join(out) + "\n"


def tpu(old: str = "", folder: Path = TPU_DIR) -> str:
    """The TPU check's figures, from benchmarks/tpu/tpu-check.json (and the closing line of
    benchmarks/tpu/suite.log beside it)."""
    check = folder / "tpu-check.json"
    if not check.exists():
        return "No run of the TPU check is recorded in this repository.\n"
    report = json.loads(check.read_text(encoding="utf-8"))
    rows = report["rows"]
    bad = [r for r in rows if r.get("error") or r.get("problems")]
    out = [f"Run: jax {report['jax']} on {report['device']}: {len(rows) - len(bad)} of "
           f"{len(rows)} conversions computed right (`a + 0`, a reduction, indexing, a jit "
           f"beside `jnp.asarray`'s array), before and after `jax.device_put`.", ""]
    log = folder / "suite.log"
    if log.exists():
        last = [line for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        out += [f"The CPU suite's route tests beside the TPU: {last[-1].strip('= ')}.", ""]
    out += ["| bytes | `to_jax(x, device=tpu)` µs | `jax.device_put` µs | ratio "
            "| `to_jax(x)` µs | `jnp.asarray` µs | ratio |", "|" + " ---: |" * 7]
    out += [f"| {_size(t['bytes'])} | {t['to_jax us']:,.0f} | {t['device_put us']:,.0f} | "
            f"{t['ratio']:.2f} | {t['to_jax no device us']:,.0f} | {t['jnp.asarray us']:,.0f} | "
            f"{t['ratio no device']:.2f} |" for t in report["times"]]
    return "\n".join(out) + "\n"


def run(old: str = "") -> str:
    return run_line() + "\n"


#: A figure is shown with its quartiles where they spread over more than this share of
#: its median (a baseline that swings between rounds), and a ratio also where its
#: quartiles straddle 1.0 (the run cannot tell faster from slower).
SPREAD = 0.25


def with_spread(median: float, q1: float, q3: float, ratio: bool = False) -> str:
    """A median as the pipelines table shows it: bare, or with its quartiles where the
    rounds spread too much (``SPREAD``) or, for a ratio, straddle 1.0."""
    text = f"{median:.2f}" if ratio else _rate(median)
    wide = (q3 - q1) > SPREAD * median or (ratio and q1 < 1.0 < q3)
    if not wide:
        return text
    low, high = (f"{q1:.2f}", f"{q3:.2f}") if ratio else (_rate(q1), _rate(q3))
    return f"{text} ({low}–{high})"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _size(nbytes: float) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B" if nbytes else "0"


def loader_command(report: dict[str, Any]) -> str:
    """The command that wrote benchmarks/loaders.json, as the run recorded it."""
    return " ".join(["python benchmarks/bench_loaders.py", *report["argv"]])


def pipelines(old: str = "", path: Path = LOADERS) -> str:
    """The real pipelines (benchmarks/loaders.json): per pipeline and method, batches/s
    end to end, the paired ratio against the ecosystem's own JAX path, conversion time
    per batch, and the bytes per batch imported zero-copy and copied."""
    if not path.exists():
        return "No run of `benchmarks/bench_loaders.py` is recorded in this repository.\n"
    report = json.loads(path.read_text(encoding="utf-8"))
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    out = []
    if report["quick"]:
        out += [f"**A quick run (`--quick`, {report['repeat']} rounds): it shows that the table "
                f"renders; its figures are noisy, not for judging.**", ""]
    out += [f"Run: {report['machine']}; {versions}; {report['repeat']} rounds, the first "
            f"{report['warmup']} batches of each epoch not timed; {report['seconds'] / 60:.1f} "
            f"min; written by `{loader_command(report)}`. A figure is shown as median "
            f"(first–third quartile) where its rounds spread over more than "
            f"{SPREAD:.0%} of the median, and a ratio also where its quartiles straddle 1.0.",
            "",
            "| pipeline | method | batches/s | ratio, paired | conversion, µs per batch "
            "| zero-copy per batch | copied per batch (why) |",
            "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for name, pipe in report["pipelines"].items():
        for i, (method, row) in enumerate(pipe["methods"].items()):
            e2e, ratio = row["end_to_end"], row["ratio"]
            cells = [name if i == 0 else "",
                     f"`{method}`" + (" (own path)" if method == pipe["baseline"] else ""),
                     with_spread(e2e["median"], e2e["q1"], e2e["q3"]),
                     "1" if ratio is None else with_spread(ratio["median"], ratio["q1"],
                                                           ratio["q3"], ratio=True),
                     _conversion_cell(row["conversion"], pipe["baseline"]),
                     *_bytes_cells(row["bytes"])]
            out.append("| " + " | ".join(cells) + " |")
    if report["skipped"]:
        out += ["", "Not run: " + "; ".join(f"{name} ({why})"
                                            for name, why in report["skipped"].items()) + "."]
    return "\n".join(out) + "\n"


def _conversion_cell(conv: dict[str, Any] | None, baseline: str) -> str:
    """A method's conversion time per batch, and its paired ratio (against the baseline,
    or the method it names)."""
    if conv is None:
        return ""
    r, text = conv["ratio"], f"{conv['us_per_batch']:,.0f}"
    if r is None:
        return text
    text += f", ×{with_spread(r['median'], r['q1'], r['q3'], ratio=True)}"
    return text + (f" against `{conv['against']}`" if conv["against"] != baseline else "")


def _bytes_cells(got: dict[str, Any] | None) -> list[str]:
    """A method's bytes per batch imported zero-copy, and copied (most first, with why)."""
    if got is None:
        return ["", ""]
    copied = sorted(got["copied"].items(), key=lambda kv: -kv[1])
    return [_size(got["zero_copy"]),
            "; ".join(f"{_size(b)} ({why})" for why, b in copied if b) or "0"]


SETUP = ROOT / "benchmarks" / "setup.json"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def setup(old: str = "", path: Path = SETUP) -> str:
    """What the README's commands took, from benchmarks/setup.json (written by
    ``python scripts/measure_setup.py [--ci-log FILE]``)."""
    report = json.loads(path.read_text(encoding="utf-8"))
    first = report["first"]
    where = f"a machine with {report['machine']} (Python {report['python']}, {report['date']})"
    text = (f"Measured on {where} by `python scripts/measure_setup.py`, in a fresh clone: the "
            f"first command took {first['seconds'] / 60:.1f} min, its virtual environment "
            f"takes {_gb(first['venv_bytes'])}, and the example reached a test accuracy of "
            f"{first['accuracy']:.3f} (it varies a little from run to run).")
    test = report.get("test")
    if test:
        counts = test["counts"]
        text += (f" The test command then took {test['seconds'] / 60:.1f} min, the build "
                 f"included, and added {_gb(test['added_bytes'])} to the clone: "
                 f"{counts.get('passed', 0):,} tests passed, {counts.get('skipped', 0)} skipped "
                 f"(libraries not installed, no GPU) and {counts.get('deselected', 0)} slow ones "
                 f"left out (the machine's load average was {test['load']:.1f} as it began).")
    ci = report.get("ci")
    if ci:
        sizes = [s["clone"] for s in ci["steps"]]
        largest = max(sizes, key=lambda v: float(v[:-1]) * {"M": 1e-3, "G": 1, "T": 1e3}[v[-1]])
        slowest = max(ci["steps"], key=lambda s: s["seconds"])
        lanes = len({s.get("lane", 1) for s in ci["steps"]})
        text += (f" `bash .ci/run` took {ci['minutes']} min"
                 f"{f' ({lanes} lanes at once)' if lanes > 1 else ''} in its run of {ci['date']}, "
                 f"every step passing; the clone grew to {largest[:-1]} {largest[-1]}B (virtual "
                 f"environments, build folders, the CUDA builds of torch that older stacks pull), and the "
                 f"longest step was {slowest['step']} ({slowest['seconds'] / 60:.0f} min).")
    return text + "\n"


def layout(old: str = "") -> str:
    """The package's and the core's files, their lines and the files each reads
    (scripts/layout.py, from the code itself)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from layout import drawing, layout as rooms
    return f"```text\n{drawing(rooms())}\n```\n"


BLOCKS: dict[str, Callable[[str], str]] = {
    "layout": layout, "run": run, "compare": compare, "speed": speed, "summary": summary,
    "per-call": per_call, "loader": loader, "copies": copies, "stacks": stacks, "requirements": requirements,
    "producers": producers, "gpu": gpu, "tpu": tpu, "pipelines": pipelines, "setup": setup,
}


def pip_line(name: str) -> str:
    """A loader page's install line: what scripts/interop.sh installs for ``name``
    (block ``pip-NAME``), beside dlinspect itself from a clone."""
    spec = " ".join(f'"{p}"' if "[" in p else p for p in interop_pins()[name].split())
    return ("```bash\n# the versions the interop suite tests, then dlinspect from a clone of its repository\n"
            f'pip install {spec}\npip install ".[jax]"\n```\n')


def rendered(text: str, where: str = "") -> str:
    """``text`` with every generated block written anew from its source."""
    def one(m: re.Match[str]) -> str:
        name = m.group(2)
        if name.startswith("pip-") and name[4:] in interop_pins():
            return m.group(1) + pip_line(name[4:]) + m.group(4)
        if name not in BLOCKS:
            raise SystemExit(f"{where}: no renderer for the generated block {name!r}")
        return m.group(1) + BLOCKS[name](m.group(3)) + m.group(4)
    return BLOCK.sub(one, text)


def blocks(text: str) -> dict[str, str]:
    """The generated blocks of ``text``, by name (their content as written)."""
    return {m.group(2): m.group(3) for m in BLOCK.finditer(text)}


# ---- plots ----------------------------------------------------------------------------

def draw_plots(folder: Path) -> list[Path]:
    """The Performance page's plots, drawn from benchmarks/results.json into ``folder``:
    ``sweep.png`` (by dlinspect.bench.plot_sweep, as ``dlinspect bench --plot`` draws it)
    and ``copies.png`` (each kind of copy against the fastest of JAX's and NumPy's, by
    size)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dlinspect.bench import plot_sweep
    folder.mkdir(parents=True, exist_ok=True)
    report = results()
    plot_sweep(report, str(folder / "sweep.png"))
    ratios = _copy_ratios()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    for kind, by in ratios.items():
        ax.plot(list(by), list(by.values()), marker="o", label=kind)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("to_jax time / fastest of JAX's and NumPy's")
    ax.set_xlabel("tensor size")
    ax.set_title(f"Copies into JAX ({report['machine']}, jax {report['versions']['jax']})",
                 fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "copies.png", dpi=110)
    plt.close(fig)
    return [folder / "sweep.png", folder / "copies.png"]


def main() -> int:
    unknown = [a for a in sys.argv[1:] if a != "--check"]
    if unknown:   # (--help included: print the usage, write nothing)
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 0 if unknown in (["--help"], ["-h"]) else 2
    check = "--check" in sys.argv
    stale = []
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        new = rendered(text, str(path.relative_to(ROOT)))
        if new == text:
            continue
        changed = [name for name, body in blocks(new).items() if blocks(text).get(name) != body]
        stale.append(f"{path.relative_to(ROOT)}: {', '.join(changed)}")
        if not check:
            path.write_text(new, encoding="utf-8")
    if check and stale:
        print("generated blocks differ from their sources (run python scripts/figures.py):\n  "
              + "\n  ".join(stale), file=sys.stderr)
        return 1
    for line in stale:
        print(f"wrote {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
