# batch.pxi: the one batch engine: any batch is parts (the batch, or each sub-tree under its
# sharding) whose every leaf is decided before any is taken (_decide_batch), then run
# (_run_batch). A new kind of batch is a new way to make parts (_parts), not a new engine.

from dlinspect import _tree


@cython.final
cdef class _Part:
    """One sub-tree of a batch (the whole batch, or one under a sharding) and its options."""
    # prefix: the sub-tree's key path in the batch (jax keys; () for the batch); flat: its
    # dlinspect._tree.Flat, or None: a plain container walked here.
    cdef object prefix, flat
    cdef type tp          # (plain container) dict, list or tuple
    # keys: (plain dict) its keys in sorted order, as JAX walks them; out: what each leaf becomes.
    cdef list keys, leaves, out
    cdef Options opts
    # owned: the ids of the leaves proven to own their memory (own.pxi's _Owners.owned), the
    # batch's; None: every leaf is taken as it is (no proof asked: copy given, or a tensor alone).
    cdef dict owned

    cdef proof(self, leaf):
        """What proved tensor ``leaf``'s memory the batch's (a torch storage, or True); True
        where no proof is asked; None: not proven (Need.ALIASED)."""
        if self.owned is None:
            return True
        return self.owned.get(_key(leaf))

    cdef bint aliased(self, leaf) except -1:
        """``leaf`` is a tensor the batch is not proven to own the memory of (Need.ALIASED)."""
        return self.proof(leaf) is None

    cdef str keystr(self, Py_ssize_t i):
        """Leaf ``i``'s key path, as ``jax.tree_util.keystr`` writes it (the prefix first)."""
        if self.flat is not None:
            local = self.flat.keystr(i)
        elif self.tp is dict:
            local = f"[{self.keys[i]!r}]"
        else:
            local = f"[{i}]"
        if not self.prefix:
            return local
        return _options_module.jax_module("jax.tree_util").keystr(self.prefix) + local

    cdef rebuild(self):
        if self.flat is not None:
            return self.flat.unflatten(self.out)
        cdef Py_ssize_t i
        if self.tp is dict:
            return {self.keys[i]: self.out[i] for i in range(len(self.keys))}
        return self.out if self.tp is list else tuple(self.out)


cdef _Part _part(x, tuple prefix, Options opts, bint planned, dict owned):
    """The part of sub-tree ``x``: a plain dict, list or tuple of tensors and scalars walked
    here, anything else by dlinspect._tree (``planned``: a list of text a route per leaf);
    ``owned``: the proof's answer (own.pxi)."""
    cdef _Part part = _Part.__new__(_Part)
    part.prefix = prefix
    part.opts = opts
    part.keys = []
    part.owned = owned
    cdef bint text_lists = not (planned or opts.leaves == "raise")
    tp = type(x)
    if tp is dict or tp is list or tp is tuple:
        part.leaves = _plain_leaves(x, tp, part.keys, text_lists)
        if part.leaves is not None:
            part.tp = tp
            return part
    part.flat = _tree.flatten(x, text_lists)
    part.leaves = part.flat.leaves
    return part


cdef tuple _parts(x, JaxTarget tg, Options opts, bint planned, dict owned):
    """``(parts, where)``: the batch's parts and the tree of their indices (None: one part);
    ``owned``: the proof's answer (own.pxi), every part's."""
    sharding = opts.sharding
    if sharding is None or isinstance(sharding, tg.jax.sharding.Sharding):
        return [_part(x, (), _leaf_options(opts), planned, owned)], None
    Sharding = tg.jax.sharding.Sharding
    tree_util = tg.jax.tree_util
    is_leaf = lambda s: s is None or isinstance(s, Sharding)  # noqa: E731
    try:
        tree_util.tree_map(lambda s, sub: None, sharding, x, is_leaf=is_leaf)
    except (ValueError, TypeError) as exc:
        raise ValueError(
            f"sharding= must be a jax.sharding.Sharding or a pytree of them whose structure "
            f"is a prefix of the batch's: {first_line(exc, False)}") from None
    cdef list parts = []

    def part_of(path, s, sub):
        parts.append(_part(sub, tuple(path), _leaf_options(opts.placed(sharding=s)), planned,
                           owned))
        return len(parts) - 1
    where = tree_util.tree_map_with_path(part_of, sharding, x, is_leaf=is_leaf)
    return parts, where


