"""Turn functions, arguments, results and exceptions into payload frames and back.

Used only by clients and worker processes, never by the broker. Payloads are pickle
protocol 5 with out-of-band buffers: frame 0 is the pickle stream, every further frame is
a large buffer exposed through pickle.PickleBuffer (a NumPy array's memory, say) sent as its
own zero-copy frame. A large bytes or bytearray argument is one too, at the end (see
``_TaskPickler``): a bytes value is the frame itself, no copy made on the client.
Futures inside a task's arguments, however deeply nested, are pickled as a reference to
their position in the task's dependency list, and replaced by their results on the worker.
"""

from __future__ import annotations

import ctypes
import io
import mmap
import pickle
import sys
import threading
import traceback
import types
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import cloudpickle

from . import objects as O
from .errors import RemoteError, RemoteTraceback
from .protocol import Frame, buffer

# Buffers smaller than this are cheaper to keep inside the pickle stream.
_OOB_MIN = 64 * 1024
# Arguments of only these types (the common case of map over numbers or names) are
# pickled by the standard library's C pickler, ten times faster than a cloudpickle
# Pickler: they hold no future, nothing defined in __main__, nothing to copy (but a
# large bytes value: see _plain).
_PLAIN = frozenset({int, float, str, bytes, bool, type(None), complex})
# A large bytes or bytearray argument, sent as a frame of its own: the persistent id's tag
# says which type the task gets.
_VALUES: dict[str, type] = {"zres.bytes": bytes, "zres.bytearray": bytearray}
_TAGS = {kind: tag for tag, kind in _VALUES.items()}
# Bytes copied out of a mapped file between giving its pages back (see _value_of).
_RELEASE = 4 << 20


def _plain(values: Any) -> bool:
    """Whether VALUES are all of _PLAIN types, none a bytes value to send out of band."""
    for value in values:
        kind = type(value)
        if kind not in _PLAIN or (kind is bytes and len(value) >= _OOB_MIN):
            return False
    return True


