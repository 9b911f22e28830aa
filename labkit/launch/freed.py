"""Arrays freed, and new ones put where they were: what a cache keyed by ``id()`` of an array mistakes for the old.

A kernel built around a weight array (stages 06 and 09: numba's constant memory bakes the weights in) is kept per
array. A cache keyed by ``id(w)`` that does not keep ``w`` alive hands the kernel of freed weights to the next array
that CPython puts at the same address, as it does with a freed object's memory: a workload's new weights often land
there (``labkit.const_kernels.PerWeights`` keeps ``w``, so its ids stay its own). The checks hand every call new
objects, but the order in which CPython reuses their memory rarely put new weights exactly where old ones were, so
such a cache passed them. ``Held`` makes it happen: one call's arrays are kept, and a later call's arrays are handed
on as new objects (views of the same memory, its own values) at the addresses of the kept ones, freed just before.

A freed object's memory is sure to go only to the next object of its size class made with nothing else of that class
made first, and which objects share a class is the allocator's to say (a dict, a list, a bound method, an iterator,
an instance's attribute values). So a device array (a Python class: numba's, the simulator's) is not made there by
its ``reshape``, which makes such objects first: a bare object of its class takes the freed memory, made with nothing
else, and is given a new view's attributes (``_filled``).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence

#: objects made at most to find a freed address again (each a view: microseconds)
TRIES = 2048
#: bare objects of an array's class made at most first (each only its memory, a few dozen bytes, in a tenth of a
#: microsecond): they use up the free memory CPython hands out before the freed addresses (other pools' first)
BARE_TRIES = 1 << 18
#: views made at most to put a kept array beside another object of its size (``_placed``)
PIN_TRIES = 16
#: the smallest block of memory CPython's allocator gives to objects of one size: a pool is one or more of these
PAGE_BITS = 12
#: instances of a device array's class made and dropped before its arrays' memory is reserved (``_settled``): more
#: than the ones CPython 3.11 shrinks a class's attribute values array over (one slot fewer each, from at most 30)
SETTLE = 32


def _placed(make: Callable[[], object]) -> tuple[object, list]:
    """``make()``'s object and the objects to hold while it lives: one of its size in the same pool of memory, so
    that freeing it does not empty the pool (an empty pool goes back to be reused for any size, and its address is
    then out of reach of a new object of this size)."""
    pins = [make()]
    obj = make()
    for _ in range(PIN_TRIES):
        if id(obj) >> PAGE_BITS == id(pins[-1]) >> PAGE_BITS:
            break
        pins.append(obj)
        obj = make()
    return obj, pins


def _reserve(cls: type, addresses: set[int], found: dict, spare: list) -> bool:
    """Bare objects of ``cls`` (no ``__init__``) made until each of ``addresses`` holds one, into ``found`` (address ->
    that object, which keeps the memory there from anything else until it is let go; an address none reached is in
    use: its memory went to other objects). The others made go to ``spare``, to hold until the new arrays are made
    (freed now, they would be handed out first again). False where ``cls`` cannot be made bare (a C type: numpy's).
    Nothing it makes outlives a turn of its loop but those objects (a ``for`` loop's iterator would, and could take a
    freed array's memory: with the allocator's debug hooks a range iterator is of a device array's size): the freed
    memory goes to them."""
    left, tries = len(addresses), BARE_TRIES
    try:
        while tries:
            tries -= 1
            obj = object.__new__(cls)
            if id(obj) in addresses:
                found[id(obj)] = obj
                left -= 1
                if not left:
                    break
            else:
                spare.append(obj)
    except TypeError:
        return False
    return True


def land(address: int, make: Callable[[], object], tries: int = TRIES):
    """An object of ``make()`` at ``address`` (a freed object's id: CPython hands a freed object's memory to the next
    object of its size), or None when none of ``tries`` was; the others made are freed again. For a C type (numpy's,
    cupy's), which cannot be made bare (``_fillable``)."""
    made = []
    for _ in range(tries):
        obj = make()
        if id(obj) == address:
            return obj
        made.append(obj)
    return None


def _view(a):
    """``a`` as a new object: a view of the same memory, same shape (numpy, numba and cupy arrays)."""
    return a.reshape(a.shape)


def _fillable(cls: type) -> bool:
    """Whether an object of ``cls`` is made by ``object.__new__`` and is all in its ``__dict__`` (numba's device arrays,
    the simulator's): a bare one given a view's ``__dict__`` is then that view, wherever the bare one was put."""
    slots = any("__slots__" in vars(c) for c in cls.__mro__)
    return cls.__new__ is object.__new__ and cls.__dictoffset__ != 0 and not slots


def _settled(cls: type) -> type:
    """``cls``, its instances' attribute values array at its final size: CPython 3.11 gives each new instance a smaller
    one, down to what its attributes take, and one of those sizes is the instance's own size class (the simulator's
    24th instance: 56 bytes, as the instance); made in ``_reserve``, it would take a freed array's memory."""
    for _ in range(SETTLE):
        object.__new__(cls)
    return cls


def _filled(bare, view):
    """``bare`` (at a freed array's address) as ``view``: the same attributes, so the same memory and values."""
    vars(bare).update(vars(view))
    return bare


def _is_array(a) -> bool:
    return hasattr(a, "reshape") and hasattr(a, "shape")


def _weak(a):
    try:
        return weakref.ref(a)
    except TypeError:  # a type without weak references: whether it was freed is not known, so it is tried
        return lambda: None


class Held:
    """The arrays of one call, kept alive until a later call's take their places (``swap``)."""

    def __init__(self):
        self.arrays: tuple | None = None
        self.pins: list = []  # objects that keep the kept arrays' memory reachable once they are freed
        self.landed = 0  # arrays handed on at a freed one's address, in all

    def keep(self, arrays: Sequence) -> list:
        """``arrays`` kept, each as a new view (``_placed``: its address stays reachable once it is freed); the views,
        to hand on in their place."""
        arrays = list(arrays)
        for i, a in enumerate(arrays):
            if _is_array(a):
                arrays[i], pins = _placed(lambda: _view(a))
                self.pins += pins
        self.arrays = tuple(arrays)
        return arrays

    def swap(self, arrays: Sequence) -> list:
        """``arrays`` handed on, each at the address of the kept array in its place if letting that one go freed
        it (an array something else holds, as ``PerWeights`` holds ``w``, keeps its address: the new one gets
        another); the new ones are kept in turn. Nothing kept yet: they are kept (``keep``)."""
        if self.arrays is None:
            return self.keep(arrays)
        collecting = gc.isenabled()
        gc.disable()  # a collection now would free other objects' memory onto the freed arrays' (it runs after)
        try:
            return self._swap(list(arrays))
        finally:
            if collecting:
                gc.enable()

    def _swap(self, arrays: list) -> list:
        old, self.arrays = self.arrays, None
        places = [(i, id(a), _weak(a)) for i, a in enumerate(old[:len(arrays)]) if _is_array(arrays[i])]
        addresses = {address for _, address, _ in places}
        # all made before the old arrays go, what is walked after too (its iterators): an object of their size made
        # between their going and the reserving of their memory (a dict, a list, a tuple, an iterator, a view) could
        # take it, and which objects share their size class is the allocator's to say
        views = {i: _view(arrays[i]) for i, _, _ in places if _fillable(type(arrays[i]))}
        kinds = iter([_settled(cls) for cls in {type(arrays[i]) for i, _, _ in places} if _fillable(cls)])
        checks = iter([(address, ref) for _, address, ref in places])
        reserved, spare, held_on = {}, [], False
        del old
        for address, ref in checks:
            if ref() is not None:  # kept by something else (PerWeights keeps w): its address stays its own
                addresses.discard(address)
                held_on = True
        if held_on:
            gc.collect()  # one held in a cycle is freed now (the memory of other objects freed with it too)
            addresses.update(address for _, address, ref in places if ref() is None)
        for cls in kinds:
            _reserve(cls, addresses, reserved, spare)
        for i, address, _ in places:
            new = arrays[i]
            if address not in addresses:
                continue  # still in use, by what kept the old array
            if i in views:
                bare = reserved.get(address)
                if type(bare) is type(new):  # else its memory went to other objects before it was reserved
                    arrays[i] = _filled(bare, views.pop(i))
                    self.landed += 1
                continue
            # a C type: one made and freed first: what making one makes besides it (a call's dict, its tuples) then
            # comes from CPython's free lists, not from the memory given back, which the next object of its size gets
            land(0, lambda: _view(new), tries=1)
            found = land(address, lambda: _view(new))
            if found is not None:
                arrays[i] = found
                self.landed += 1
        self.arrays = tuple(arrays)
        return arrays


class Pair:
    """A layer function whose calls' input arrays (its first ``inputs`` arguments: x, w and b) can be kept until a
    later call gets its own at their addresses: ``keep(tag)`` keeps the next call's (``Held.keep``), ``land(tag)``
    hands the next call its own where those kept under ``tag`` were, freed just before (``Held.swap``). Every other
    call is passed through."""

    def __init__(self, fn: Callable, inputs: int = 3):
        self.fn, self.inputs = fn, inputs
        self.held: dict = {}  # tag -> Held
        self._next: tuple | None = None

    def keep(self, tag) -> None:
        self._next = ("keep", tag)

    def land(self, tag) -> None:
        self._next = ("swap", tag)

    def __call__(self, *args):
        if self._next is not None:
            (what, tag), self._next = self._next, None
            held = self.held.setdefault(tag, Held())
            n = self.inputs
            args = (*getattr(held, what)(args[:n]), *args[n:])
        return self.fn(*args)
