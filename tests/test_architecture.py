"""The architecture is code: the import contracts in pyproject.toml hold, cover every module,
and can fail; the folders have no import cycle, across the two roots too; and the node agent as
deployed loads neither the simulation nor the heavy clients its memory budget rules out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("exporter", "healthcheck")
GENERATED = ("exporter.sources.podresources_pb",)  # protoc output, imported only by podresources
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def contracts() -> dict[str, dict[str, object]]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {c["id"]: c for c in config["tool"]["importlinter"]["contracts"]}


def layer_entries() -> list[str]:
    layers = contracts()["layers"]["layers"]
    assert isinstance(layers, list)
    return [m.strip() for layer in layers for m in layer.replace("|", ":").split(":")]


def test_the_layers_are_folders_and_fit_on_one_screen() -> None:
    """A reviewer sees a layer change in a diff: each entry is a folder, and there are few."""
    entries = layer_entries()
    assert len(contracts()["layers"]["layers"]) <= 10
    assert all((REPO / e.replace(".", "/")).is_dir() for e in entries), entries
    tops = {p.name for root in PACKAGES for p in (REPO / root).iterdir() if p.is_dir()}
    named = {e.split(".")[1] for e in entries}
    assert tops - {"__pycache__"} == named, "every folder of the two roots is a named layer"


def modules_with_code() -> list[str]:
    """Every module of ours that holds more than a docstring (empty package markers hold none)."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            name = name.removesuffix(".__init__")
            if name.startswith(GENERATED):
                continue
            if path.name == "__init__.py" and not _has_code(path):
                continue
            found.append(name)
    return found


def _has_code(path: Path) -> bool:
    import ast

    body = ast.parse(path.read_text()).body
    return any(not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)) for n in body)


def covering(module: str, entries: list[str]) -> list[str]:
    return [e for e in entries if module == e or module.startswith(e + ".")]


