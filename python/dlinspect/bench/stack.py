"""Suite ``stack``: ``dlinspect.stack`` next to ``np.stack``, in time.

Rows, median µs per call, for ``n`` examples ``{"image": 3x32x32 float32, "label":
int32}`` (n = 8, 64, 256):

    stack(eN)          dlinspect.stack of the n examples (one aligned batch)
    np.stack(eN)       np.stack of each key's column: what a loader's collate does
    collate stack      one epoch of a torch DataLoader over 256 examples, batch_size 32,
                       collate_fn=dlinspect.stack (8 batches)
    collate np.stack   the same with a collate_fn that np.stacks each key's column
    stack + to_jax     the dlinspect.stack epoch, each batch then to_jax
    default + to_jax   the same DataLoader with torch's default collate (torch tensors),
                       each batch then to_jax: what a user compares with
    default + asarray  torch's default collate, each batch then jnp.asarray per leaf

Both statements of a pair take turns in every round (``time_cases``). Targets: stack
at most 1.10x np.stack for every n, as a collate_fn at most 1.10x the np.stack collate,
and, with the conversion into JAX, at most 1.0x torch's default collate followed by
to_jax and by jnp.asarray. torch is optional (the collate rows are skipped without it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

import dlinspect

from ._common import Tick, optional, time_cases

SIZES = (8, 64, 256)
LIMIT = 1.10


def examples(n: int) -> list[dict[str, Any]]:
    """``n`` examples as a loader's dataset gives them."""
    rng = np.random.default_rng(0)
    return [{"image": rng.random((3, 32, 32), dtype=np.float32), "label": np.int32(i)}
            for i in range(n)]


def np_collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """np.stack of each key's column: the baseline collate."""
    return {key: np.stack([x[key] for x in batch]) for key in batch[0]}


def run(quick: bool = False, repeat: int | None = None, tick: Tick | None = None) -> dict[str, Any]:
    repeat = repeat or (3 if quick else 15)
    ns: dict[str, Any] = {"stack": dlinspect.stack, "np_collate": np_collate}
    cases, targets = [], []
    for n in SIZES:
        ns[f"e{n}"] = examples(n)
        cases += [(f"stack(e{n})", f"stack(e{n})", False),
                  (f"np.stack(e{n})", f"np_collate(e{n})", False)]
        targets.append((f"stack({n} examples) <= {LIMIT:g}x np.stack of each key (time)",
                        f"stack(e{n})", f"np.stack(e{n})", LIMIT))
    torch = optional("torch")
    if torch is not None:
        from torch.utils.data import DataLoader
        ns["t"] = torch   # (time_cases runs the torch cases only where "t" is present)
        data: Any = examples(256)   # (a list is a map-style dataset to DataLoader)
        ns["ours"] = DataLoader(data, batch_size=32, collate_fn=dlinspect.stack)
        ns["theirs"] = DataLoader(data, batch_size=32, collate_fn=np_collate)
        ns["default"] = DataLoader(data, batch_size=32)
        ns["to_jax"] = dlinspect.to_jax
        jax = optional("jax")
        cases += [("collate stack", "for _ in ours: pass", True),
                  ("collate np.stack", "for _ in theirs: pass", True)]
        targets.append((f"stack as a torch collate_fn <= {LIMIT:g}x np.stack's (time per "
                        f"epoch)", "collate stack", "collate np.stack", LIMIT))
        if jax is not None:
            ns["asarray"] = lambda b: jax.tree_util.tree_map(jax.numpy.asarray, b)
            cases += [("stack + to_jax", "for b in ours: to_jax(b)", True),
                      ("default + to_jax", "for b in default: to_jax(b)", True),
                      ("default + asarray", "for b in default: asarray(b)", True)]
            targets += [("stack collate + to_jax <= 1x torch's default collate + to_jax "
                         "(time per epoch)", "stack + to_jax", "default + to_jax", 1.0),
                        ("stack collate + to_jax <= 1x torch's default collate + "
                         "jnp.asarray (time per epoch)", "stack + to_jax", "default + asarray",
                         1.0)]
    rows, checked = time_cases("stack", cases, ns, repeat, quick, tick, targets)
    return {"title": "stack", "unit": "µs per call", "rows": rows, "repeat": repeat,
            "targets": checked, "notes": ["examples: {'image': 3x32x32 float32, 'label': "
                                          "int32}; collate: 256 examples, batch_size 32"]}
