"""The package's shape: its modules import one another without loops, in the
directions ARCHITECTURE.md names, none grows past 800 non-blank lines, and
ARCHITECTURE.md's code map names every module and only files that exist.

Read from the source with `ast` (imports inside functions count too), so a
lazy import cannot hide a loop.
"""

import ast
import pathlib
import re

import pytest

PACKAGE = "tf_distribute_lite"
ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / PACKAGE
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
MAX_NON_BLANK_LINES = 800


def _module_name(path):
  parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))
           if "__pycache__" not in p.parts}


def _imported(node):
  """The package's modules an `import` or `from ... import` node names; a
  name imported from a package is its submodule when there is one.

  `from P import m` also reads package P: at run time that is a loop when
  P's `__init__` (still running) led to this import. The root package, which
  every import starts from, is left out.
  """
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  if node.module is None or node.level:
    return []
  submodules = [f"{node.module}.{alias.name}" for alias in node.names]
  found = [m for m in submodules if m in MODULES]
  if not found or node.module != PACKAGE:
    found.append(node.module)
  return found


def import_graph():
  """{module: the package's modules it imports anywhere in its source}."""
  graph = {}
  for name, path in MODULES.items():
    tree = ast.parse(path.read_text(), str(path))
    graph[name] = {target for node in ast.walk(tree)
                   if isinstance(node, (ast.Import, ast.ImportFrom))
                   for target in _imported(node) if target in MODULES and target != name}
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


def test_a_read_of_a_package_being_initialised_is_a_loop():
  # `cluster_resolver/__init__` imports the TPU resolver, which took a
  # helper module from the `cluster_resolver` package while it initialised.
  node = ast.parse(f"from {PACKAGE}.cluster_resolver import cluster_resolver").body[0]
  assert set(_imported(node)) == {f"{PACKAGE}.cluster_resolver",
                                  f"{PACKAGE}.cluster_resolver.cluster_resolver"}
  root = ast.parse(f"from {PACKAGE} import contexts").body[0]
  assert _imported(root) == [f"{PACKAGE}.contexts"]


def test_the_package_has_no_import_loop():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import loop: " + " -> ".join(cycle)


# What may import the compat.v1 adapter: the namespaces, the strategy TF has
# only in compat.v1, and the contrib "tower" layer over it.
ADAPTER_USERS = {f"{PACKAGE}.compat.v1", f"{PACKAGE}.compat.v1.experimental",
                 f"{PACKAGE}.parameter_server_strategy_v1", f"{PACKAGE}.contrib_tower"}


def test_only_the_legacy_layer_imports_the_compat_v1_adapter():
  graph = import_graph()
  users = {module for module, imported in graph.items() if f"{PACKAGE}.strategy_v1" in imported}
  assert users <= ADAPTER_USERS, sorted(users - ADAPTER_USERS)


@pytest.mark.parametrize("importer, imported", [
    # The TPU system starts the TPU of a resolver it is given, never finds one.
    (f"{PACKAGE}.tpu_system", f"{PACKAGE}.cluster_resolver.tpu_cluster_resolver"),
])
def test_lower_layer_does_not_import_upper(importer, imported):
  assert imported not in import_graph()[importer]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_has_at_most_800_non_blank_lines(module):
  lines = [line for line in MODULES[module].read_text().splitlines() if line.strip()]
  assert len(lines) <= MAX_NON_BLANK_LINES, (
      f"{module} has {len(lines)} non-blank lines; split it below "
      f"{MAX_NON_BLANK_LINES}.")


def reachable(graph, module):
  """The package's modules `module` imports, directly or through others."""
  seen, todo = set(), [module]
  while todo:
    for target in graph[todo.pop()] - seen:
      seen.add(target)
      todo.append(target)
  return seen


# The namespace packages: every package of tfd is one (`__init__.py`).
NAMESPACES = {name for name, path in MODULES.items() if path.name == "__init__.py"}