def test_every_module_sits_in_exactly_one_layer() -> None:
    """A module the layers contract does not name is checked by nothing: a new module must be
    placed in a layer when it is added."""
    entries = layer_entries()
    modules = modules_with_code()
    assert len(modules) > 80  # the walk found the tree
    assert [m for m in modules if m.count(".") < 1] == [], "the roots hold folders, not modules"
    unplaced = [m for m in modules if not covering(m, entries)]
    twice = {m: covering(m, entries) for m in modules if len(covering(m, entries)) > 1}
    assert unplaced == [], f"modules in no layer (add them to [tool.importlinter]): {unplaced}"
    assert twice == {}
    stale = [e for e in entries if not any(covering(m, [e]) for m in modules)]
    assert stale == [], f"layers name modules that do not exist: {stale}"


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on the tree at `root` (its packages first on the path, no cache)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(REPO / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    return root


def plant(root: Path, module: str, line: str) -> Path:
    path = root / (module.replace(".", "/") + ".py")
    text = path.read_text()
    anchor = "from __future__ import annotations\n"
    assert anchor in text
    path.write_text(text.replace(anchor, anchor + line + "  # noqa\n", 1))
    return path


# Each row: a wrong import someone could plausibly write, and the contract that must refuse it.
PLANTED = [
    ("exporter.topology.tree", "import exporter.cluster.model", "Layers:"),
    ("exporter.sources.sysfs", "import exporter.sim.hardware.profiles", "Only the CLI entry point"),
    ("exporter.node.render", "import aiohttp", "The node agent's import set"),
    ("exporter.sources.kube", "import kubernetes", "The node agent's import set"),
    ("healthcheck.detection.checks.xid", "import exporter.sources.nvml", "Health checks are pure"),
    ("healthcheck.detection.checks.thermal", "import time", "Health checks are pure"),
    ("exporter.node.serving", "import exporter.node.poller", "data flows one way"),
]


@pytest.mark.parametrize(("module", "line", "contract"), PLANTED, ids=[p[1] for p in PLANTED])
def test_a_wrong_import_breaks_its_contract(
    tree_copy: Path, module: str, line: str, contract: str
) -> None:
    clean = lint_imports(tree_copy)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    path = plant(tree_copy, module, line)
    original = path.read_text()
    try:
        broken = lint_imports(tree_copy)
    finally:
        path.write_text(original.replace(line + "  # noqa\n", "", 1))
    assert broken.returncode != 0
    broken_lines = [ln for ln in broken.stdout.splitlines() if "BROKEN" in ln or contract in ln]
    assert any(contract in ln for ln in broken_lines), broken.stdout


GRAPH_SCRIPT = """
import json, sys, grimp
graph = grimp.build_graph(*sys.argv[1:], cache_dir=None)
print(json.dumps({m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}))
"""


def package_graph(root: Path) -> dict[str, set[str]]:
    """The imports between the layer folders (exporter.node, healthcheck.detection, ...) of the
    tree at `root`, both roots in one graph: import-linter's acyclic_siblings contract sees each
    root alone, so a loop through exporter -> healthcheck -> exporter is invisible to it. Read in
    a child process so that it sees the tree at `root`, not the modules this one imported."""
    done = subprocess.run(
        [sys.executable, "-c", GRAPH_SCRIPT, *PACKAGES],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": str(Path(sys.executable).parent)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    imports: dict[str, list[str]] = json.loads(done.stdout)

    def folder(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {}
    for module, imported in imports.items():
        for target in imported:
            a, b = folder(module), folder(target)
            if a != b:
                edges.setdefault(a, set()).add(b)
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle in the graph, as the path around it, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_folders_have_no_import_cycle_across_the_two_roots() -> None:
    edges = package_graph(REPO)
    assert {"exporter.core", "healthcheck.remediation"} <= edges["exporter.cluster"]
    assert cycle(edges) is None


def test_a_loop_across_the_roots_is_found(tree_copy: Path) -> None:
    """The check can fail: the shared catalog reaching up into health detection closes a loop
    exporter.core -> healthcheck.detection -> exporter.core."""
    path = plant(tree_copy, "exporter.core.xid", "import healthcheck.detection.config")
    original = path.read_text()
    try:
        found = cycle(package_graph(tree_copy))
    finally:
        path.write_text(original.replace("import healthcheck.detection.config  # noqa\n", "", 1))
    assert found is not None
    assert "exporter.core" in found and "healthcheck.detection" in found


def test_the_deployed_node_agent_loads_no_simulation_and_no_heavy_client(tmp_path: Path) -> None:
    """What the contracts say statically, checked at run time on the production path: the CLI
    entry point running `node` on real sources (no GPU here, so NVML is absent) loads neither the
    simulation, nor the cluster service's modules, nor the heavy clients."""
    (tmp_path / "sys").mkdir()
    (tmp_path / "proc").mkdir()
    code = (
        "import sys\n"
        "from exporter.cli import main\n"
        "rc = main(['--log-level', 'ERROR', 'node', '--once', '--no-kubernetes',"
        f" '--sysfs-root', {str(tmp_path / 'sys')!r}, '--proc-root', {str(tmp_path / 'proc')!r},"
        f" '--pod-resources-socket', {str(tmp_path / 'kubelet.sock')!r}])\n"
        "heavy = ('exporter.sim', 'exporter.cluster.', 'aiohttp', 'kubernetes', 'boto3',"
        " 'botocore')\n"
        "parser_only = {'exporter.cluster', 'exporter.cluster.leader',"
        " 'exporter.cluster.leader.args', 'exporter.cluster.history',"
        " 'exporter.cluster.history.args'}\n"
        "loaded = {m for m in sys.modules if m.startswith(heavy) and m not in parser_only}\n"
        "print(sorted(loaded), file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert done.returncode == 0, done.stderr
    assert b"topowatch_nvml_up" in done.stdout.encode()
    assert done.stderr.strip().splitlines()[-1] == "[]"


def test_the_cli_names_every_simulated_profile() -> None:
    """The CLI lists the profiles without importing the simulation; the list must not drift."""
    from exporter.cli.node import SIMULATED_PROFILES
    from exporter.sim.hardware.profiles import PROFILES

    assert set(SIMULATED_PROFILES) == set(PROFILES)
