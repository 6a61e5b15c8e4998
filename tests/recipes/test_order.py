"""The training order, unit by unit: the sampler's part-way start, the loader's count and its state across a resume
with the same or another batch size or world (tests/recipes/test_training.py resumes whole runs)."""

import types

import torch

from recipes.data.order import ResumableDataModule, ResumableLoader, ResumableSampler


def test_the_sampler_starts_its_epoch_part_way_once_and_only_in_that_epoch():
    data = list(range(10))
    sampler = ResumableSampler(data, seed=3)
    full = list(sampler)
    assert sorted(full) == data and full != data  # a permutation of seed + epoch, not the data's order
    sampler.resume(0, 4)
    assert list(sampler) == full[4:]
    assert list(sampler) == full  # the next pass over the epoch is whole again
    sampler.resume(1, 4)
    sampler.set_epoch(2)  # moved on past the epoch it was told to resume
    assert len(list(sampler)) == 10 and list(sampler) != full


def test_each_process_takes_whole_shares_and_drops_the_remainder():
    data = list(range(5))
    shares = [list(ResumableSampler(data, seed=0, num_replicas=2, rank=rank)) for rank in (0, 1)]
    assert [len(s) for s in shares] == [2, 2] and not set(shares[0]) & set(shares[1])  # no sample padded in twice


def batches(loader, count=None):
    out = []
    for batch in loader:
        loader.took_batch(0)
        out.append(batch.tolist())
        if count is not None and len(out) == count:
            break
    return out


def test_a_loader_resumed_from_its_state_continues_at_the_next_batch_with_any_batch_size():
    data = torch.arange(24)
    whole = [i for batch in batches(ResumableLoader(data, batch_size=4, seed=5)) for i in batch]
    first = ResumableLoader(data, batch_size=4, seed=5)
    seen = batches(first, count=3)
    state = first.state_dict()
    assert state["epoch"] == 0 and state["batches"] == 3 and state["batch_size"] == 4
    again = ResumableLoader(data, batch_size=4, seed=0)  # the seed comes from the state
    again.load_state_dict(state)
    assert [i for b in seen + batches(again) for i in b] == whole
    other = ResumableLoader(data, batch_size=6, seed=0)  # another batch size: the same next sample
    other.load_state_dict(state)
    assert [i for b in batches(other) for i in b] == whole[12:]


def test_a_state_saved_before_the_last_batch_keeps_it_and_one_saved_after_it_starts_the_next_epoch():
    data = torch.arange(24)
    whole = batches(ResumableLoader(data, batch_size=4, seed=5))
    for taken, left, epoch in ((5, whole[5:], 0), (6, None, 1)):
        first = ResumableLoader(data, batch_size=4, seed=5)
        batches(first, count=taken)
        again = ResumableLoader(data, batch_size=4, seed=5)
        again.load_state_dict(first.state_dict())
        assert again.order.epoch == epoch and again.taken_epoch == epoch
        if left is not None:
            assert batches(again) == left


def test_the_loader_drops_a_partial_batch_and_counts_batches_per_epoch():
    loader = ResumableLoader(torch.arange(26), batch_size=4, seed=0)
    assert len(loader) == 6 and all(len(b) == 4 for b in loader)
    for epoch in (0, 0, 0, 1):
        loader.took_batch(epoch)
    assert (loader.state_dict()["epoch"], loader.state_dict()["batches"], loader.skipped) == (1, 1, 0)


def test_a_resume_with_another_batch_size_or_training_set_says_so(capsys):
    first = ResumableLoader(torch.arange(24), batch_size=4, seed=5)
    batches(first, count=3)
    ResumableLoader(torch.arange(24), batch_size=4, seed=0).load_state_dict(first.state_dict())
    assert capsys.readouterr().err == ""
    ResumableLoader(torch.arange(24), batch_size=6, seed=0).load_state_dict(first.state_dict())
    assert ("note: resuming with batch_size 6 on 1 process(es) where the run had 4 on 1: epoch 0 continues at its "
            "sample 12") in capsys.readouterr().err
    ResumableLoader(torch.arange(30), batch_size=4, seed=0).load_state_dict(first.state_dict())
    assert "note: resuming on a training set of 30 examples where the run had 24" in capsys.readouterr().err


class Numbers(ResumableDataModule):
    def __init__(self, n: int = 10):
        super().__init__()
        self.data, self.batch_size = torch.arange(n), 4

    def train_dataloader(self):
        return self.train_loader(self.data)


def test_overfit_batches_read_the_data_in_order_and_only_training_batches_are_counted():
    module = Numbers()
    module.trainer = types.SimpleNamespace(world_size=1, global_rank=0, overfit_batches=1, training=True, current_epoch=0)
    assert [b.tolist() for b in module.train_dataloader()] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # in order, 8-9 dropped
    module = Numbers()
    assert module.on_before_batch_transfer("batch", 0) == "batch"  # no trainer: nothing to count
    module.trainer = types.SimpleNamespace(world_size=1, global_rank=0, overfit_batches=0, training=False, current_epoch=0)
    loader = module.train_dataloader()
    module.on_before_batch_transfer("batch", 0)  # a validation batch
    assert loader.taken == 0
    module.trainer.training = True
    module.on_before_batch_transfer("batch", 0)
    assert loader.taken == 1
