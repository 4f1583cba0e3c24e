"""YAML for cluster files: ``safe_load`` that refuses repeated keys, keeps numbers' text and bounds
what aliases expand to.

An alias is a reference to a node read once, so a file of ten lines, each a list of nine aliases
to the line before, stands for 9**9 values: reading it is quick, but whatever walks its values
afterwards (every check of the file) never ends. Each node's size, written out, is counted once
when the file has been read (work in proportion to the file), and a file past
:data:`EXPANDED_AT_MOST` values is refused before anything is built from it.
"""

from __future__ import annotations

from typing import Any

import yaml

EXPANDED_AT_MOST = 1_000_000  # values of a cluster file with its aliases written out: thousands of tasks fit


class DuplicateKey(yaml.YAMLError):
    def __init__(self, key: str, line: int):
        super().__init__(key)
        self.key, self.line = key, line


class _Int(int):
    """A YAML int that remembers how it was written (``0755`` stays "0755" in env)."""

    text: str


class _Float(float):
    """A YAML float that remembers how it was written (``2.10`` stays "2.10" in env)."""

    text: str


# libyaml's parser where PyYAML was built with it: a cluster file of a few hundred tasks parses in
# a tenth of the pure-Python parser's time. The constructors below (Python either way) are the same.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_STR_TAG = "tag:yaml.org,2002:str"


class ClusterLoader(_SafeLoader):
    """safe_load that refuses repeated keys, remembers how numbers were written and refuses a file
    whose aliases expand past :data:`EXPANDED_AT_MOST` values."""

    def __init__(self, stream: Any):
        super().__init__(stream)
        # An alias is written '*name': text without a '*' has none, and its nodes form a tree whose
        # size is the text's own, so the walk that sizes them is skipped (a tenth of a read).
        self._may_alias = "*" in stream if isinstance(stream, str) else (
            b"*" in stream if isinstance(stream, bytes) else True)

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None and self._may_alias:
            check_expanded_size(node)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                # A complex key ('? [a, b]'): a list or mapping cannot be a dict key, and no key of a
                # cluster file is one; refused here, where the line of the key is known.
                kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {kind} used as a key; expected a plain key such as 'worker'",
                    key_node.start_mark)
            # A plain key (most are) is its own text: no second construction to compare it.
            key = key_node.value if key_node.tag == _STR_TAG else self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float)) and key in seen:
                raise DuplicateKey(str(key), key_node.start_mark.line + 1)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        value = _Int(super().construct_yaml_int(node))
        value.text = node.value
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = _Float(super().construct_yaml_float(node))
        value.text = node.value
        return value


ClusterLoader.add_constructor("tag:yaml.org,2002:int", ClusterLoader.construct_yaml_int)
ClusterLoader.add_constructor("tag:yaml.org,2002:float", ClusterLoader.construct_yaml_float)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expanded_size(root: yaml.Node, limit: int = EXPANDED_AT_MOST) -> None:
    """Refuse (a YAML error at the node that passes it) a document whose nodes, each alias written
    out, number more than ``limit``, or that an alias makes endless (a list holding itself). Each
    node is sized once, from its children's sizes, without recursion."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # on the path from the root: met again, an alias loops
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_sized = stack.pop()
        key = id(node)
        if children_sized:
            open_nodes.discard(key)
            sizes[key] = size = 1 + sum(sizes[id(child)] for child in _children(node))
            if size > limit:
                raise yaml.composer.ComposerError(
                    None, None, f"its aliases expand to more than {limit:,} values; expected a cluster file "
                                f"that stays small with each alias written out", node.start_mark)
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise yaml.composer.ComposerError(None, None, "an alias refers to a list or mapping it is part of",
                                              node.start_mark)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)
