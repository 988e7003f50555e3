"""experiments/digits_demo/tables.py: the demo's tables from the training record kept in its results/."""
import json
import pathlib

from tools.generated_markdown import import_file

STUDY = pathlib.Path(__file__).resolve().parent.parent / 'experiments' / 'digits_demo'
tables = import_file(STUDY / 'tables.py')


def test_the_short_piece_states_the_headlines_figures_in_plain_words():
    pieces = tables.tables(STUDY / 'results')
    short, headline = pieces['short'], pieces['headline']
    assert len(short) <= 150 and '`' not in short and '_' not in short
    exported, last = headline.split('% test top-1')[0], headline.split(', ')[1].split('% at the last epoch')[0]
    assert short.startswith(f'{exported}% test top-1 (epoch chosen on held-out images), {last}% at the last epoch; ')
    assert 'tiny DSA-MoE, scikit-learn digits' in short and 'one seed' in short
    summary = json.loads((STUDY / 'results' / 'summary.json').read_text())
    assert tables.short({**summary, 'selection_split': 'test'}).startswith(
        f'{exported}% test top-1 (epoch chosen on the test split), ')
    assert tables.model_in_words('recursive_sa_mlp_small') == 'small SA-MLP'
    assert tables.model_in_words('resnet18') == 'the model'
