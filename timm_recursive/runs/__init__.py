"""Runs and models on disk: what training, analysis and the Hub export all read and write.

* ``files``: JSON written atomically, JSON lines synced, folders replaced only once complete;
* ``folders``: a new run's folder (``run_dir_for``: never one that holds a previous run);
* ``checkpoint``: training states written atomically and resumed, weights files loaded with clear errors;
* ``loading``: a model from a registered name (pretrained from the Hub or not) or any checkpoint: an
  exported folder, a run folder, a state folder or a weights file;
* ``export``: a model as a ``local-dir:`` / Hugging Face Hub folder;
* ``records``: what a finished run recorded (``args.json``, ``summary.json``, ``metrics.jsonl``);
* ``provenance``: the commit and hardware a record names;
* the Hub constants ``HUB_ORG`` and ``PROJECT_URL``, defined beside the models' pretrained configs (which
  name them) and read from here by everything above the models.
"""
from timm_recursive.models._pretrained import HUB_ORG, PROJECT_URL

from .checkpoint import (
    TRAINER_STATE,
    CheckpointError,
    CorruptStateError,
    find_last_state,
    find_states,
    load_state_checked,
    load_weights,
    resume_newest,
    save_numbered_state,
    save_state_atomic,
    states_to_resume,
    store_weights_as_timm,
)
from .export import INSTALL_COMMAND, export_model
from .files import (
    OUTPUT_MARKER,
    DestinationError,
    append_json_line,
    check_destination,
    check_file_destination,
    check_folder_path,
    replace_dir,
    replace_output_dir,
    respect_umask,
    temp_path_beside,
    write_json_atomic,
    write_results_file,
)
from .folders import run_dir_for
from .loading import (
    check_fits_dataset,
    check_input_size,
    check_model_name,
    create_classifier,
    create_model_from_checkpoint,
    create_model_from_run_args,
    model_arguments,
)
from .provenance import (
    DirtyCheckoutError,
    checkout_state,
    describe_hardware,
    provenance,
    require_clean_checkout,
    typed_command,
)
from .records import RunRecordError, epoch_record, is_dino_run, load_run, run_folder, selected_on

__all__ = ['TRAINER_STATE', 'CheckpointError', 'CorruptStateError', 'find_last_state', 'find_states',
    'load_state_checked', 'load_weights', 'resume_newest', 'save_numbered_state', 'save_state_atomic',
    'states_to_resume', 'store_weights_as_timm', 'INSTALL_COMMAND', 'export_model', 'OUTPUT_MARKER',
    'DestinationError', 'append_json_line', 'check_destination', 'check_file_destination', 'check_folder_path',
    'replace_dir', 'replace_output_dir', 'respect_umask', 'temp_path_beside', 'write_json_atomic',
    'write_results_file', 'run_dir_for', 'check_fits_dataset', 'check_input_size', 'check_model_name',
    'create_classifier', 'create_model_from_checkpoint', 'model_arguments',
    'create_model_from_run_args', 'DirtyCheckoutError', 'checkout_state', 'describe_hardware', 'provenance',
    'require_clean_checkout', 'typed_command', 'RunRecordError', 'epoch_record', 'is_dino_run', 'load_run',
    'run_folder', 'selected_on', 'HUB_ORG', 'PROJECT_URL']
