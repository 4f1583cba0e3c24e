"""The agent's source: each module and the one source it is shipped as are Python 3.6, the bundle
holds every module of the package in an order that runs and binds no name twice, and the fields
codec of its spec and START commands round-trips what a shell could not carry."""

from __future__ import annotations

import ast

import pytest

from launcher.agent.protocol import encode_fields
from launcher.transports.shipping import (AGENT_PACKAGE, agent_modules, agent_source, bundle, remote_agent_argv,
                                         stdin_agent_argv)

pytestmark = pytest.mark.unit


def load_agent_module():
    """The shipped source run as a module: its names, without running the agent."""
    namespace: dict = {"__name__": "agent_under_test"}
    exec(compile(agent_source(), "tflaunch-agent", "exec"), namespace)
    return namespace


# -- the spec ----------------------------------------------------------------------------------

def test_fields_round_trip_awkward_values():
    decode = load_agent_module()["decode_fields"]
    argv = ["a b", "", "it's \"x\" $(y) `z`", "é\n\t"]
    env = {"A": "", "B": "x=y=z", "C": "line\nbreak"}
    fields = decode(encode_fields({"name": "w-0", "argv": argv, "env": env, "cwd": "/tmp/a b", "grace": 2.5}))
    assert fields["argv"] == argv and fields["env"] == env and fields["cwd"] == "/tmp/a b" and fields["grace"] == "2.5"


def test_fields_refuse_a_nul_character():
    with pytest.raises(ValueError, match="NUL"):
        encode_fields({"argv": ["a\0b"]})


# -- the source shipped -------------------------------------------------------------------------

def test_agent_source_is_python_3_6_syntax():
    # The bundle as shipped, every module of the package, and each boot that runs the bundle.
    ast.parse(agent_source(), feature_version=(3, 6))
    for path in AGENT_PACKAGE.glob("*.py"):
        ast.parse(path.read_text(), feature_version=(3, 6), filename=str(path))
    for argv in (remote_agent_argv("python3"), stdin_agent_argv("python3")):
        ast.parse(argv[4], feature_version=(3, 6))


def top_level(body: list[ast.stmt]):
    """A module's top-level statements, those under a top-level ``try`` or ``if`` too."""
    for node in body:
        if isinstance(node, ast.Try):
            yield from top_level(node.body + [s for h in node.handlers for s in h.body] + node.orelse + node.finalbody)
        elif isinstance(node, ast.If):
            yield from top_level(node.body + node.orelse)
        else:
            yield node


def clashes(modules: dict[str, str]) -> list[str]:
    """Top-level names that two of ``modules`` (name: source) bind, which the bundle would make one:
    a definition, an assignment, or different imports of one name (the same imports in both are
    harmless). What a module imports from another module of the package is left out."""
    first: dict[str, tuple[str, set[str]]] = {}  # name -> (the first module to bind it, how it binds it)
    found = []
    for module, text in modules.items():
        hows: dict[str, set[str]] = {}  # name -> "defined" or the source of each import that binds it
        for node in top_level(ast.parse(text).body):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [(alias.asname or alias.name.split(".")[0], ast.unparse(node)) for alias in node.names]
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [(node.name, "defined")]
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [(n.id, "defined") for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            else:
                continue
            for name, how in names:
                hows.setdefault(name, set()).add(how)
        for name, how in hows.items():
            owner, first_how = first.setdefault(name, (module, how))
            if owner != module and ("defined" in how or how != first_how):
                found.append(f"{name}: {owner}.py and {module}.py")
    return found


def without_block_docstrings(tree: ast.Module) -> ast.Module:
    """``tree`` with the docstring of every function and class body that has more after it taken out."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and len(node.body) > 1 \
                and ast.get_docstring(node, clean=False) is not None:
            node.body = node.body[1:]
    return tree


def test_the_bundle_is_the_package_with_no_name_defined_twice():
    modules = agent_modules()
    order = list(modules)
    assert set(order) == {p.stem for p in AGENT_PACKAGE.glob("*.py")} - {"__init__"}
    assert order[-1] == "loop" and modules["loop"].rstrip().endswith("main()")  # last: the bundle runs it
    for module, text in modules.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level:
                # Only at the top level (the bundle takes out no other), from a module before it.
                assert node.col_offset == 0 and order.index(node.module) < order.index(module), (module, node.lineno)
    assert clashes(modules) == []
    # None of the package's imports and docstrings is left in the bundle, and nothing else was taken out.
    shipped = ast.parse(agent_source())
    assert not [n for n in ast.walk(shipped) if isinstance(n, ast.ImportFrom) and n.level]
    assert ast.get_docstring(shipped) is None
    kept = [ast.dump(n) for text in modules.values() for n in without_block_docstrings(ast.parse(text)).body[1:]
            if not (isinstance(n, ast.ImportFrom) and n.level)]
    assert all(ast.get_docstring(ast.parse(text)) for text in modules.values())
    assert [ast.dump(n) for n in shipped.body] == kept
    # A docstring alone in its body stays (the body needs a statement); every other one is gone.
    assert all(len(n.body) == 1 for n in ast.walk(shipped)
               if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(n) is not None)
    # Nor a line that is only a comment, but the one naming where each module starts: the srun
    # command line carries the source whole.
    assert [line for line in agent_source().splitlines() if line.lstrip().startswith("#")] == \
        [f"# -- {name}.py" for name in modules]


def test_a_name_bound_in_two_modules_is_caught():
    # The checks above on a broken copy: a constant defined twice, one name imported two ways.
    modules = {"protocol": '"""The "protocol"."""\nimport os\nimport signal\nGRACE = 5.0\n',
               "loop": "import os\nimport _signal as signal\nfrom .protocol import (\n    GRACE)\nGRACE = 1.0\n"}
    assert clashes(modules) == ["signal: protocol.py and loop.py", "GRACE: protocol.py and loop.py"]
    assert bundle(modules) == ("# -- protocol.py\nimport os\nimport signal\nGRACE = 5.0\n\n\n"
                               "# -- loop.py\nimport os\nimport _signal as signal\nGRACE = 1.0\n")
