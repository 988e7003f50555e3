"""Training, evaluation and export for any timm model, and the command-line entry points.

* ``losses``: per-step outputs of any classifier (``StepOutputs``) and the deep supervision loss;
* ``evaluate``: top-1/top-5 accuracy at every recursion step;
* ``run``: the one run loop (resume, stop, seeded epochs, states, metrics, summary) every trainer uses;
* ``checkpoint``: training states written atomically, weights files loaded with clear errors;
* ``factory``: models from names, checkpoints or command-line arguments;
* ``export``: a model as a ``local-dir:`` / Hugging Face Hub folder;
* ``commands``: ``timm-recursive-train``, ``-evaluate``, ``-push-to-hub``, ``-train-dino``, ``-probe``.
"""
from .checkpoint import (
    TRAINER_STATE, CheckpointError, CorruptStateError, find_last_state, find_states, load_state_checked, load_weights,
    resume_newest, save_numbered_state, save_state_atomic, states_to_resume, store_weights_as_timm)
from .evaluate import collate_classification, evaluate_steps
from .export import INSTALL_COMMAND, export_model
from .factory import add_model_arguments, create_classifier, create_model_from_checkpoint, model_from_arguments
from .files import append_json_line, replace_dir, write_json_atomic
from .losses import STEP_WEIGHTINGS, StepOutputs, deep_supervision_loss, step_weights
from .run import (
    EpochMeter, RunLoop, SeededSamples, StopRequest, add_run_arguments, describe_hardware, run_dir_for, step_seed)
