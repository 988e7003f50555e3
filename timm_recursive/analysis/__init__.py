from .efficiency import (
    active_params,
    adaptive_macs,
    block_macs_per_token,
    efficiency_report,
    forward_macs,
    mixing_macs_per_token,
)

__all__ = ['active_params', 'adaptive_macs', 'block_macs_per_token', 'efficiency_report', 'forward_macs',
    'mixing_macs_per_token']
