"""The console commands of ``[project.scripts]``, each a module with ``main(argv=None) -> exit status``.

``train_scripts/<name>.py`` runs the same ``main`` (``python train_scripts/train.py ...``).
"""