cdef _convert_batch(x, JaxTarget tg, Options opts, LoaderReport report=None,
                    Py_ssize_t held=-1):
    """Every leaf decided before any is consumed, then the plan run; errors name the leaf.
    ``held``: the references a loader holds to ``x`` (-1: a Python caller's call)."""
    owned = _owned(x, opts, held)   # (first: nothing of dlinspect's holds a part of x yet)
    if report is not None:
        report._pending = []   # (what a failed batch noted: forgotten here)
    parts, where = _parts(x, tg, opts, False, owned)
    try:
        plan = _decide_batch(parts, tg, report)
        _run_batch(plan, parts, tg)
    except BaseException:
        plan = None   # the exports let go of, with the error handled (see _convert)
        raise
    if report is not None:
        report._end(_leaf_path(parts))
    return _rebuild_parts(parts, where, tg)


cdef _rebuild_parts(list parts, where, JaxTarget tg):   # (to_jax's and plan's)
    if where is None:
        return (<_Part>parts[0]).rebuild()
    return tg.jax.tree_util.tree_map([(<_Part>p).rebuild() for p in parts].__getitem__, where)


cdef list _decide_batch(list parts, JaxTarget tg, LoaderReport report):
    """The plan: a ``_Leaf`` per tensor leaf (route None: the fast path's); nothing taken."""
    cdef list plan = []
    seen = set()   # the bare capsules met: each may come once in the batch
    cdef _Part part
    cdef Py_ssize_t k, i
    for k in range(len(parts)):
        part = parts[k]
        i = -1
        try:
            if part.flat is not None and part.flat.errors:   # a container not rebuilt
                i = min(part.flat.errors)
                raise part.flat.errors[i]
            i = repeated_capsule(part.leaves, seen)
            if i >= 0:
                raise repeated_capsule_error()
            if part.opts.leaves == "raise":
                for i, leaf in enumerate(part.leaves):
                    if leaf is not None and not is_tensor(leaf):   # (None: no leaf)
                        _raise_route(untouched(leaf, "jax", part.opts))
            i = -1   # (a leaf's own error is named by _decide_part)
            start = len(plan)
            _decide_part(part, k, tg, plan, report)
            if part.flat is not None:   # its containers tried with JAX arrays, before any take
                _check_rebuild(part.flat, [(<_Leaf>leaf).index for leaf in plan[start:]], tg)
        except BaseException as exc:
            plan = None   # the exports let go of, with the error handled (see _convert)
            if i >= 0 and isinstance(exc, Exception):
                _words.name_leaf(exc, part.keystr(i))
            raise
    return plan


cdef int _decide_part(_Part part, Py_ssize_t k, JaxTarget tg, list plan,
                      LoaderReport report) except -1:
    """Every tensor leaf of ``part`` decided into the plan (``_decide``), nothing taken; a leaf
    that is not a tensor, or a jax.Array returned as it is, kept in ``part.out``. An error
    is named by the key path of the leaf it is about."""
    cdef Options opts = part.opts
    cdef bint reuse = opts.sharding is not None
    cdef list leaves = part.leaves
    cdef Py_ssize_t i = -1
    cdef _Leaf d
    part.out = list(leaves)
    try:
        for i in range(len(leaves)):
            try:
                proof = part.proof(leaves[i])
                got = _decide(leaves[i], tg, "jax", opts, proof is None, i, reuse, proof)
            except NotNumericError:
                continue   # not a numeric tensor: a leaf kept as it is
            if got is leaves[i] or (<_Leaf>got).verdict == _V_PASS:
                continue
            d = got
            d.part = k
            if d.route is not None:
                if (<Route>d.route).problem is not None:
                    _raise_route(d.route)
                d.rank = _rank(d.route)
            if report is not None:
                report._note(k, i, d.route, d.info, d.needs, opts.copy is True)
            plan.append(d)
    except BaseException as exc:
        got = d = proof = None   # the exports let go of with the error handled (see _convert)
        if isinstance(exc, Exception):
            _words.name_leaf(exc, part.keystr(i))
        raise
    return 0