def _buffer_callback(frames: list[Any], snapshot: bool = False
                     ) -> Callable[[pickle.PickleBuffer], bool]:
    """Collect large buffers as frames. SNAPSHOT copies writable ones: a task's arguments
    must not change if the caller writes to its array after submit() returns."""
    def keep(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < _OOB_MIN:
            return True  # serialise in band
        frames.append(bytes(raw) if snapshot and not raw.readonly else raw)
        return False
    return keep


class _TaskPickler(cloudpickle.Pickler):
    """Pickles part of a call, writing each dependency (a Future) as its index in DEPS.

    With FRAMES (a call's arguments), a bytes or bytearray of _OOB_MIN bytes or more is
    written as a reference to a frame of its own, kept in VALUES: pickle copies such a
    value into its stream (it is no PickleBuffer, and the C pickler saves it before any
    reducer_override is asked), a second copy of a file read into memory, say. VALUES go
    after every out-of-band buffer, last first, so that the buffers the pickle stream reads
    in order (NEXT_BUFFER) stay where they were, and value J is the frame -1 - J.
    """

    def __init__(self, file: io.BytesIO, dep_type: type, frames: list[Any] | None,
                 deps: list[Any], index: dict[int, int]) -> None:
        callback = _buffer_callback(frames, snapshot=True) if frames is not None else None
        super().__init__(file, protocol=5, buffer_callback=callback)
        self.dep_type = dep_type
        self.deps = deps
        self.index = index
        self.values: list[Any] | None = [] if frames is not None else None
        # (a value passed twice goes once, and is one object on the worker, as in band;
        # persistent ids are asked for before pickle's memo is looked at)
        self._sent: dict[int, tuple[str, int]] = {}

    def persistent_id(self, obj: Any) -> Any:
        tag = _TAGS.get(type(obj))
        if tag is not None and self.values is not None and len(obj) >= _OOB_MIN:
            pid = self._sent.get(id(obj))
            if pid is None:
                # (a bytearray copied: the caller may change it after submit returns)
                self.values.append(obj if tag == "zres.bytes" else bytes(obj))
                pid = self._sent[id(obj)] = (tag, len(self.values) - 1)
            return pid
        if not isinstance(obj, self.dep_type):
            return None
        if id(obj) not in self.index:
            self.index[id(obj)] = len(self.deps)
            self.deps.append(obj)
        return ("zres.dep", self.index[id(obj)])


# Functions pickled recently, as Dask's client and Ray's driver keep them: cloudpickle
# pickles a function defined in a script by value, its globals and closure with it, which
# costs 100-300 us a submit. So a function is pickled at its first submit of the process,
# as it is then; a change to what it closes over after that does not reach later tasks
# (as in Dask and Ray). ``forget_functions`` (shipping a module) empties it.
_FUNCTIONS: OrderedDict[Callable[..., Any], bytes] = OrderedDict()
_FUNCTIONS_LOCK = threading.Lock()  # (clients submit from any thread)


def forget_functions() -> None:
    """Pickle every function afresh (how some are pickled has changed)."""
    with _FUNCTIONS_LOCK:
        _FUNCTIONS.clear()


class CallPickler:
    """Pickle calls into payload frames: [function, arguments, out-of-band buffers...].

    The function is its own frame so that ``map`` pickles it once for all its tasks and
    workers can keep unpickled functions in a cache keyed by those bytes.
    """

    def __init__(self, dep_type: type) -> None:
        self.dep_type = dep_type

    def function(self, fn: Callable[..., Any], deps: list[Any], index: dict[int, int]) -> bytes:
        """FN pickled: once per process for a plain function (see ``_FUNCTIONS``)."""
        plain = type(fn) is types.FunctionType
        if plain:
            with _FUNCTIONS_LOCK:
                cached = _FUNCTIONS.get(fn)
                if cached is not None:
                    _FUNCTIONS.move_to_end(fn)
                    return cached
        buf = io.BytesIO()
        found = len(deps)
        try:
            _TaskPickler(buf, self.dep_type, None, deps, index).dump(fn)
        except Exception as exc:
            kind = "class" if isinstance(fn, type) else "function"
            raise _unpicklable(exc, f"the {kind} {_name_of(fn)} cannot be pickled to be "
                                    "sent") from exc
        data = buf.getvalue()
        # (a function closing over futures is its tasks' own: never shared)
        if plain and len(deps) == found and len(data) < 100_000:
            with _FUNCTIONS_LOCK:
                _FUNCTIONS[fn] = data
                if len(_FUNCTIONS) > 128:
                    _FUNCTIONS.popitem(last=False)
        return data

    def call(self, fn_frame: bytes, args: tuple[Any, ...], kwargs: dict[str, Any],
             deps: list[Any], index: dict[int, int], what: str = "a call") -> list[Frame]:
        """ARGS and KWARGS pickled after FN_FRAME; WHAT (the function) names them in errors."""
        if _plain(args) and _plain(kwargs.values()):
            return [fn_frame, pickle.dumps((args, kwargs), protocol=5)]
        buf = io.BytesIO()
        frames: list[Any] = []
        pickler = _TaskPickler(buf, self.dep_type, frames, deps, index)
        try:
            pickler.dump((args, kwargs))
        except Exception as exc:
            raise _unpicklable(exc, f"the arguments of {what} cannot be pickled to be "
                                    "sent") from exc
        assert pickler.values is not None
        return [fn_frame, buf.getvalue(), *frames, *reversed(pickler.values)]


    def calls(self, fn_frame: bytes, iterables: tuple[Iterable[Any], ...],
              kwargs: dict[str, Any], fn_deps: list[Any], fn_index: dict[int, int],
              what: str, check: Callable[[list[Any]], Any]) -> list[tuple[list[Frame], list]]:
        """Every call of a map over zipped ITERABLES pickled, with its inputs (each list
        passed to CHECK): all of them before any is submitted, and an item that cannot be
        named by its index, saying none was."""
        calls = []
        for i, args in enumerate(zip(*iterables)):
            deps, index = list(fn_deps), dict(fn_index)
            try:
                frames = self.call(fn_frame, args, kwargs, deps, index, what)
                check(deps)
            except Exception as exc:
                raise _unpicklable(exc, f"map(): item {i}", str(exc) + "; no task of the map "
                                   "was submitted") from (exc.__cause__ or exc)
            calls.append((frames, deps))
        return calls


class _TaskUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, values: Sequence[Any], buffers: Sequence[Any]) -> None:
        super().__init__(file, buffers=[memoryview(b) for b in buffers])
        self._values = values
        self._buffers = buffers
        self._made: dict[int, Any] = {}
        self.used_deps = False

    def persistent_load(self, pid: Any) -> Any:
        tag, index = pid
        if tag in _VALUES:  # (a bytes or bytearray value's frame: see _TaskPickler)
            value = self._made.get(index)
            if value is None:
                value = self._made[index] = _value_of(self._buffers[-1 - index], _VALUES[tag])
            return value
        if tag != "zres.dep":
            raise pickle.UnpicklingError(f"unknown persistent id {tag!r}")
        self.used_deps = True
        return self._values[index]


