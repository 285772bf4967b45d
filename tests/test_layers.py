"""The package's shape: its modules import one another without loops, in the
directions DESIGN.md names, and none grows past 800 non-blank lines.

Read from the source with `ast` (imports inside functions count too), so a
lazy import cannot hide a loop.
"""

import ast
import pathlib

import pytest

PACKAGE = "tf_distribute_lite"
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent.parent / PACKAGE
MAX_NON_BLANK_LINES = 800


def _module_name(path):
  parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))
           if "__pycache__" not in p.parts}


def _imported(node):
  """The package's modules an `import` or `from ... import` node names; a
  name imported from a package is its submodule when there is one."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  if node.module is None or node.level:
    return []
  submodules = [f"{node.module}.{alias.name}" for alias in node.names]
  return [m for m in submodules if m in MODULES] or [node.module]


def import_graph():
  """{module: the package's modules it imports anywhere in its source}."""
  graph = {}
  for name, path in MODULES.items():
    tree = ast.parse(path.read_text(), str(path))
    graph[name] = {target for node in ast.walk(tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   for target in _imported(node) if target in MODULES}
  return graph


def find_cycle(graph):
  """One import loop of `graph` as a list of modules, or None."""
  done, path = set(), []

  def visit(module):
    if module in path:
      return path[path.index(module):] + [module]
    if module in done:
      return None
    path.append(module)
    for target in sorted(graph[module]):
      cycle = visit(target)
      if cycle:
        return cycle
    path.pop()
    done.add(module)
    return None

  return next(filter(None, map(visit, sorted(graph))), None)


def test_find_cycle_finds_a_lazy_import_loop():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_package_has_no_import_loop():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import loop: " + " -> ".join(cycle)


@pytest.mark.parametrize("importer, imported", [
    # Legacy code adapts the core, never the reverse.
    (f"{PACKAGE}.distribute_lib", f"{PACKAGE}.strategy_v1"),
    (f"{PACKAGE}.replica_context", f"{PACKAGE}.strategy_v1"),
    # The resolver finds, the TPU system starts.
    (f"{PACKAGE}.cluster_resolver.tpu_cluster_resolver", f"{PACKAGE}.tpu_system"),
])
def test_lower_layer_does_not_import_upper(importer, imported):
  assert imported not in import_graph()[importer]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_has_at_most_800_non_blank_lines(module):
  lines = [line for line in MODULES[module].read_text().splitlines() if line.strip()]
  assert len(lines) <= MAX_NON_BLANK_LINES, (
      f"{module} has {len(lines)} non-blank lines; split it below "
      f"{MAX_NON_BLANK_LINES}.")
