"""Works out a DoFn's state and timer specs once per DoFn object instead of at every look.

Apache Beam 2.59 (read in the installed source) asks `apache_beam.transforms.userstate.get_dofn_specs`
for a DoFn's state and timer specs many times over for one pipeline: `ParDo.to_runner_api_parameter`
and `ParDo._signature.is_stateful_dofn` (transforms/core.py lines 1826, 1897), the DirectRunner's
check for stateful DoFns (runners/direct/direct_runner.py line 107), and each `DoFnSignature`
(runners/common.py lines 307, 311, 391, 415), built again for every bundle processor. Each call walks
`dir(dofn)` and wraps every bound method in a `MethodWrapper`, whose `inspect` reading of the
method's signature is the cost: in a small local run of this project's preprocessing (about 250
ParDos) Beam made about 2,400 such calls, a fifth of the run's time (tests/test_beam_transforms.py
and tests/test_preprocess.py ran in 29-32 s with the cache against 39-43 s without, on one host,
one after the other).

No Beam option turns this off, and no later Beam is pinned (requirements.lock), so this module
wraps that one function. The specs are read from the DoFn's bound methods and their default
arguments (`DoFn.StateParam(...)`, `DoFn.TimerParam(...)`), fixed once the DoFn object exists:
the wrapper keeps each DoFn object's answer, keyed by the object itself (a weak reference, so a
DoFn that is gone takes its entry with it, and a new object at the same address is never taken for
it), and calls Beam's function for any object it has not seen. A DoFn whose specs Beam refuses
(duplicate parameters: ValueError) is refused at every call, as before; a DoFn that cannot be
weakly referenced is not cached. Not by type: `beam.Map`'s `CallableWrapperDoFn` reads its
parameters from the function it wraps, so two objects of one type may differ.

`cache_dofn_specs()` is idempotent; `beam_runtime.ensure_local_runner_safe` applies it in every
process of this project that runs Beam, and `components/data_io/beam_worker.py` in each SDK worker
process of a `multi_processing` run.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Dict, Tuple

_lock = threading.Lock()


def _cached(beam_get_dofn_specs: Callable[[Any], Tuple[Any, Any]]) -> Callable[[Any], Tuple[Any, Any]]:
    seen: Dict[int, Tuple[weakref.ref, Tuple[Any, Any]]] = {}

    def get_dofn_specs(dofn):
        key = id(dofn)
        hit = seen.get(key)
        if hit is not None and hit[0]() is dofn:
            return hit[1]
        specs = beam_get_dofn_specs(dofn)  # raises, uncached, for a DoFn Beam refuses
        try:
            ref = weakref.ref(dofn, lambda _gone, key=key: seen.pop(key, None))
        except TypeError:  # no weak references to this object (__slots__ without __weakref__)
            return specs
        seen[key] = (ref, specs)
        return specs

    get_dofn_specs.__doc__ = (beam_get_dofn_specs.__doc__ or "") + (
        "\n  Kept per DoFn object (components/data_io/beam_dofn_specs.py).")
    get_dofn_specs.beam_original = beam_get_dofn_specs  # marks the wrapper, for idempotence and tests
    get_dofn_specs.cached = seen
    return get_dofn_specs


def cache_dofn_specs() -> None:
    """Replaces `apache_beam.transforms.userstate.get_dofn_specs` in this process by a wrapper that
    calls it once per DoFn object (see the module docstring). Idempotent. Beam's own callers,
    `is_stateful_dofn` and `validate_stateful_dofn` among them, look the function up in that module
    at each call, so all of them go through the wrapper."""
    # lazy: keeps Beam off the command line's config path
    from apache_beam.transforms import userstate

    with _lock:
        if not hasattr(userstate.get_dofn_specs, "beam_original"):
            userstate.get_dofn_specs = _cached(userstate.get_dofn_specs)