def _value_of(frame: Any, kind: type) -> Any:
    """FRAME (a buffer) as a new KIND (bytes or bytearray) object: its bytes copied once, or
    not at all where FRAME is a bytes object and KIND bytes."""
    if kind is bytes and type(frame) is bytes:
        return frame
    view = memoryview(frame).cast("B")
    mapped = view.obj
    if not isinstance(mapped, mmap.mmap) or view.readonly or view.nbytes <= _RELEASE \
            or (kind is bytes and not O.BYTES_DATA):
        return kind(view)
    # A call too big to travel inline is read from its agent's store, a mapping of a file
    # in shared memory: each page read would stay resident in this process, counted (in
    # VmRSS, which the agent's memory guard watches) beside the copy, twice the value in
    # all. So each page is given back as soon as it is copied (it is the file's, never
    # written: read again, it is the same).
    value: Any
    if kind is bytes:
        value, into = O.new_bytes(view.nbytes)
    else:
        value = bytearray(view.nbytes)
        into = memoryview(value)
    start = _address(view) - _address(mapped)
    page = mmap.PAGESIZE
    done = -(-start // page) * page  # (the pages before are partly another frame's)
    for at in range(0, view.nbytes, _RELEASE):
        end = min(at + _RELEASE, view.nbytes)
        into[at:end] = view[at:end]
        upto = (start + end) // page * page
        if upto > done:
            mapped.madvise(mmap.MADV_DONTNEED, done, upto - done)
            done = upto
    return value


def _address(data: Any) -> int:
    """Where DATA's (a writable buffer's) memory starts."""
    return ctypes.addressof(ctypes.c_char.from_buffer(data))


class CallLoader:
    """Rebuild calls on a worker, keeping recently used functions unpickled."""

    def __init__(self, cache_size: int = 256) -> None:
        self._cache: dict[bytes, Any] = {}
        self._cache_size = cache_size

    def load(self, frames: Sequence[Frame], dep_values: Sequence[Any]) -> Any:
        """Return (fn, args, kwargs) with each dependency replaced by its value."""
        key = bytes(buffer(frames[0]))
        fn = self._cache.get(key)
        if fn is None:
            unpickler = _TaskUnpickler(io.BytesIO(key), dep_values, ())
            fn = unpickler.load()
            if not unpickler.used_deps:  # a function closing over futures differs per task
                if len(self._cache) >= self._cache_size:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = fn
        if not dep_values and len(frames) == 2:  # nothing to put in place: the C unpickler
            args, kwargs = pickle.loads(buffer(frames[1]))
        else:
            args, kwargs = _TaskUnpickler(io.BytesIO(buffer(frames[1])), dep_values,
                                          frames[2:]).load()
        return fn, args, kwargs


def dumps(obj: Any) -> list[Frame]:
    """Pickle a result; large buffers become their own frames."""
    if type(obj) is bytes and len(obj) >= _OOB_MIN:
        # Large bytes (a file, an encoded image) would be copied into the pickle stream:
        # sent as they are instead, after an empty frame (no pickle stream is empty).
        return [b"", obj]
    frames: list[Any] = []
    try:
        # The C pickler first: it refuses (rather than mis-pickles) what only cloudpickle
        # can do, such as a lambda or a class made at run time, checking that every class
        # and function it names by reference can be found again by that name.
        head = pickle.dumps(obj, protocol=5, buffer_callback=_buffer_callback(frames))
    except Exception:
        frames = []
        head = cloudpickle.dumps(obj, protocol=5, buffer_callback=_buffer_callback(frames))
    return [head, *frames]


def dumps_result(value: Any, fn: Any, task_id: int, agent: str) -> list[Frame]:
    """VALUE, the result of task TASK_ID (of FN, on AGENT), pickled to be sent back; if it
    cannot be, an error of the same type that says it was the result, of which task, where."""
    try:
        return dumps(value)
    except Exception as exc:
        raise _unpicklable(exc, f"the result of task {task_id} ({_name_of(fn)}) on agent "
                                f"{agent} cannot be pickled to be sent back") from exc


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn)


