"""The key of an adopted kernel's call in its hits memo (`hits.Hits.memo`): at least as fine as Triton's
cache key, learnt per call layout from its first call remembered (`key_of`), built by hand-unrolled
getters for the common layouts (see `key_of` for the figures)."""
from __future__ import annotations

import operator
from collections.abc import Callable


def key_of(tuner):
    """The key of a call in `Hits.memo`, at least as fine as Triton's cache key (the key arguments'
    values and each tensor argument's dtype, in the order the call passed them). A call's layout is
    how many positional arguments it passed and the names of its keywords, in order (`grid`, `warmup`
    and the launch options are no parameter: Triton keys none of them); each layout's key is learnt
    from its first call remembered (`learn`): the key arguments' values, then the dtypes where that
    call passed tensors, then the types where it passed None (an optional tensor). A call whose
    tensors lie elsewhere than its layout's first call's is never remembered; but one whose scalar (a
    float, an int) stands where its layout's first call had one, and is a tensor or a numpy scalar,
    keys as that call does: a hit then launches the config of a key Triton tells apart by that dtype
    (a known limit: keying every scalar's type costs a hit about a fifth more, or generated code). The key of a call
    passing no keyword is flat: (how many, values, dtypes, types), one layout per kernel (`positional`,
    the hot path); a call passing keywords is keyed (layout, (values, dtypes, types)) (`layouts`).
    IndexError or KeyError where a layout was not learnt, TypeError or AttributeError where a value
    cannot be keyed (a call with no tensor where its layout had one): that call takes Triton's `run`.

    Hand-written (indexing unrolled for up to 4 tensors, a getter beyond) over a general key (every
    argument's `getattr(a, "dtype", None)`, which raises inside for each non-tensor): on the 6-argument
    stub of benchmarks/dispatch_overhead.py a general key costs 0.93 us, `map` over an itemgetter 0.45 us,
    the unrolled one 0.18 us."""
    names = tuner.arg_names
    keyable = all(k in names for k in tuner.keys)  # else a key names no parameter: no call is learnt
    chosen: list = []       # the positional layout's key, once learnt
    layouts: dict = {}      # (how many positional, *keyword names) -> that layout's key of (args, kwargs)

    def learn(args, kwargs):
        """The call's memo key where it can be remembered (its tensors and Nones lie where its layout's
        first did), else None. A layout's key is published once (`list.append`, `dict.setdefault`: one
        step each): threads learning one layout at once all use the one that won."""
        if not keyable:
            return None
        named = _named(kwargs)
        if not named:
            found = (len(args), _where(range(len(args)), args))
            if not chosen:
                positions = [names.index(k) for k in tuner.keys]
                new = _positional_key(positions, *found[1])
                new.found = found
                chosen.append(new)
                if chosen[0] is new:
                    learn.published(positions, *found[1])
            key = chosen[0]
            return key(args) if key.found == found else None
        layout = (len(args), *named)
        params = [k for k in named if k in names]
        found = _where(range(len(args)), args), _where(params, kwargs)
        key = layouts.get(layout)
        if key is None:
            if len(layouts) >= MAX_LAYOUTS or len(set(named)) != len(named):
                return None
            key = layouts.setdefault(layout, _layout_key(tuner, len(args), params, *found))
        return (layout, key(args, kwargs)) if key.found == found else None

    learn.positional, learn.layouts = chosen, layouts
    learn.published = lambda positions, tensors, nones: None   # told the positional key, once (`wrapped_run`)
    return learn


MAX_LAYOUTS = 64   # keyword layouts learnt per kernel


def _named(kwargs: dict) -> tuple:
    """A call's keywords but `grid` and `warmup` (what Triton's launch passes), in order."""
    return tuple(k for k in kwargs if k != "grid" and k != "warmup")


def _where(places, values) -> tuple:
    """(the places of `values` that hold a tensor, those that hold None): one pass (a call's first
    through Triton's path pays it, remembered)."""
    tensors, nones = [], []
    for i in places:
        v = values[i]
        if v is None:
            nones.append(i)
        elif hasattr(v, "dtype"):
            tensors.append(i)
    return tuple(tensors), tuple(nones)


