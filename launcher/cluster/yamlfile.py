"""YAML for cluster files: ``safe_load`` that refuses repeated keys and keeps numbers' text."""

from __future__ import annotations

from typing import Any

import yaml


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


class ClusterLoader(_SafeLoader):
    """safe_load that refuses repeated keys and remembers how numbers were written."""

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
            key = self.construct_object(key_node, deep=deep)
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