def _unpicklable(exc: Exception, what: str, words: str | None = None) -> Exception:
    """The pickler's error EXC, of its own type (what users catch), saying WHAT failed
    (and WORDS, if given, in place of EXC's type and text)."""
    why = f"{what}: {type(exc).__name__}: {exc}" if words is None else f"{what}: {words}"
    try:
        return type(exc)(why)
    except Exception:  # an error class that takes other arguments
        return RuntimeError(why)


def missing_module_note(name: str, agent: str) -> str:
    """A note for a ModuleNotFoundError of NAME raised on AGENT: how to get it there."""
    top = name.partition(".")[0]
    return (f"zres: module {top!r} cannot be imported on agent {agent} ({sys.executable}): "
            "install it there, or, if it is your own code, send it with the task: "
            f"zres.Client(modules=[{top}]) or client.ship({top})")


def loads(frames: Sequence[Frame]) -> Any:
    """Rebuild a result pickled by dumps."""
    head = buffer(frames[0])
    if not len(head) and len(frames) == 2:
        if type(frames[1]) is bytes:  # (made for it: objects.ObjectBuffer)
            return frames[1]
        return bytes(buffer(frames[1]))
    return pickle.loads(head, buffers=[memoryview(f) for f in frames[1:]])


def dumps_exception(exc: BaseException) -> list[Frame]:
    """Pickle an exception with its traceback text; fall back to a RemoteError.

    The exception is pickled on its own, inside: one that pickles but cannot be rebuilt
    where it is read (an ``__init__`` taking other arguments than ``args``, a class whose
    module is not there) still gives its type, words and traceback."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    words = "".join(traceback.format_exception_only(type(exc), exc)).strip()  # (a bad str())
    try:
        inner = cloudpickle.dumps(exc, protocol=5)
    except Exception:
        inner = cloudpickle.dumps(RemoteError(f"{words} (the exception could not be pickled)"),
                                  protocol=5)
    return [pickle.dumps((inner, tb, words), protocol=5)]


def loads_exception(frames: Sequence[Frame]) -> BaseException:
    """Rebuild an exception, chaining the remote traceback as its cause."""
    try:
        outer = pickle.loads(buffer(frames[0]))
    except Exception as err:
        return RemoteError(f"a task raised an exception that cannot be unpickled here: {err!r}")
    if len(outer) == 2:  # (kept by a broker of an earlier version: the exception itself)
        exc, tb = outer
    else:
        inner, tb, words = outer
        try:
            exc = pickle.loads(inner)
        except Exception as err:
            exc = RemoteError(f"the task raised {words}, an exception that cannot be "
                              f"unpickled here: {err!r}")
    exc.__cause__ = RemoteTraceback(tb)
    return exc