def _layout_key(tuner, count: int, params: list, positional: tuple, named: tuple):
    """(args, kwargs) -> (key values, dtypes, types) for calls of one keyword layout: `count`
    positional arguments, `params` the parameters passed by keyword; `positional` and `named` are
    (tensor places, None places) of its first call. A key argument passed neither way is left out, as
    Triton leaves it out. The keywords' values are read into one tuple after the positional ones, and
    that tuple keyed as positions are (`_places_key`): 0.57 us for the key alone on the stub of
    dispatch_overhead.py, all six arguments by keyword, where a getter and a `map` per part cost 1.32 us
    (timed alone with `timeit` on the 2-core dev machine; the script's keyword line times the whole hit)."""
    index = {n: i for i, n in enumerate(tuner.arg_names)}
    place = {**{i: i for i in range(count)}, **{index[p]: count + j for j, p in enumerate(params)}}
    values = [place[index[k]] for k in tuner.keys if index[k] in place]
    tensors = positional[0] + tuple(count + params.index(p) for p in named[0])
    nones = positional[1] + tuple(count + params.index(p) for p in named[1])
    inner, passed = _places_key(values, tensors, nones), _getter(params)

    def key(a, k):
        return inner((*a, *passed(k)))
    key.found = positional, named
    return key


def _places_key(values: list, tensors: tuple, nones: tuple) -> Callable[[tuple], tuple]:
    """c -> (the values at `values`, the dtypes at `tensors`, the types at `nones`), unrolled for up to
    4 tensors and no None."""
    v = _getter(values)
    if nones or len(tensors) > 4:
        tensor_getter, none_getter, dtype_of = _getter(tensors), _getter(nones), operator.attrgetter("dtype")
        return lambda c: (v(c), *map(dtype_of, tensor_getter(c)), *map(type, none_getter(c)))
    if not tensors:
        return v
    if len(tensors) == 1:
        (i,) = tensors
        return lambda c: (v(c), c[i].dtype)
    if len(tensors) == 2:
        i, j = tensors
        return lambda c: (v(c), c[i].dtype, c[j].dtype)
    if len(tensors) == 3:
        i, j, k = tensors
        return lambda c: (v(c), c[i].dtype, c[j].dtype, c[k].dtype)
    i, j, k, m = tensors
    return lambda c: (v(c), c[i].dtype, c[j].dtype, c[k].dtype, c[m].dtype)


def _positional_key(positions: list, tensors: tuple, nones: tuple) -> Callable[[tuple], tuple]:
    """args -> (how many, the key arguments' values, the dtypes at `tensors`, the types at `nones`);
    unrolled for one key argument and up to 4 tensors (see `key_of`)."""
    if nones or len(tensors) > 4 or len(positions) != 1:
        values, tensor_getter, none_getter = _getter(positions), _getter(tensors), _getter(nones)
        dtype_of = operator.attrgetter("dtype")
        return lambda a: (len(a), values(a), *map(dtype_of, tensor_getter(a)), *map(type, none_getter(a)))
    (p,) = positions
    if not tensors:
        return lambda a: (len(a), a[p])
    if len(tensors) == 1:
        (i,) = tensors
        return lambda a: (len(a), a[p], a[i].dtype)
    if len(tensors) == 2:
        i, j = tensors
        return lambda a: (len(a), a[p], a[i].dtype, a[j].dtype)
    if len(tensors) == 3:
        i, j, k = tensors
        return lambda a: (len(a), a[p], a[i].dtype, a[j].dtype, a[k].dtype)
    i, j, k, m = tensors
    return lambda a: (len(a), a[p], a[i].dtype, a[j].dtype, a[k].dtype, a[m].dtype)


def _getter(positions) -> Callable[[tuple], tuple]:
    """args (or kwargs) -> a tuple of the values at `positions` (indexes or names; one: that value
    twice, so that the getter stays a C itemgetter); IndexError (KeyError) where one is missing."""
    if not positions:
        return lambda args: ()
    return operator.itemgetter(*positions) if len(positions) > 1 else operator.itemgetter(positions[0], positions[0])