def _is_above_the_core(module):
  """Strategies, TF 1.x adapters, cluster and TPU modules."""
  short = module[len(PACKAGE) + 1:]
  return (short.endswith(("strategy", "strategy_v1")) or
          short.startswith(("tpu", "cluster")) or
          short in ("contrib_tower", "coordinator_values", "failure_handling",
                    "preemption_watcher", "termination_config", "gce_metadata",
                    "rpc_ops"))


def test_bridge_and_tf_classes_import_no_package_module():
  graph = import_graph()
  assert graph[f"{PACKAGE}._tf_bridge"] == set()
  assert graph[f"{PACKAGE}.tf_classes"] == set()


def test_the_core_reaches_no_strategy_adapter_cluster_or_tpu_module():
  above = sorted(m for m in reachable(import_graph(), f"{PACKAGE}.distribute_lib")
                 if _is_above_the_core(m))
  assert not above, f"{PACKAGE}.distribute_lib imports, through others: {above}"


def test_only_namespaces_import_namespaces():
  # `cluster_resolver/` is also the package of the resolvers.
  allowed = {f"{PACKAGE}.cluster_resolver"}
  wrong = {module: sorted(imported & NAMESPACES - allowed)
           for module, imported in import_graph().items()
           if module not in NAMESPACES and imported & NAMESPACES - allowed}
  assert not wrong, f"modules importing a namespace package: {wrong}"


def test_only_cluster_runtime_handles_signals():
  """One owner of SIGTERM: the others ask `cluster_runtime.on_sigterm`."""
  importers = sorted(
      name for name, path in MODULES.items()
      for node in ast.walk(ast.parse(path.read_text(), str(path)))
      if isinstance(node, ast.Import) and any(a.name == "signal" for a in node.names)
      or isinstance(node, ast.ImportFrom) and node.module == "signal")
  assert importers == [f"{PACKAGE}.cluster_runtime"], importers


def _architecture_paths():
  """The file and folder paths ARCHITECTURE.md names in backquotes."""
  return set(re.findall(r"`([\w./-]+?(?:\.py|/))`", ARCHITECTURE.read_text()))


def _name_in_architecture(path):
  """How ARCHITECTURE.md names a module: its path in the package, a
  package by its folder ("experimental/")."""
  relative = path.relative_to(PACKAGE_DIR)
  if relative.name != "__init__.py" or relative.parent == pathlib.Path("."):
    return relative.as_posix()
  return relative.parent.as_posix() + "/"


def test_architecture_names_only_paths_that_exist():
  missing = sorted(p for p in _architecture_paths()
                   if not (PACKAGE_DIR / p).exists() and not (ROOT / p).exists())
  assert not missing, f"ARCHITECTURE.md names paths that do not exist: {missing}"


def test_architecture_names_every_module():
  named = _architecture_paths()
  unnamed = sorted(_name_in_architecture(path) for path in MODULES.values()
                   if _name_in_architecture(path) not in named)
  assert not unnamed, (f"ARCHITECTURE.md's code map does not name {unnamed}: "
                       f"say what each does there.")


# --- Private contacts with TensorFlow live in the bridge and the client shims.

CONTACT_MODULES = {f"{PACKAGE}._tf_bridge", f"{PACKAGE}._client_shims"}
# Hooks of TensorFlow's composite-tensor protocol (`tf.TypeSpec`,
# `CompositeTensor`) that tfd's classes implement and read off their own
# values: definitions, not contacts.
COMPOSITE_HOOKS = {"_type_spec", "_component_specs", "_to_components",
                   "_from_components", "_serialize", "_deserialize"}
PYTHON_NAMES = {"_fields", "_replace", "_asdict", "_make"}  # named tuples'
_ATTRIBUTE_FUNCTIONS = ("getattr", "hasattr", "setattr", "delattr")