cdef int _check_rebuild(flat, list converted, JaxTarget tg) except -1:
    """Rebuild the containers with a JAX array per ``converted`` leaf: ContainerError if refused."""
    global _placeholder
    if _placeholder is None or _placeholder[0] is not tg:
        _placeholder = (tg, tg.jax.device_put(_np.float32(0)))
    values = list(flat.leaves)
    for i in converted:
        values[i] = _placeholder[1]
    flat.check_rebuild(values)
    return 0


cdef object _placeholder = None   # (JaxTarget, a 0-d jax.Array of it)


cdef int _run_batch(list plan, list parts, JaxTarget tg) except -1:
    """Run the plan: routes that take nothing of the caller's first; then everything that can
    fail in the others before any is taken (a route's ``_prepare``, a _V_COPY's memory); then
    those."""
    cdef Py_ssize_t m, n = len(plan)
    cdef bint prepared = False   # (from the first leaf that takes the caller's memory on)
    cdef _Leaf leaf
    cdef _Part part
    for m in range(1, n):
        if (<_Leaf>plan[m]).rank < (<_Leaf>plan[m - 1]).rank:   # out of order: sorted (stable)
            plan.sort(key=lambda leaf: (<_Leaf>leaf).rank)
            break
    try:
        for m in range(n):
            if not prepared and (<_Leaf>plan[m]).rank != 0:
                prepared = True
                name = _leaf_path(parts)
                for leaf in plan[m:]:
                    part = parts[leaf.part]
                    _prepare(leaf, tg, part.opts, name)
            leaf = plan[m]
            part = parts[leaf.part]
            part.out[leaf.index] = _run(leaf, part.leaves[leaf.index], tg, part.opts, prepared)
            leaf.cap = leaf.prepared = None   # (the capsule and the copy's memory are the array's)
    except Exception as exc:   # (``leaf``, ``part``: the one being prepared or run)
        _words.name_leaf(exc, part.keystr(leaf.index))
        raise
    return 0


cdef _leaf_path(list parts):
    """``(k, i)`` -> the key path in the batch of leaf ``i`` of part ``k`` (a warning's start, a
    loader's report's key)."""
    def path(Py_ssize_t k, Py_ssize_t i):
        return (<_Part>parts[k]).keystr(i)
    return path


# Routes that take nothing of the caller's, run first: their failures leave every capsule.
cdef frozenset _TAKES_NOTHING = frozenset([PRODUCER_COPY, NUMPY_COPY, PASS, ARRAY_PUT, ARRAY_COPY])


cdef int _rank(Route route):
    """The order a batch's routes execute in: 0 those that take nothing of the caller's,
    1 the other general routes (a copy may still fail for memory); 2, a leaf without a route
    (a verdict the fast path runs, a split viewed again), is ``_decide``'s."""
    action = route.facts.get("whole", route).action   # (a spread's: the whole tensor's route)
    return 0 if action in _TAKES_NOTHING else 1


cdef list _plain_leaves(x, type tp, list keys, bint text_lists):
    """The values of dict, list or tuple ``x`` in JAX's order (``keys``: a dict's, sorted) where
    each is one leaf: a tensor, a plain scalar or (``text_lists``) a list or tuple of scalars (a
    batch's string ids; a list kept as a new list, as JAX's walk gives); else None."""
    if tp is dict:
        keys.extend(<dict>x)
        try:
            keys.sort()
        except TypeError:
            return None
    cdef list values = [(<dict>x)[k] for k in keys] if tp is dict else list(x)
    cdef Py_ssize_t i
    for i in range(len(values)):
        v = values[i]
        if is_tensor(v) or _plain_scalar(v):
            continue
        tp = type(v)
        if not text_lists or not (tp is list or tp is tuple):
            return None
        for item in v:
            if not _plain_scalar(item):
                return None
        if tp is list:
            values[i] = list(<list>v)
    return values
