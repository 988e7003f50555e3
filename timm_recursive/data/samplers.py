"""Samplers: ``RepeatAugBatches``, timm's repeated-augmentation sampler (``--aug-repeats``) for a loader that
Accelerate shards."""
from timm.data.distributed_sampler import RepeatAugSampler

from .errors import DatasetError


class RepeatAugBatches:
    """timm's ``RepeatAugSampler`` (``--aug-repeats``) for a loader that Accelerate shards.

    timm's sampler gives each process (rank) its own indices, so that the repeats of an image go to
    different processes. Accelerate instead deals the batches of one global loader to the processes in
    turn; this sampler yields, a batch at a time, the indices timm's sampler gives rank 0, 1, ..., so
    each process gets its rank's batches. Full batches only, as the loader keeps them aligned.
    """

    def __init__(self, dataset, num_processes: int, batch_size: int, num_repeats: float):
        self.dataset = dataset
        self.batch_size = batch_size
        self.samplers = [RepeatAugSampler(dataset, num_replicas=num_processes, rank=rank, num_repeats=num_repeats)
                         for rank in range(num_processes)]
        self.batches_per_process = len(self.samplers[0]) // batch_size
        if self.batches_per_process == 0:
            raise DatasetError(f'--aug-repeats leaves {len(self.samplers[0])} images per process and epoch, '
                               f'fewer than a batch of {batch_size}')

    def set_epoch(self, epoch: int) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(epoch)  # timm's shuffle is keyed to the epoch
        if hasattr(self.dataset, 'set_epoch'):  # Accelerate tells the sampler, and then no longer the dataset
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return self.batches_per_process * self.batch_size * len(self.samplers)

    def __iter__(self):
        per_rank = [list(sampler) for sampler in self.samplers]
        for start in range(0, self.batches_per_process * self.batch_size, self.batch_size):
            for indices in per_rank:
                yield from indices[start:start + self.batch_size]