def _trees():
  return {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def names_defined(trees):
  """The private names the package defines: functions, classes, class
  attributes and attributes set on `self` or `cls`."""
  defined = set()
  for tree in trees:
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        defined.add(node.name)
      if isinstance(node, ast.ClassDef):
        defined.update(name.id for statement in node.body
                       if isinstance(statement, (ast.Assign, ast.AnnAssign))
                       for target in (statement.targets if isinstance(statement, ast.Assign)
                                      else [statement.target])
                       for name in ast.walk(target) if isinstance(name, ast.Name))
      if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and
          isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
        defined.add(node.attr)
  return defined


def _private_accesses(tree):
  """(line, owner, name) of each private attribute `tree` reads or sets on
  something other than `self`, `cls` or `super()`, literal `getattr`-style
  names included."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      owner, name = node.value, node.attr
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
          node.func.id in _ATTRIBUTE_FUNCTIONS and len(node.args) >= 2 and
          isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
      owner, name = node.args[0], node.args[1].value
    else:
      continue
    if (not name.startswith("_") or name.startswith("__") or name in PYTHON_NAMES or
        isinstance(owner, ast.Name) and owner.id in ("self", "cls") or
        isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super"):
      continue
    yield node.lineno, ast.unparse(owner), name


def tensorflow_contacts(tree, defined, tensorflow_private):
  """Each place `tree` names `tf.__internal__`, imports `tensorflow.python`,
  or reaches a private attribute of a TensorFlow object: one the package
  does not define, or one TensorFlow's objects have (tfd's variables answer
  TensorFlow's private variable interface, so defining it is not enough)."""
  for node in ast.walk(tree):
    imported = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
    if any(n == "tensorflow.python" or n.startswith("tensorflow.python.") for n in imported):
      yield f"line {node.lineno}: imports {imported[0]}"
    if isinstance(node, ast.Attribute) and node.attr == "__internal__":
      yield f"line {node.lineno}: {ast.unparse(node)}"
  for line, owner, name in _private_accesses(tree):
    if name not in defined or name in tensorflow_private:
      yield f"line {line}: {owner}.{name}"


def tensorflow_private_names():
  """The private attributes of TensorFlow's everyday objects, less the
  composite-tensor hooks."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  function = tf.function(lambda: tf.constant(1.0))
  graph = tf.Graph()
  with graph.as_default():
    graph_tensor = tf.constant(1.0)
  objects = [tf.Variable(1.0), tf.constant(1.0), graph, graph_tensor, graph_tensor.op,
             iter(tf.data.Dataset.range(1)), tf.data.Dataset, tf.TensorSpec([]), tf.TypeSpec,
             function, function.get_concrete_function(), tf.Module(), tf.train.Checkpoint()]
  return {name for obj in objects for name in dir(obj)
          if name.startswith("_") and not name.startswith("__")} - COMPOSITE_HOOKS


def test_the_contact_rule_finds_tensorflow_privates():
  tree = ast.parse(
      "import tensorflow.python.ops\n"
      "class A:\n  _own = 1\n  def _hook(self):\n    self._mine = tf.__internal__.X\n"
      "def f(a, v):\n  a._own; a._mine; a._hook(); self._anything; a._fields\n"
      "  v._unique_id; getattr(v, '_distribute_strategy', None); a._nowhere\n"
      "  a._type_spec; super()._anything\n")
  contacts = list(tensorflow_contacts(tree, names_defined([tree]) | {"_type_spec"},
                                      {"_unique_id", "_distribute_strategy"}))
  assert contacts == ["line 1: imports tensorflow.python.ops", "line 5: tf.__internal__",
                      "line 8: v._unique_id", "line 8: v._distribute_strategy",
                      "line 8: a._nowhere"]


def test_only_the_bridge_and_the_client_shims_reach_tensorflow_privates():
  trees = _trees()
  defined = names_defined(trees.values())
  private = tensorflow_private_names()
  contacts = {name: list(tensorflow_contacts(tree, defined, private))
              for name, tree in trees.items() if name not in CONTACT_MODULES}
  contacts = {name: found for name, found in contacts.items() if found}
  assert not contacts, (f"private TensorFlow names outside _tf_bridge.py and "
                        f"_client_shims.py (add an operation to the bridge): {contacts}")


def test_only_the_package_init_imports_the_client_shims():
  importers = sorted(m for m, imported in import_graph().items()
                     if f"{PACKAGE}._client_shims" in imported)
  assert importers == [PACKAGE]
