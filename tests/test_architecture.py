"""The package's layers (docs/architecture.md): every import, function-local ones included, runs downward."""
import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'timm_recursive'
# bottom to top; a module may import its own layer and those below, except where NARROW says otherwise
LAYERS = ('layers', 'models', 'data', 'runs', ('train', 'analysis', 'hub'), 'cli')
# within the middle layer: the Hub cards read analysis' efficiency accounting; nothing else crosses
SIDEWAYS = {('hub', 'analysis')}
# data sits above models for one module only: the Hub access (is the Hub reachable?) that both need
NARROW = {('data', 'models'): ('timm_recursive.models._hub',)}


def _rank(layer: str) -> int:
    for i, entry in enumerate(LAYERS):
        if layer == entry or isinstance(entry, tuple) and layer in entry:
            return i
    raise KeyError(layer)


def _layer(module: str) -> str:
    """The layer of a dotted module name inside the package ('' for the package itself)."""
    parts = module.split('.')
    return parts[1] if len(parts) > 1 else ''


def _imports(path: pathlib.Path):
    """(line, imported module) of every import of the package in ``path``, relative ones resolved."""
    package = ['timm_recursive', *path.relative_to(PACKAGE).parent.parts]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                yield node.lineno, '.'.join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.lineno, node.module


MODULES = sorted(p for p in PACKAGE.rglob('*.py'))


@pytest.mark.parametrize('path', MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_run_down_the_layers(path):
    own = path.relative_to(PACKAGE).parts[0] if len(path.relative_to(PACKAGE).parts) > 1 else ''
    wrong = []
    for line, module in _imports(path):
        if module.split('.')[0] == 'tools':
            wrong.append(f'{line}: {module} (repository tooling is not installed)')
        if not module.startswith('timm_recursive.') or not own:
            continue  # the package root registers the models: any layer may import it
        target = _layer(module)
        if target == own or target == '':
            continue
        if _rank(target) > _rank(own) or _rank(target) == _rank(own) and (own, target) not in SIDEWAYS:
            wrong.append(f'{line}: {module}')
        elif (own, target) in NARROW and module not in NARROW[own, target]:
            wrong.append(f'{line}: {module} (only {", ".join(NARROW[own, target])} of {target})')
    assert not wrong, f'{path.relative_to(PACKAGE)} imports from a layer above or beside its own: {wrong}'


def test_only_commands_have_a_main_block():
    with_main = [str(p.relative_to(PACKAGE)) for p in MODULES
                 if "if __name__ == '__main__'" in p.read_text() and p.relative_to(PACKAGE).parts[0] != 'cli']
    assert with_main == []


def test_every_layer_is_a_package_the_check_knows():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / '__init__.py').exists()}
    known = {name for entry in LAYERS for name in (entry if isinstance(entry, tuple) else (entry,))}
    assert folders == known
    assert {p.name for p in PACKAGE.glob('*.py')} == {'__init__.py'}
