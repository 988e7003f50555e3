"""Uploading an exported model folder to the Hugging Face Hub."""
import os
from typing import Optional

from timm_recursive.runs import OUTPUT_MARKER

from .errors import HubError

__all__ = ['push_to_hub']


def push_to_hub(folder: str, repo_id: str, token: Optional[str] = None, private: bool = False,
                revision: Optional[str] = None, commit_message: str = 'Upload timm-recursive model',
                api=None) -> str:
    """Upload ``folder`` to the model repo ``repo_id`` (created if needed); returns the commit URL.

    The token comes from ``token``, ``HF_TOKEN`` or ``huggingface-cli login``. Failures raise
    ``HubError``; the local folder is never modified or deleted.
    """
    from huggingface_hub import HfApi

    for name in ('model.safetensors', 'config.json', 'README.md'):
        if not os.path.isfile(os.path.join(folder, name)):
            raise HubError(f'{folder} is not an exported model folder (no {name}); create it with export_run')
    api = api or HfApi(token=token, library_name='timm-recursive')
    try:
        repo = api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(repo_id=getattr(repo, 'repo_id', repo_id), folder_path=folder,
                                   commit_message=commit_message, revision=revision,
                                   ignore_patterns=[OUTPUT_MARKER])
    except Exception as e:  # HTTP, auth, network: report and keep the local folder
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else 'no message'
        raise HubError(f'upload of {folder} to {repo_id} failed ({type(e).__name__}: {first_line}); the export in '
                       f'{folder} is complete and was not changed by the upload: retry with the same command') from None
    return str(getattr(commit, 'commit_url', commit))
