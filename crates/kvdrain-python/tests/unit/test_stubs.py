"""The hand-written stubs (`kvdrain/_kvdrain.pyi`) agree with the extension module: the
same names, the same members per class, and the same parameters per method."""

from __future__ import annotations

import ast
import inspect
import pathlib
from typing import Any

import kvdrain
import kvdrain._kvdrain as ext

STUB = pathlib.Path(kvdrain.__file__).with_name("_kvdrain.pyi")
TYPE_ALIASES = {"DecisionKind", "EdgeStateName", "EdgeHow", "FailureCauseName"}


def stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def params(fn: ast.FunctionDef) -> list[tuple[str, str]]:
    a = fn.args
    out = [(p.arg, "positional") for p in a.posonlyargs + a.args]
    out += [(p.arg, "keyword") for p in a.kwonlyargs]
    return out


def runtime_params(obj: Any) -> list[tuple[str, str]]:
    sig = inspect.signature(obj)
    kind: dict[Any, str] = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
    }
    return [(p.name, kind[p.kind]) for p in sig.parameters.values()]


def public(names: set[str]) -> set[str]:
    return {n for n in names if not n.startswith("_") or n in ("__init__", "__len__")}


def test_stubs_name_exactly_what_the_module_exports() -> None:
    names = set()
    for node in stub_tree().body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    runtime = {n for n in dir(ext) if not n.startswith("_") or n == "__version__"}
    assert names - TYPE_ALIASES == runtime


def test_every_class_member_and_signature_agrees() -> None:
    classes = [n for n in stub_tree().body if isinstance(n, ast.ClassDef)]
    assert {c.name for c in classes} == {"Decision", "Ledger", "PushPlan", "Record"}
    for cls in classes:
        rt = getattr(ext, cls.name)
        members = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        rt_members = public(set(vars(rt))) | ({"__init__"} if "__init__" in members else set())
        assert public(set(members)) == rt_members, cls.name
        for name, fn in members.items():
            is_property = any(
                isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list
            )
            if is_property:
                assert inspect.isdatadescriptor(vars(rt)[name]), (cls.name, name)
                continue
            target = rt if name == "__init__" else getattr(rt, name)
            expected = params(fn)
            got = runtime_params(target)
            if name != "__init__":
                assert got[0][0] in ("self", "$self")
            assert expected[1:] == (got if name == "__init__" else got[1:]), (cls.name, name)


def test_every_module_function_signature_agrees() -> None:
    functions = [n for n in stub_tree().body if isinstance(n, ast.FunctionDef)]
    assert {f.name for f in functions} == {"encode_cancel", "parse_cancel", "producers_of"}
    for fn in functions:
        assert params(fn) == runtime_params(getattr(ext, fn.name)), fn.name


def test_package_reexports_the_extension() -> None:
    for name in (
        "Ledger", "Decision", "PushPlan", "TABLE_SIZES", "MAX_EDGES", "encode_cancel",
        "parse_cancel",
    ):
        assert getattr(kvdrain, name) is getattr(ext, name)
    assert set(kvdrain.__all__) <= set(dir(kvdrain))
    assert pathlib.Path(kvdrain.__file__).with_name("py.typed").exists()
