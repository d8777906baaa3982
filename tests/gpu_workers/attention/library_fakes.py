"""Fakes of the CUDA attention libraries whose calls are bound to the real signatures.

library_signatures.json holds the parameters of every library function the backends call, read
from the published source at the versions pyproject pins (read_library_signatures.py regenerates
it). A fake built here accepts exactly those parameters: each call goes through
inspect.Signature.bind first, so a keyword the library does not have (renamed or removed), a
missing required argument or one positional too many is a TypeError, as on the GPU. Only then
does the fake's own code (the kernel's contract in plain torch) see the call, as one dict of
every parameter by name, defaults applied.

    sigs = load_signatures()
    varlen = fake_function(sigs, "flash_attn", "flash_attn_varlen_func", impl)  # impl(args: dict) -> Tensor
    Wrapper = fake_class(sigs, "flashinfer", "BatchDecodeWithPagedKVCacheWrapper", Impl)
        # Impl's methods named in the fixture (__init__, plan, run) take (self, args: dict); one it
        # lacks binds its call, then raises NotImplementedError
    module = fake_module("flashinfer", BatchPrefillWithPagedKVCacheWrapper=Wrapper)  # for sys.modules

A test that edits the loaded signatures (rename_parameter) and builds its fakes from the
edited copy shows that a backend's call fails when the library's parameter changes.
"""

from __future__ import annotations

import ast
import copy
import inspect
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).with_name("library_signatures.json")

Signatures = dict[str, Any]  # library -> {"version", "source", "functions": {qualname: {"file", "params"}}}


def load_signatures(path: Path = FIXTURE) -> Signatures:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _default(text: str | None) -> Any:
    if text is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(text)
    except ValueError:  # a module constant (DEFAULT_FA_VERSION): its name stands for it
        return text


def signature(sigs: Signatures, library: str, qualname: str) -> inspect.Signature:
    try:
        params = sigs[library]["functions"][qualname]["params"]
    except KeyError:
        raise KeyError(f"{library}.{qualname} is not in the recorded signatures") from None
    return inspect.Signature(
        [inspect.Parameter(p["name"], getattr(inspect.Parameter, p["kind"]), default=_default(p["default"])) for p in params]
    )


def bind(sig: inspect.Signature, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Every parameter by name, defaults applied; TypeError where the library would raise one."""
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def fake_function(sigs: Signatures, library: str, qualname: str, impl: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    sig = signature(sigs, library, qualname)

    def call(*args: Any, **kwargs: Any) -> Any:
        return impl(bind(sig, *args, **kwargs))

    call.__signature__ = sig  # type: ignore[attr-defined]
    call.__name__ = qualname
    return call


def fake_class(sigs: Signatures, library: str, class_name: str, impl: type) -> type:
    """A subclass of impl whose recorded methods bind their calls first; impl's method gets
    (self, args) with args lacking "self". A recorded method impl lacks binds, then raises
    NotImplementedError."""
    namespace: dict[str, Any] = {}
    prefix = class_name + "."
    for qualname in sigs[library]["functions"]:
        if not qualname.startswith(prefix):
            continue
        method = qualname[len(prefix) :]
        namespace[method] = _bound_method(signature(sigs, library, qualname), getattr(impl, method, None), qualname)
    return type(class_name, (impl,), namespace)


def _bound_method(sig: inspect.Signature, impl: Callable[..., Any] | None, qualname: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        arguments = bind(sig, self, *args, **kwargs)
        del arguments["self"]
        if impl is None:  # the library has it, this fake does not compute it
            raise NotImplementedError(f"the fake {qualname} is not implemented")
        return impl(self, arguments)

    method.__signature__ = sig  # type: ignore[attr-defined]
    return method


def fake_module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def rename_parameter(sigs: Signatures, library: str, qualname: str, old: str, new: str) -> Signatures:
    """A copy of sigs in which the library's parameter `old` is called `new`."""
    edited = copy.deepcopy(sigs)
    params = edited[library]["functions"][qualname]["params"]
    (p,) = [p for p in params if p["name"] == old]
    p["name"] = new
    return edited


def remove_parameter(sigs: Signatures, library: str, qualname: str, name: str) -> Signatures:
    edited = copy.deepcopy(sigs)
    fn = edited[library]["functions"][qualname]
    fn["params"] = [p for p in fn["params"] if p["name"] != name]
    return edited
