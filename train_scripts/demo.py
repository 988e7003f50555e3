"""Inference-and-efficiency demo of the recursive classifier family (`make demo`).

Prints the efficiency table of the three variants at the reported configuration, then runs a
CPU-sized DSA-MoE on a batch and shows what the recursion does at every step: sequence length,
keys each query attends to, tokens routed to each expert, and the per-step class predictions.
The model is untrained here: the training pipeline (and the trained demo) is a later issue.
"""
import torch
import timm

import timm_recursive  # noqa: F401  registers the models
from timm_recursive.analysis.efficiency import format_table
from timm_recursive.efficiency import build_reports


def main():
    print('== Efficiency at the reported configuration (python -m timm_recursive.efficiency ...) ==')
    specs = ['recursive_sa_mlp_cifar', 'recursive_sa_moe_cifar', 'recursive_dsa_moe_cifar',
             'recursive_dsa_moe_cifar:topk=2']
    print(format_table(build_reports(specs)))

    print('\n== One forward of recursive_dsa_moe_tiny, step by step ==')
    torch.manual_seed(0)
    model = timm.create_model('recursive_dsa_moe_tiny').eval()
    attn, moe = model.blocks[0].attn, model.blocks[0].moe
    keys, routed = [], []
    attn.register_forward_hook(lambda m, inp, out: keys.append((inp[0].shape[1], m.select(inp[0]).shape[-1])))
    moe.register_forward_hook(lambda m, inp, out: routed.append(
        torch.bincount(m.route(inp[0].reshape(-1, inp[0].shape[-1]))[3].flatten(), minlength=m.num_experts).tolist()))
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        step_logits, aux = model.forward_steps(x)
    print(f'{"step":>4} {"L_t":>4} {"keys/query":>10} {"tokens per expert (block 0)":>28} {"predictions":>12}')
    for t, ((length, k), counts, logits) in enumerate(zip(keys, routed, step_logits), start=1):
        print(f'{t:>4} {length:>4} {k:>10} {str(counts):>28}  {logits.argmax(-1).tolist()}')
    print(f'MoE auxiliary (load-balancing) loss of this forward: {aux.item():.3f} (1.0 = perfectly balanced)')
    print('\nUsage: import timm_recursive; timm.create_model("recursive_dsa_moe_cifar", num_classes=10)')


if __name__ == '__main__':
    main()
