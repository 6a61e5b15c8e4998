"""The training order of a data module, kept so that a resumed run sees exactly the batches the
uninterrupted run would have seen (docs/training.md).

The order of epoch ``e`` is a permutation drawn from ``seed + e`` alone (not from the global RNG),
split across processes as ``DistributedSampler`` does, so it can be recomputed after a restart. The
training loader counts the batches the model has actually taken in the current epoch (at the moment
each batch is moved to the device, after Lightning's prefetching) and Lightning stores its
``{epoch, batches, seed, batch_size, num_replicas, skipped}`` in the checkpoint; on resume, the sampler starts
epoch ``e`` after those batches' samples (of all processes: a resume with another batch size or number of
processes continues at the same sample).
"""

import itertools
import sys

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, Dataset, DistributedSampler


@rank_zero_only
def note(text: str) -> None:
    print(text, file=sys.stderr)


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` (one permutation per epoch from ``seed + epoch``; process ``rank`` of
    ``num_replicas`` takes every ``num_replicas``-th index) that can start an epoch part-way.

    Being a ``DistributedSampler``, Lightning leaves it in place under DDP instead of wrapping it.
    """

    def __init__(self, dataset: Dataset, *, seed: int, shuffle: bool = True, num_replicas: int = 1, rank: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True)
        self._resume: tuple[int, int] | None = None

    def resume(self, epoch: int, samples: int) -> None:
        """Make the next pass over ``epoch`` skip its first ``samples`` indices (of this process)."""
        self.set_epoch(epoch)  # Lightning creates the first iterator before it sets the epoch
        self._resume = (epoch, samples)

    def __iter__(self):
        indices = super().__iter__()
        if self._resume is not None:
            epoch, samples = self._resume
            self._resume = None
            if epoch == self.epoch:
                return itertools.islice(indices, samples, None)
        return indices


class ResumableLoader(DataLoader):
    """The training ``DataLoader`` of a :class:`ResumableDataModule`. It counts the batches the model
    has taken in the current epoch; Lightning stores its ``state_dict`` in every checkpoint and hands
    it back on resume, before the first batch is drawn."""

    def __init__(self, dataset: Dataset, *, batch_size: int, seed: int, num_replicas: int = 1, rank: int = 0,
                 num_workers: int = 0):
        order = ResumableSampler(dataset, seed=seed, num_replicas=num_replicas, rank=rank)
        super().__init__(dataset, batch_size=batch_size, sampler=order, drop_last=True, num_workers=num_workers,
                         persistent_workers=num_workers > 0)
        self.order = order
        self.taken_epoch, self.taken = 0, 0  # batches taken so far in epoch `taken_epoch`
        self.skipped = 0  # this process's samples of that epoch before them (a resume with another batch or world)

    def took_batch(self, epoch: int) -> None:
        if epoch != self.taken_epoch:
            self.taken_epoch, self.taken, self.skipped = epoch, 0, 0
        self.taken += 1

    def state_dict(self) -> dict:
        return {"epoch": self.taken_epoch, "batches": self.taken, "seed": self.order.seed, "skipped": self.skipped,
                "batch_size": self.batch_size, "num_replicas": self.order.num_replicas, "dataset": len(self.dataset)}

    def load_state_dict(self, state_dict: dict) -> None:
        """Continue at the saved position in the epoch's order, counted in samples of all processes together, so
        a run resumed with another batch size or number of processes neither repeats nor skips a sample (a state
        written before these were recorded is read as this loader's)."""
        epoch, batches = int(state_dict["epoch"]), int(state_dict["batches"])
        batch_size = int(state_dict.get("batch_size", self.batch_size))
        replicas = int(state_dict.get("num_replicas", self.order.num_replicas))
        seen = (int(state_dict.get("skipped", 0)) + batches * batch_size) * replicas  # [all processes]
        samples, extra = divmod(seen, self.order.num_replicas)  # [this process]
        if (batch_size, replicas) != (self.batch_size, self.order.num_replicas):
            note(f"note: resuming with batch_size {self.batch_size} on {self.order.num_replicas} process(es) where "
                 f"the run had {batch_size} on {replicas}: epoch {epoch} continues at its sample {seen}"
                 + (f" ({extra} seen again: {seen} is not a multiple of the processes)" if extra else ""))
        if int(state_dict.get("dataset", len(self.dataset))) != len(self.dataset):
            note(f"note: resuming on a training set of {len(self.dataset)} examples where the run had "
                 f"{state_dict['dataset']} (another seq_len or corpus?): epoch {epoch}'s order is a new permutation, "
                 f"so its first {seen} samples are not the ones the run saw")
        if samples + self.batch_size > len(self.order):  # saved after the epoch's last batch
            epoch, samples = epoch + 1, 0
        self.order.seed = int(state_dict["seed"])
        self.order.resume(epoch, samples)
        self.taken_epoch, self.taken, self.skipped = epoch, 0, samples


class ResumableDataModule(L.LightningDataModule):
    """Base of the recipes' data modules: a training loader whose position is part of the checkpoint.

    Subclasses set ``self.batch_size``, ``self.num_workers`` and ``self.order_seed`` and build their
    training loader with :meth:`train_loader`; this class tells the loader when the model takes a
    training batch (after Lightning's prefetching, so the count is exact).
    """

    batch_size: int
    num_workers: int = 0
    order_seed: int = 0

    def data_fingerprint(self) -> str | None:
        """A hash of the content the batches are cut from (after :meth:`setup`), which the run records beside its code
        (``code.json``): runs of one recipe pooled as seeds must have read the same text, wherever its files lie and
        whatever Python's bundled text was. None here: data that the settings alone make (MQAR)."""
        return None

    def train_loader(self, dataset: Dataset) -> DataLoader:
        """A :class:`ResumableLoader`; under ``--trainer.overfit_batches`` a plain one in the data's own order, the
        same first batches every epoch (Lightning rebuilds the loader with a sequential sampler there, which only
        a loader that takes every ``DataLoader`` argument allows; the position of such a run needs no saving)."""
        trainer = self.trainer
        world, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if trainer is not None and trainer.overfit_batches:
            self._train_loader = None
            loader = DataLoader(dataset, batch_size=self.batch_size, shuffle=False, drop_last=True,
                                num_workers=self.num_workers, persistent_workers=self.num_workers > 0)
        else:
            loader = self._train_loader = ResumableLoader(dataset, batch_size=self.batch_size, seed=self.order_seed,
                                                          num_replicas=world, rank=rank, num_workers=self.num_workers)
        if len(loader) == 0:  # Lightning would stop at once with "No training batches"
            each = f" on each of {world} processes ({len(dataset)} // {world} = {len(dataset) // world})" * (world > 1)
            raise ValueError(f"{type(self).__name__}: the training set has {len(dataset)} examples, fewer than one "
                             f"batch of batch_size={self.batch_size}{each}; a partial batch is dropped, so no step "
                             "could be trained: lower batch_size or give more training data")
        return loader

    def on_before_batch_transfer(self, batch, dataloader_idx: int):
        trainer = self.trainer
        if trainer is not None and trainer.training and getattr(self, "_train_loader", None) is not None:
            self._train_loader.took_batch(trainer.current_epoch)
        return batch


class GeneratedTask(ResumableDataModule):
    """A synthetic task made on the fly (MQAR, Parity): a training split ``self.train`` and one held-out split
    ``self.held_out``, which validation and test both read, in order."""

    train: Dataset
    held_out: Dataset

    def _held_out_loader(self) -> DataLoader:
        return DataLoader(self.held_out, batch_size=self.batch_size, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self.train_loader(self.train)

    def val_dataloader(self) -> DataLoader:
        return self._held_out_loader()

    def test_dataloader(self) -> DataLoader:
        return self._held_out_loader()
