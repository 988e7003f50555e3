"""tools/study_runs: a study's runs trained with the threads asked for, their records kept, a finished run skipped."""
import argparse
import json
import sys

import pytest

from tools import study_runs
from tools.study_runs import Cell, Study

# a stand-in for the training command: its records, with the intra-op threads its environment gave it
FAKE_TRAINING = ('import json, os, pathlib, sys; out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True); '
                 "[(out / name).write_text(json.dumps({'threads': int(os.environ['OMP_NUM_THREADS'])})) "
                 "for name in ('summary.json', 'metrics.jsonl', 'args.json')]")


def _study(tmp_path):
    cells = {'toy': Cell('toy', 'model', (), 'recipe', seeds=(0, 1))}
    return Study('toy_study', cells, lambda cell, seed, out: [sys.executable, '-c', FAKE_TRAINING, str(out)],
                 tmp_path / 'results')


def _arguments(study, out, *argv):
    parser = argparse.ArgumentParser()
    study_runs.add_arguments(parser, study, out)
    return parser.parse_args(list(argv))


def test_each_run_trains_on_the_threads_asked_for_and_its_records_are_kept(tmp_path, capsys):
    study = _study(tmp_path)
    assert study_runs.run_study(study, _arguments(study, tmp_path / 'runs', '--jobs', '1', '--threads', '2')) == 0
    for seed in (0, 1):
        kept = tmp_path / 'results' / 'toy' / f'seed{seed}' / 'summary.json'
        assert json.loads(kept.read_text()) == {'threads': 2}
    # one thread a run unless asked; no thread or job at all is refused by name
    assert study_runs.offline_env()['OMP_NUM_THREADS'] == '1'
    for option in ('--threads', '--jobs'):
        with pytest.raises(SystemExit):
            _arguments(study, tmp_path / 'runs', option, '0')
        assert f'argument {option}: must be at least 1, got 0' in capsys.readouterr().err


def test_a_finished_run_is_skipped_and_a_failed_one_named(tmp_path, capsys):
    study = _study(tmp_path)
    assert study_runs.run_study(study, _arguments(study, tmp_path / 'runs', '--seeds', '0')) == 0
    # seed 0 finished (its summary is there): trained again it would fail, as its folder exists
    assert study_runs.run_study(study, _arguments(study, tmp_path / 'runs', '--seeds', '0')) == 0
    (tmp_path / 'runs' / 'toy' / 'seed1').mkdir(parents=True)  # a run that left no summary: the command fails
    assert study_runs.run_study(study, _arguments(study, tmp_path / 'runs', '--seeds', '1')) == 1
    assert 'FAILED: toy/seed1' in capsys.readouterr().out
