"""``LanguageModel``: the one LightningModule of the recipes — next-token loss, auxiliary losses,
perplexity, AdamW with linear warm-up and cosine decay, gradient clipping with a divergence stop,
throughput and learning-rate logging, and checkpoints that rebuild the model (docs/training.md)."""

import atexit
import inspect
import math
import sys
import time
from collections.abc import Mapping
from functools import partial

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import BatchSizeFinder
from torchmetrics.text import Perplexity

from components._checks import check_on_device
from components.bindings import MixerFactory
from components.flops import forward_flops_per_token
from components.model import HybridLM, count_active_parameters, count_parameters
from components.sizing import SizeTarget, describe_size, sized_mixers
from zoo_kernels.linear_cross_entropy import IGNORE_INDEX, linear_cross_entropy_parts
from recipes.checkpoints import (CheckpointError, check_hyperparameters, consolidate_hint, is_sharded_checkpoint,
                                 load_checkpoint, load_weights)
from recipes.data.corpus import tokenizer_problem
from recipes.mfu import device_peak_flops, training_flops
from recipes.optimizer import ADAMW_BETAS, ADAMW_EPS, MUON, build_optimizer, fused_row_blocks, optimizer_spec
from recipes.optimizer import describe as describe_optimizer
from recipes.training import (DivergenceError, check_averaging_resumed, check_averaging_unsharded,
                              release_process_group, rng_states, set_rng_states, weight_averaging)


def model_options() -> list[str]:
    """``HybridLM``'s keyword options, which ``LanguageModel`` passes on (``**model_options``)."""
    return [name for name, p in inspect.signature(HybridLM).parameters.items() if p.kind is p.KEYWORD_ONLY]


def language_model_arguments() -> set[str]:
    """Every argument ``LanguageModel`` accepts: its own and ``HybridLM``'s options."""
    own = {name for name, p in inspect.signature(LanguageModel.__init__).parameters.items()
           if name != "self" and p.kind is not p.VAR_KEYWORD}
    return own | set(model_options())


SIZE_KEYS = ("n_blocks", "n_params", "n_active_params", "sized_width")  # recorded beside the arguments


def hyperparameter_keys() -> set[str]:
    """The top-level keys of a run's ``hparams.yaml``: the arguments and the sizes recorded with them."""
    return language_model_arguments() | set(SIZE_KEYS)


def check_model_options(options: Mapping) -> None:
    """Refuse, by name, a keyword that is neither ``LanguageModel``'s nor one of ``HybridLM``'s options."""
    known = model_options()
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"LanguageModel: unknown argument(s) {', '.join(map(repr, unknown))}; besides its own, it takes "
                        f"HybridLM's options: {', '.join(known)}")


def summed(losses: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The fp32 sum of the mixers' losses of one kind (balancing, router z), by module name; None where there is none."""
    return torch.stack([v.float() for v in losses.values()]).sum() if losses else None


class LanguageModel(L.LightningModule):
    """Trains a :class:`components.HybridLM` on batches ``{"input_ids": [B,T], "labels": [B,T]}``.

    Labels equal to -100 carry no loss; a batch with no labelled position has loss 0. In training the
    LM head runs at every position and the loss ignores the unlabelled ones (``loss_positions="all"``,
    no host sync); ``"labelled"`` gathers the labelled positions first, which saves memory when few
    carry a label and the vocabulary is large (MQAR), at the price of one host sync per step.
    Evaluation always gathers. The training loss never writes the logits whole: the head and the
    cross-entropy run together, a chunk of rows at a time (:mod:`zoo_kernels.linear_cross_entropy`).
    Model arguments are those of ``HybridLM`` (``vocab_size`` is normally linked from the data module
    by the CLI).

    The hyper-parameters a checkpoint records are the constructor's arguments with each letter's
    binding written as ``{class_path, init_args}``, so ``LanguageModel.load_from_checkpoint(path)`` and
    ``python -m recipes validate --ckpt_path path`` rebuild the same model. Parameter counts and the
    solved width go to the logger's hyper-parameters (TensorBoard, ``hparams.yaml``) instead.

    Every optimizer step computes the gradient norm (logged as ``train/grad_norm``, before clipping),
    clips it when the trainer says so (the recipes clip at norm 1.0), and raises
    :class:`recipes.training.DivergenceError` before the update if the loss or the norm is not finite.

    Args:
        d_model, pattern, mixers, vocab_size: passed to ``HybridLM`` (defaults 128, ``"AM×4"``, None, 256).
        **model_options: every other ``HybridLM`` keyword (``max_seq_len``, ``extrapolate``, ``init_std``,
            ``checkpoint_blocks``…), passed on as they are: they are declared once, by ``HybridLM``, and the
            CLI reads them from its signature (``--model.max_seq_len``). An unknown one is refused by name.
        size_to: solve one width of some mixers so the model has a target parameter count
            (:class:`components.sizing.SizeTarget`; YAML ``size_to: {params: 600000, letters: [M, R]}``);
            the solved width is recorded in the hyper-parameters as ``sized_width``.
        lr: peak learning rate (default 1e-3).
        betas, eps, weight_decay: AdamW settings (papers: (0.9, 0.98), 1e-6, 0.1). Weight decay
            applies to matrices only, not to norms' gains or other vectors.
        optimizer: another optimiser than AdamW (default None): a ``torch.optim`` name (``SGD``), a dotted path, or
            ``{class_path, init_args}``, over the same two groups with ``lr``, ``weight_decay`` and the schedule
            (:mod:`recipes.optimizer`); recorded as a spec.
        warmup_fraction: fraction of the run spent in linear warm-up (default 0.1).
        final_lr_fraction: the schedule decays to this fraction of ``lr`` (default 0.1).
        schedule: after the warm-up, ``cosine`` (default: a cosine down to ``final_lr_fraction`` at the last step) |
            ``wsd`` (warm-up-stable-decay: the peak until the last ``decay_fraction`` of the steps, then linear down).
        decay_fraction: ``wsd``'s decay phase, a fraction of the steps (default 0.2; 0: constant after the warm-up).
        aux_loss_coef: coefficient on the sum of the mixers' auxiliary losses (default 0.01).
        z_loss: PaLM's z-loss: this coefficient times the mean ``logsumexp²`` of the logits at the labelled
            positions joins the training loss (default 0; PaLM 1e-4), which keeps the softmax's normaliser near 1
            in long or low-precision runs. ``train/loss`` stays the cross-entropy alone (comparable with
            ``val/loss``); the mean ``logsumexp²`` is logged as ``train/z_loss``.
        router_z_loss: ST-MoE's router z-loss: this coefficient times the sum over the routed MoEs of the mean
            ``logsumexp²`` of their router's logits joins the training loss (default 0; ST-MoE 1e-3), which keeps
            the routers' logits small and their softmax stable; the sum is logged as ``train/router_z_loss``.
        loss_positions: ``all`` (default) | ``labelled``, where the training loss computes logits (above).
        compile: compile the model's forward with ``torch.compile(fullgraph=True)`` (default False):
            True for the default backend (inductor), or a backend's name (``aot_eager`` traces and
            differentiates the graph without generating code). The weights and checkpoints are those of
            the plain model; a graph break is an error, not a silent fallback.
        sample_tokens: at each validation, continue the first 32 tokens of the validation set by this many
            (greedy, so no random state is used) and log prompt and text to TensorBoard (``samples``) when the
            data module has a text tokenizer (default 64, fewer where the model's ``max_seq_len`` ends first; 0: never).
        peak_flops: the device's peak FLOP/s, for ``train/mfu`` (default None: looked up for known GPUs by
            name and precision, :mod:`recipes.mfu`; on a CPU only ``train/tflops`` is logged unless given).
        init_from: a checkpoint whose weights start the model (``python -m recipes.hf`` writes one from a
            Hugging Face folder), for fine-tuning; not recorded in the hyper-parameters, since the
            checkpoints of this run hold the weights themselves.
        init_from_strict: every tensor of the model from ``init_from``, and every one of its tensors used (default
            True; a model it does not fit is refused, naming the tensors). False: the tensors whose names and
            shapes match are loaded and the rest keep their initialisation — a model grown from a smaller one
            (more blocks, a new mixer in a slot) — and what was kept and left is listed when the model is built.
    """

    def __init__(
        self,
        d_model: int = 128,
        pattern: str = "AM×4",
        mixers: Mapping[str, MixerFactory] | None = None,
        *,
        vocab_size: int = 256,
        size_to: SizeTarget | None = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = ADAMW_BETAS,
        eps: float = ADAMW_EPS,
        weight_decay: float = 0.1,
        optimizer: str | dict | None = None,
        warmup_fraction: float = 0.1,
        final_lr_fraction: float = 0.1,
        schedule: str = "cosine",
        decay_fraction: float | None = None,
        aux_loss_coef: float = 0.01,
        z_loss: float = 0.0,
        router_z_loss: float = 0.0,
        loss_positions: str = "all",
        compile: bool | str = False,
        sample_tokens: int = 64,
        peak_flops: float | None = None,
        init_from: str | None = None,
        init_from_strict: bool = True,
        **model_options,
    ):
        hparams = {k: v for k, v in locals().items()
                   if k not in ("self", "mixers", "__class__", "init_from", "init_from_strict", "model_options")}
        super().__init__()
        check_model_options(model_options)
        # (torch names a bad lr, beta or eps only when the optimizer is built, after the model and data: here first)
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"LanguageModel: lr={lr} must be a positive number")
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"LanguageModel: betas={tuple(betas)} must be two numbers in [0, 1)")
        if not eps > 0 or not weight_decay >= 0 or not aux_loss_coef >= 0:
            raise ValueError(f"LanguageModel: eps={eps} must be > 0, weight_decay={weight_decay} and "
                             f"aux_loss_coef={aux_loss_coef} >= 0")
        for name, value, paper in (("z_loss", z_loss, "PaLM's: 1e-4"), ("router_z_loss", router_z_loss, "ST-MoE's: 1e-3")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise ValueError(f"LanguageModel: {name}={value!r} must be a finite number >= 0 ({paper})")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"LanguageModel: warmup_fraction={warmup_fraction} must lie in [0, 1)")
        if not 0.0 <= final_lr_fraction <= 1.0:
            raise ValueError(f"LanguageModel: final_lr_fraction={final_lr_fraction} must lie in [0, 1]")
        decay_fraction = check_schedule(schedule, warmup_fraction, decay_fraction)
        if loss_positions not in ("all", "labelled"):
            raise ValueError(f"LanguageModel: loss_positions={loss_positions!r} is not one of ('all', 'labelled')")
        if isinstance(sample_tokens, bool) or not isinstance(sample_tokens, int) or sample_tokens < 0:
            raise ValueError(f"LanguageModel: sample_tokens={sample_tokens!r} must be an integer >= 0 (0: no samples)")
        if peak_flops is not None and not peak_flops > 0:
            raise ValueError(f"LanguageModel: peak_flops={peak_flops} must be a positive FLOP/s figure, or None")
        optimizer = optimizer_spec(optimizer, weight_decay=weight_decay,
                                   betas_or_eps_set=tuple(betas) != ADAMW_BETAS or eps != ADAMW_EPS)
        if isinstance(size_to, Mapping):  # as a checkpoint records it
            size_to = SizeTarget(**size_to)
        self.size_note, sized_width = None, None
        if size_to is not None:
            mixers, sized_width = sized_mixers(vocab_size, d_model, pattern, mixers, size_to, **model_options)
        self.model = HybridLM(vocab_size, d_model, pattern, mixers, **model_options)
        if size_to is not None:
            self.size_note = describe_size(self.model, size_to, sized_width)
        if init_from is not None:
            self._load_initial_weights(init_from, init_from_strict)
        # Only plain values, so the checkpoint reloads (weights_only) and re-parses through the CLI.
        self.save_hyperparameters({
            **hparams,
            **model_options,
            # ASCII, so hparams.yaml reads "AMx4" rather than "AM\xD74" (the grammar takes both)
            "pattern": pattern.replace("×", "x"),
            "betas": list(betas),
            "optimizer": optimizer,
            "decay_fraction": decay_fraction,
            "mixers": self.model.binding_specs(),
            "size_to": None if size_to is None else vars(size_to),
        })
        self.sizes = dict(zip(SIZE_KEYS, (len(self.model.blocks), count_parameters(self.model),
                                          count_active_parameters(self.model), sized_width)))

        self.val_loss = torchmetrics.MeanMetric()
        self.val_ppl = Perplexity()
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(vocab_size, average="micro")
        self._window_started: float | None = None  # tokens/s is measured over each logging window
        self._window_tokens = 0
        self._window_length = 0  # the training length T of the window's batches, for the FLOPs per token
        self._flops_per_token: dict[int, float] = {}
        self._sharded = False  # FSDP2 applied (configure_model)
        self.history: dict = {"val": [], "tokens_per_sec": [], "started": None}  # for the end-of-fit summary
        self._sample_prompt: torch.Tensor | None = None
        self._last_loss: torch.Tensor | None = None
        self._schedule_steps: int | None = None  # the steps the learning-rate schedule spans (configure_optimizers)
        self._resumed_schedule_steps: int | None = None  # those of the run this one resumes, when it recorded them
        self._schedule_lr: float | None = None  # the peak rate the schedule was built with (configure_optimizers)
        self._step_losses: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # (ce, aux) of this step's micro-batches
        self._hidden_states = self.model.hidden_states
        if compile:
            backend = "inductor" if compile is True else compile
            # Static shapes: a run sees a few fixed batch shapes (training's, validation's), and each compiles
            # once into a graph specialised to it, rather than the second one turning the length symbolic.
            self._hidden_states = torch.compile(self.model.hidden_states, fullgraph=True, dynamic=False,
                                                backend=backend)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, *,
                             allow_classes: tuple[str, ...] | list[str] = (), **kwargs):
        """The model a checkpoint file records, rebuilt from its hyper-parameters and weights.

        The file is read as data only (``weights_only=True``), and every class its hyper-parameters name
        must come from the zoo's ``components`` or from ``allow_classes`` (packages, modules or class
        paths the caller trusts), checked before anything is imported (:mod:`recipes.checkpoints`).
        """
        if hparams_file is not None:
            raise ValueError("LanguageModel.load_from_checkpoint: hparams_file is not supported; the checkpoint "
                             "records the hyper-parameters, and keyword arguments override them")
        if is_sharded_checkpoint(checkpoint_path):
            raise CheckpointError(consolidate_hint(checkpoint_path))
        checkpoint = load_checkpoint(checkpoint_path, mmap=True)
        check_hyperparameters(checkpoint.get("hyper_parameters") or {}, checkpoint_path, allow_classes)
        del checkpoint
        return super().load_from_checkpoint(checkpoint_path, map_location=map_location, strict=strict,
                                            weights_only=True, **kwargs)

    # ---- the loss --------------------------------------------------------------------------------

    def _hidden(self, batch: dict) -> torch.Tensor:
        return self._hidden_states(
            batch["input_ids"], position_ids=batch.get("position_ids"), padding_mask=batch.get("padding_mask"),
            document_ids=batch.get("document_ids"),
        )  # [B, T, d]

    def training_loss(self, batch: dict) -> torch.Tensor:
        """The mean cross-entropy over the labelled positions (plus ``z_loss`` times their mean ``logsumexp²``, when
        set), computed as ``loss_positions`` says.

        The head and the loss go together through :func:`zoo_kernels.linear_cross_entropy`, which never writes
        the ``[B, T, V]`` logits — except under FSDP2, which gathers the head's weight only around the head's
        own ``forward``, or with a head that is not a bias-free ``nn.Linear``: those take the plain form."""
        return self._training_losses(batch)[0]

    def _training_losses(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(:meth:`training_loss`, the mean ``logsumexp²`` of the labelled positions' logits, detached)."""
        labels = batch["labels"]  # [B, T]
        self._check_labels(labels)
        hidden = self._hidden(batch)  # [B, T, d]
        if self.hparams.loss_positions == "labelled":
            labelled = labels != IGNORE_INDEX  # [B, T]
            hidden, labels = hidden[labelled], labels[labelled]  # [N, d], [N]: the head runs on these rows only
        hidden, labels = hidden.reshape(-1, hidden.shape[-1]), labels.flatten()  # [B·T, d], [B·T]
        head, z_loss = self.model.lm_head, self.hparams.get("z_loss", 0.0)  # (absent from older checkpoints: 0)
        if not self._sharded and type(head) is torch.nn.Linear and head.bias is None:
            total, squares = linear_cross_entropy_parts(hidden, head.weight, labels, ignore_index=IGNORE_INDEX,
                                                        z_loss=z_loss)
        else:
            logits = head(hidden).float()  # [B·T, V]
            total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
            squares = logits.new_zeros(())
            if z_loss:
                squares = torch.where(labels != IGNORE_INDEX, logits.logsumexp(dim=-1).square(), 0.0).sum()
                total, squares = total + z_loss * squares, squares.detach()
        count = (labels != IGNORE_INDEX).sum().clamp_min(1)  # a count on the device: no host sync
        return total / count, squares / count

    def forward_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """→ (cross-entropy, logits ``[N, V]`` at the N labelled positions, their labels ``[N]``)."""
        labels = batch["labels"]
        self._check_labels(labels)
        hidden = self._hidden(batch)  # [B, T, d]
        keep = labels != IGNORE_INDEX  # [B, T]
        logits = self.model.lm_head(hidden[keep])  # [N, V]
        targets = labels[keep]  # [N]
        # A sum over max(N, 1) rather than a mean: a batch with nothing labelled gives 0, not NaN
        # (and still reaches every parameter, which DDP needs).
        ce = F.cross_entropy(logits.float(), targets, reduction="sum") / max(targets.numel(), 1)
        return ce, logits, targets

    def _check_labels(self, labels: torch.Tensor) -> None:
        """Labels are token ids or -100 (no loss); an on-device assert in training, so no host sync (an empty batch
        passes: ``all`` of nothing is true)."""
        vocab = self.model.vocab_size
        ok = ((labels == IGNORE_INDEX) | ((labels >= 0) & (labels < vocab))).all()
        rule = f"LanguageModel: labels must be token ids in [0, vocab_size={vocab}) or {IGNORE_INDEX} (no loss)"
        check_on_device(ok, rule, lambda: f"{rule}; got values in [{int(labels.min())}, {int(labels.max())}]",
                        sync=not self.training)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, squares = self._training_losses(batch)
        z_loss = self.hparams.get("z_loss", 0.0)
        ce = loss - z_loss * squares if z_loss else loss  # (the cross-entropy alone, for the log)
        aux_total = summed(self.model.auxiliary_losses())
        if aux_total is not None:
            loss = loss + self.hparams.aux_loss_coef * aux_total
        router_z = self._router_z_loss()
        if router_z is not None:
            loss = loss + self.hparams.router_z_loss * router_z
        self._last_loss = loss.detach()
        # With gradient accumulation a step is several micro-batches and Lightning logs a step's last value: the
        # mean over the step's micro-batches so far is logged, so the curve is that of the step's whole batch (the
        # one its update follows), as without accumulation, and not one micro-batch's noisier loss.
        accumulate = self._trainer.accumulate_grad_batches if self._trainer is not None else 1  # (called by hand)
        if batch_idx % accumulate == 0:
            self._step_losses = []
        self._step_losses.append((ce.detach(), None if aux_total is None else aux_total.detach()))
        step_ce = torch.stack([c for c, _ in self._step_losses]).mean()
        if aux_total is not None:
            self.log("train/aux_loss", torch.stack([a for _, a in self._step_losses if a is not None]).mean())
        # Averaged over the processes under DDP, so the logged loss is that of the whole batch.
        self.log("train/loss", step_ce, prog_bar=True, sync_dist=True)
        self.log("train/ppl", torch.exp(step_ce))
        if z_loss:
            self.log("train/z_loss", squares)
        if router_z is not None:
            self.log("train/router_z_loss", router_z.detach())
        self._log_expert_loads()
        return loss

    def _router_z_loss(self) -> torch.Tensor | None:
        """The sum of the routed MoEs' router z-losses of the last forward, where ``router_z_loss`` weighs them (None
        otherwise, or for a model without one)."""
        return summed(self.model.router_z_losses()) if self.hparams.get("router_z_loss", 0.0) else None  # (older: 0)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Log the gradient norm, stop on a non-finite loss or norm, then clip as the trainer asks."""
        grads = [p.grad.detach().float() for p in self.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads \
            else torch.zeros((), device=self.device)  # of this process's gradients (a shard of them under FSDP)
        self.log("train/grad_norm", norm)
        # With a loss scaler (16-mixed) an inf gradient is routine: the scaler skips the step itself.
        scaled = self.trainer.precision == "16-mixed"
        loss = self._last_loss if self._last_loss is not None else torch.zeros((), device=self.device)
        finite = bool(torch.isfinite(loss) if scaled else torch.isfinite(loss) & torch.isfinite(norm))  # one sync
        if self.trainer.world_size > 1:  # every process must stop, or none
            finite = self.trainer.strategy.reduce_boolean_decision(finite, all=True)
        if not finite:
            raise DivergenceError(self.trainer.global_step + 1, float(loss), None if scaled else float(norm))
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    def optimizer_step(self, *args, **kwargs) -> None:
        super().optimizer_step(*args, **kwargs)
        # Once per update, after every micro-batch's forward: DeepSeek-V3's balancing bias moves by the step's loads.
        self.model.update_routing_balance()

    def _log_expert_loads(self) -> None:
        """Per MoE layer: the load's entropy over log(E) (1 = uniform, 0 = one expert takes all) and the
        busiest expert's load over the mean (1 = uniform, E = collapse), so collapse shows up; and where the layer
        keeps each sequence's load, the busiest expert's load over the mean within a sequence, averaged over the
        sequences that have tokens (what a batch's balance can hide: sequences that each crowd another expert)."""
        layer_of = lambda name: (name.removeprefix("blocks.").replace(".state_mixer", "")  # noqa: E731
                                 .replace(".sequence_mixer", "-seq"))
        for name, load in self.model.expert_loads().items():
            n = load.numel()
            entropy = -(load * load.clamp_min(1e-12).log()).sum() / math.log(n) if n > 1 else load.new_ones(())
            self.log(f"moe/block{layer_of(name)}/load_entropy", entropy)
            self.log(f"moe/block{layer_of(name)}/max_over_mean_load", load.max() * n)
        for name, loads in self.model.sequence_loads().items():  # [B, E]
            present = loads.sum(dim=1) > 0  # [B]: a sequence of padding alone has no load
            if present.any():
                busiest = loads[present].max(dim=1).values * loads.shape[1]  # [b]
                self.log(f"moe/block{layer_of(name)}/max_over_mean_load_per_sequence", busiest.mean())
        for name, module in self.model.named_modules():  # a self-balancing router: how far its bias has spread
            bias = getattr(module, "balance_bias", None)
            if isinstance(bias, torch.Tensor) and bias.numel() > 1:
                layer = name.removeprefix("blocks.").replace(".state_mixer.router", "")
                self.log(f"moe/block{layer}/balance_bias_spread", bias.max() - bias.min())

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if batch_idx == 0 and self._sample_prompt is None:
            self._sample_prompt = batch["input_ids"][:1, :32].detach()
        self._evaluate(batch, "val")

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking or self.trainer.state.fn != "fit" or not self.val_loss.update_called:
            return
        loss = float(self.val_loss.compute())  # (the same value logged as val/loss)
        self.history["val"].append((self.trainer.global_step, loss))
        self.history.setdefault("val_acc", []).append((self.trainer.global_step, float(self.val_acc.compute())))
        # The metric has already summed every process's batches, so the value is the same on each; sync_dist
        # averages equal values and quiets Lightning's warning that an epoch-level value is not synced.
        self.log("hp/final_val_loss", loss, sync_dist=True)
        self.log("hp/best_val_loss", min(value for _, value in self.history["val"]), sync_dist=True)
        self._log_sample()

    def _log_sample(self) -> None:
        """A greedy continuation of the validation set's first tokens, as text in TensorBoard."""
        data = getattr(self.trainer, "datamodule", None)
        if (not self.hparams.get("sample_tokens") or self._sample_prompt is None
                or not self.trainer.is_global_zero or not hasattr(data, "decode")):
            return
        experiments = [logger.experiment for logger in self.loggers if hasattr(logger.experiment, "add_text")]
        if not experiments:
            return
        prompt = self._sample_prompt
        tokens = int(self.hparams.sample_tokens)
        if not self.model.extrapolate:  # a model shorter than prompt + sample: the sample shortened, not the run ended
            tokens = min(tokens, self.model.max_seq_len - prompt.shape[1] + 1)
        if tokens < 1:
            return
        with torch.no_grad():
            out = self.model.generate(prompt, tokens)[0].tolist()  # greedy: no RNG state used
        text = (f"**prompt:** {data.decode(out[:prompt.shape[1]])!r}\n\n"
                f"**continuation (greedy):** {data.decode(out[prompt.shape[1]:])!r}")
        for experiment in experiments:
            experiment.add_text("samples", text, self.trainer.global_step)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict, stage: str) -> None:
        ce, logits, targets = self.forward_loss(batch)
        if targets.numel() == 0:
            return
        self.val_loss.update(ce, weight=targets.numel())
        self.val_ppl.update(logits[None].float(), targets[None])  # [1, N, V], [1, N]
        self.val_acc.update(logits, targets)
        self.log(f"{stage}/loss", self.val_loss, prog_bar=True)
        self.log(f"{stage}/ppl", self.val_ppl)
        self.log(f"{stage}/acc", self.val_acc)

    # ---- progress, throughput, learning rate -----------------------------------------------------

    def _load_initial_weights(self, path: str, strict: bool = True) -> None:
        try:
            state = load_weights(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"LanguageModel: init_from={path!r}: no such checkpoint file") from None
        model_state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
        mine = self.model.state_dict()
        unfit = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(mine[k].shape)}" for k, v in model_state.items()
                 if k in mine and v.shape != mine[k].shape]
        missing, unexpected = sorted(mine.keys() - model_state.keys()), sorted(model_state.keys() - mine.keys())
        fitting = {k: v for k, v in model_state.items() if k in mine and v.shape == mine[k].shape}
        if strict and (unfit or missing or unexpected):
            raise ValueError(f"LanguageModel: init_from={path!r} does not fit this model: shapes {unfit[:3]}, missing "
                             f"{missing[:4]}, unexpected {unexpected[:4]} (init_from_strict=False loads the tensors "
                             "that fit and keeps the others' initialisation)")
        if not fitting:
            raise ValueError(f"LanguageModel: init_from={path!r}: no tensor of the checkpoint fits this model (by name "
                             f"and shape): shapes {unfit[:3]}, missing {missing[:4]}, unexpected {unexpected[:4]}")
        # A model that ties its head to its embedding holds one tensor under both names: an untied checkpoint's two
        # would both be copied into it, and the head's, copied last, would silently become the embedding.
        untied = (getattr(self.model, "tie_embeddings", False) and {"embedding.weight", "lm_head.weight"} <= fitting.keys()
                  and not torch.equal(fitting["embedding.weight"], fitting["lm_head.weight"]))
        if untied and strict:
            raise ValueError(f"LanguageModel: init_from={path!r} has an embedding and a head of their own, and this model "
                             "ties them (tie_embeddings=True), so one of the two would be lost: --model.tie_embeddings "
                             "false keeps both, --model.init_from_strict false takes the embedding for both")
        if untied:
            del fitting["lm_head.weight"]
        self.model.load_state_dict(fitting, strict=strict and not untied)
        self._init_from = (path, load_checkpoint(path, mmap=True).get("tokenizer"))  # compared with the data in setup
        if len(fitting) == len(mine) and not unexpected:
            print(f"init_from: loaded {len(fitting)} tensors from {path}", flush=True)
            return
        kept = sorted(mine.keys() - fitting.keys() - ({"lm_head.weight"} if untied else set()))
        print(f"init_from: loaded {len(fitting)} of the model's {len(mine)} tensors from {path}; initialised afresh: "
              f"{_names(kept)}; in the checkpoint but not loaded: {_names(sorted(model_state.keys() - fitting.keys()))}"
              + (" (this model ties its head to its embedding: the head is the checkpoint's embedding)" if untied else ""),
              flush=True)

    def configure_model(self) -> None:
        """Under Lightning's ``ModelParallelStrategy``: FSDP2 (``fully_shard``) over its data-parallel mesh, one
        unit per block, and units for the embedding, the final norm and the head (one unit for the two when they
        are tied) — each a module the training step calls, since FSDP2 gathers a unit's weights around its
        ``forward`` and the loss calls the head apart from the model's (docs/training.md). Other strategies:
        nothing to do."""
        mesh = self.device_mesh
        if mesh is None or self._sharded:
            return
        check_averaging_unsharded(self.trainer.callbacks, self.trainer.strategy)
        if mesh["tensor_parallel"].size() != 1:
            raise ValueError(f"LanguageModel: tensor parallelism is not implemented (tensor_parallel_size="
                             f"{mesh['tensor_parallel'].size()}); use ModelParallelStrategy(data_parallel_size=N, "
                             "tensor_parallel_size=1) for sharded data parallelism")
        from torch.distributed.fsdp import fully_shard

        model, shard = self.model, partial(fully_shard, mesh=mesh["data_parallel"])
        for block in model.blocks:
            shard(block)
        shard(model.norm)
        if model.tie_embeddings:
            shard([model.embedding, model.lm_head])
        else:
            shard(model.embedding)
            shard(model.lm_head)
        self._sharded = True

    def setup(self, stage: str) -> None:
        trainer = self.trainer
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # A ddp_spawn worker ends without returning to the command, which releases the group: release it at
            # the worker's exit rather than in the interpreter's teardown (once an abort, exit -6, after a fit).
            atexit.unregister(release_process_group)
            atexit.register(release_process_group)
        path, recorded = getattr(self, "_init_from", (None, None))
        problem = tokenizer_problem(trainer.datamodule, recorded) if stage == "fit" else None
        if problem:  # an embedding row would start as another token's
            raise ValueError(f"LanguageModel: init_from={path!r}: {problem}")
        if trainer.gradient_clip_val is not None and not float(trainer.gradient_clip_val) >= 0:
            raise ValueError(f"gradient_clip_val={trainer.gradient_clip_val} must be >= 0 (0 or null: no clipping)")
        if not isinstance(trainer.accumulate_grad_batches, int) or trainer.accumulate_grad_batches < 1:
            raise ValueError(f"accumulate_grad_batches={trainer.accumulate_grad_batches!r} must be an integer >= 1")
        accumulate, interval = trainer.accumulate_grad_batches, trainer.val_check_interval
        if stage == "fit" and accumulate > 1 and isinstance(interval, int) and trainer.is_global_zero:
            # Lightning counts val_check_interval in batches, max_steps and checkpoint.every_n_steps in optimizer
            # steps: a recipe's interval, written in steps, would validate `accumulate` times as often
            print(f"note: val_check_interval={interval} counts batches, not optimizer steps: with "
                  f"accumulate_grad_batches={accumulate} validation runs every {interval / accumulate:g} steps; "
                  f"--trainer.val_check_interval {interval * accumulate} validates every {interval} steps",
                  file=sys.stderr)
        finder = any(isinstance(c, BatchSizeFinder) for c in trainer.callbacks)
        if finder and isinstance(trainer.accelerator, CPUAccelerator):
            raise ValueError("BatchSizeFinder doubles the batch until a step runs out of memory, which a GPU reports "
                             "as an error; on a CPU the operating system swaps or kills the process first: give the "
                             "batch size (--data.init_args.batch_size N)")
        if self.trainer.precision == "16-true" and isinstance(self.trainer.accelerator, CPUAccelerator):
            raise ValueError(
                "precision='16-true' on CPU: every weight, activation and optimizer state would be fp16, whose "
                "range (max 65504, eps 1e-3) overflows the softmax and loses small updates, and CPUs have no "
                "fast fp16 arithmetic; use precision '32-true' or 'bf16-mixed'"
            )

    def on_fit_start(self) -> None:
        # Lightning's tuners (LearningRateFinder, BatchSizeFinder) train and validate before this hook, then restore
        # the weights: what they recorded is not the run's, and a learning rate they chose is the schedule's peak.
        self.history.update(val=[], val_acc=[], tokens_per_sec=[], started=time.perf_counter())
        self._window_started, self._window_tokens = None, 0
        if self._schedule_lr is not None and self.hparams.lr != self._schedule_lr:
            self._rescale_schedule(self.hparams.lr)
        # TensorBoard's HPARAMS tab: the run's settings against its final and best validation loss (logged
        # at every validation under these tags; the tab shows their latest values)
        params = {**comparable_hparams(dict(self.hparams)), **{k: v for k, v in self.sizes.items() if v is not None}}
        averaging = weight_averaging(self.trainer.callbacks)
        if averaging:  # (a callback, not a hyper-parameter, yet it decides which weights every validation scores)
            params["weight_averaging"] = averaging
        metrics = {"hp/final_val_loss": float("nan"), "hp/best_val_loss": float("nan")}
        for logger in self.loggers:  # (CSV, W&B and most other loggers take no metrics here)
            takes_metrics = "metrics" in inspect.signature(logger.log_hyperparams).parameters
            logger.log_hyperparams(params, **({"metrics": metrics} if takes_metrics else {}))
        if self.trainer.is_global_zero:
            print(self.model.summary(), flush=True)
            if self.size_note:
                print(self.size_note, flush=True)
            if self.hparams.compile:
                backend = "inductor" if self.hparams.compile is True else self.hparams.compile
                print(f"compiling the model (torch.compile, fullgraph, backend {backend}): the first training step, "
                      "and the first validation, take minutes on a CPU; the steps after are fast", flush=True)

    # ---- checkpoints: the RNG states travel with the weights -------------------------------------

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["rng_states"] = rng_states()
        fingerprint = getattr(self._trainer and self.trainer.datamodule, "tokenizer_fingerprint", None)
        if fingerprint is not None:  # what the text was tokenized with: resume, generate and eval compare
            checkpoint["tokenizer"] = fingerprint()
        if self._schedule_steps is not None:  # the steps the learning-rate schedule spans: a resume compares
            checkpoint["schedule_steps"] = self._schedule_steps

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        mine = self.state_dict()
        theirs = checkpoint.get("state_dict") or {}
        unfit = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(mine[k].shape)}" for k, v in theirs.items()
                 if k in mine and isinstance(v, torch.Tensor) and v.shape != mine[k].shape]
        if unfit:  # (missing and unexpected keys are load_state_dict's to report, as strict says)
            raise ValueError(f"LanguageModel: the checkpoint does not fit this model: {'; '.join(unfit[:3])}"
                             f"{' …' if len(unfit) > 3 else ''} (a different vocabulary, width or pattern?)")
        if self._trainer is not None:  # resumed, validated or tested on data tokenized otherwise: named
            problem = tokenizer_problem(self.trainer.datamodule, checkpoint.get("tokenizer"))
            if problem:
                raise ValueError(f"LanguageModel: {problem}")
        if self._trainer is not None and self.trainer.state.fn == "fit":  # training resumes
            check_averaging_resumed(checkpoint, self.trainer.callbacks)
            if "rng_states" in checkpoint:  # (only here: loading weights elsewhere must not reset the caller's RNGs)
                set_rng_states(checkpoint["rng_states"])
            self.history["first_step"] = int(checkpoint.get("global_step", 0))  # where it starts (the summary)
            self._resumed_schedule_steps = checkpoint.get("schedule_steps")

    def on_train_batch_start(self, batch: dict, batch_idx: int) -> None:
        # Tokens over wall time across a logging window of finished steps (data loading included), read after
        # one device synchronisation per window: timing single steps without one measures kernel launches on a
        # GPU. Logged here, before the step, with everything else this step logs: a checkpoint written at the
        # end of the step then carries all of it (recipes.training.pending_step_log).
        # With gradient accumulation only a step's first micro-batch closes a window: the window then holds whole
        # steps (their optimizer updates included), not one micro-batch without its update.
        if batch_idx % self.trainer.accumulate_grad_batches:
            return
        now = time.perf_counter()
        if self._window_started is None:
            self._window_started, self._window_tokens = now, 0
        elif self._window_tokens and self.trainer.global_step % max(self.trainer.log_every_n_steps, 1) == 0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
                now = time.perf_counter()
            speed = self._window_tokens / max(now - self._window_started, 1e-9)
            self.history["tokens_per_sec"].append(speed)
            self.log("train/tokens_per_sec", speed, prog_bar=True)
            self._log_flops(speed)
            self._window_started, self._window_tokens = now, 0
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])  # the rate this step's update uses

    def on_train_batch_end(self, outputs, batch: dict, batch_idx: int) -> None:
        self._window_tokens += batch["input_ids"].numel()
        self._window_length = batch["input_ids"].shape[1]

    def _log_flops(self, tokens_per_sec: float) -> None:
        """``train/flops_per_token`` (forward, analytic: :mod:`components.flops`), the achieved ``train/tflops``
        of training (three forwards per token), and ``train/mfu`` against the device's peak when it is known."""
        T = self._window_length
        if T not in self._flops_per_token:
            self._flops_per_token[T] = forward_flops_per_token(self.model, T)
        achieved = training_flops(self._flops_per_token[T], tokens_per_sec)
        self.log("train/flops_per_token", self._flops_per_token[T])
        self.log("train/tflops", achieved / 1e12)
        peak = self.hparams.get("peak_flops") or device_peak_flops(self.device, self.trainer.precision)
        if peak:
            self.log("train/mfu", achieved / peak, prog_bar=True)

    # ---- optimiser and schedule ------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        spec = hp.get("optimizer")
        muon = spec is not None and spec["class_path"] == MUON
        if self._sharded and muon:
            raise ValueError("--model.optimizer Muon orthogonalises whole weight matrices, and sharded training "
                             "(FSDP) gives each process a shard of each: train with DDP, or with AdamW")
        hidden_matrices = [m.weight for m in self.model.blocks.modules() if isinstance(m, torch.nn.Linear)]  # (Muon's)
        optimizer = build_optimizer(spec, self.parameters(), hidden_matrices, lr=hp.lr, weight_decay=hp.weight_decay,
                                    betas=hp.betas, eps=hp.eps,
                                    row_blocks=fused_row_blocks(self.model.blocks) if muon else ())
        steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(steps):  # (int(inf) was an OverflowError from here)
            raise ValueError("the learning-rate schedule (warm-up, then the decay to final_lr_fraction) is planned "
                             "over the run's steps, and this run sets no limit on them (max_steps -1 and max_epochs -1; "
                             "max_time does not say how many): give --trainer.max_steps N or --trainer.max_epochs N")
        total = max(int(steps), 1)
        self._schedule_steps = total
        planned, step = self._resumed_schedule_steps, self.history.get("first_step", 0)
        multiplier = partial(lr_multiplier, schedule=hp.get("schedule", "cosine"), warmup_fraction=hp.warmup_fraction,
                             final_fraction=hp.final_lr_fraction, decay_fraction=hp.get("decay_fraction"))
        self._schedule_lr = hp.lr
        rate = lambda at, steps: hp.lr * multiplier(at, steps)  # noqa: E731
        if (planned is not None and planned != total and self.trainer.is_global_zero
                and not math.isclose(rate(step + 1, total), rate(step + 1, planned), rel_tol=0.01)):
            # Resumed with another max_steps (to train longer, say): the schedule is re-planned over the new length,
            # so the rate jumps; said, since the run is then neither the old plan continued nor the new one from 0.
            print(f"note: this run's learning-rate schedule ({hp.get('schedule', 'cosine')}) spanned {planned} steps; "
                  f"resumed for {total}, it is re-planned over {total}: the rate jumps from {rate(step, planned):.3g} to "
                  f"{rate(step + 1, total):.3g} after the first resumed step, so the run is neither its plan continued "
                  f"nor one planned for {total} steps from the start (--model.init_from with the checkpoint starts a "
                  "new schedule from its weights)", file=sys.stderr)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: multiplier(step, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def _rescale_schedule(self, lr: float) -> None:
        """Make ``lr`` the schedule's peak rate: set after the optimizer was built (Lightning's LearningRateFinder
        writes its suggestion into ``hparams.lr`` and the groups' current rate, which the schedule's next step would
        overwrite with the old peak's, while the checkpoint recorded the new one)."""
        ratio, old = lr / self._schedule_lr, self._schedule_lr
        for config in self.trainer.lr_scheduler_configs:
            schedule = config.scheduler
            schedule.base_lrs = [base * ratio for base in schedule.base_lrs]
            for group, base, factor in zip(schedule.optimizer.param_groups, schedule.base_lrs, schedule.lr_lambdas):
                group["initial_lr"], group["lr"] = base, base * factor(schedule.last_epoch)
        self._schedule_lr = lr
        self.save_hyperparameters(dict(self.hparams))  # Lightning logs the initial ones (hparams.yaml) after this hook
        if self.trainer.is_global_zero:
            print(f"note: lr {lr:.3g} (the learning-rate finder's) replaces {old:.3g} as the peak of the schedule "
                  f"({self.hparams.get('schedule', 'cosine')}); the checkpoints record it", file=sys.stderr, flush=True)


def _names(names: list[str], limit: int = 8) -> str:
    """Tensor names for a message, a block's mixer gathered as ``blocks.3.sequence_mixer.* (4)``; ``limit`` shown."""
    if not names:
        return "none"
    groups: dict[str, list[str]] = {}
    for name in names:
        parts = name.split(".")
        groups.setdefault(".".join(parts[:3]) + ".*" if parts[0] == "blocks" and len(parts) > 3 else name, []).append(name)
    shown = [f"{key} ({len(members)})" if len(members) > 1 else members[0] for key, members in groups.items()]
    return ", ".join(shown[:limit]) + (f" and {len(shown) - limit} more" if len(shown) > limit else "")


def comparable_hparams(hparams: dict) -> dict:
    """The hyper-parameters as the plain values TensorBoard's HPARAMS tab compares: one ``mixers/<letter>``
    string per binding (``QCAttention(n_heads=4)``), lists and mappings as text."""
    out = {}
    for key, value in hparams.items():
        if key == "optimizer":
            out[key] = describe_optimizer(value)
        elif key == "mixers" and isinstance(value, Mapping):
            for letter, spec in value.items():
                args = ", ".join(f"{k}={v!r}" for k, v in (spec.get("init_args") or {}).items())
                out[f"mixers/{letter}"] = f"{spec['class_path'].rsplit('.', 1)[-1]}({args})"
        elif isinstance(value, (bool, int, float, str)):
            out[key] = value
        elif value is not None:
            out[key] = str(value)
    return out


SCHEDULES = ("cosine", "wsd")
"""The learning-rate schedules after the linear warm-up: a cosine over the rest of the run, or warm-up-stable-decay."""


def check_schedule(schedule: str, warmup_fraction: float, decay_fraction: float | None) -> float | None:
    """The schedule's ``decay_fraction`` (``wsd``'s default 0.2; None for the cosine, which decays throughout)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"LanguageModel: schedule={schedule!r} is not one of {SCHEDULES}")
    if schedule == "cosine":
        if decay_fraction is not None:
            raise ValueError(f"LanguageModel: decay_fraction={decay_fraction} is the wsd schedule's (the cosine decays "
                             "from the end of the warm-up on): give --model.schedule wsd, or drop it")
        return None
    decay_fraction = 0.2 if decay_fraction is None else decay_fraction
    if not (0.0 <= decay_fraction <= 1.0 and warmup_fraction + decay_fraction <= 1.0):
        raise ValueError(f"LanguageModel: decay_fraction={decay_fraction} must lie in [0, 1], and the warm-up "
                         f"({warmup_fraction}) and the decay together cover at most the whole run")
    return decay_fraction


def lr_multiplier(step: int, total: int, *, schedule: str, warmup_fraction: float, final_fraction: float,
                  decay_fraction: float | None) -> float:
    """Multiplier of the peak learning rate at ``step`` of ``total`` (:data:`SCHEDULES`)."""
    if schedule == "wsd":
        return warmup_stable_decay(step, total, warmup_fraction, final_fraction, decay_fraction)
    return warmup_cosine(step, total, warmup_fraction, final_fraction)


def warmup_stable_decay(step: int, total: int, warmup_fraction: float, final_fraction: float,
                        decay_fraction: float) -> float:
    """Warm-up-stable-decay (MiniCPM's WSD): linear 0→1 over the warm-up, 1 until the last ``decay_fraction`` of the
    steps, then linear 1→``final_fraction``. A run resumed in its stable phase with a larger ``max_steps`` (past the
    longer run's warm-up too) meets no jump in its rate; ``decay_fraction=0`` holds the peak to the end."""
    warmup = int(warmup_fraction * total)
    if step < warmup:
        return linear_warmup(step, warmup)
    decay = int(decay_fraction * total)
    start = total - decay
    if decay == 0 or step < start:
        return 1.0
    return 1 - (1 - final_fraction) * min((step - start) / decay, 1.0)


def linear_warmup(step: int, warmup: int) -> float:
    """The warm-up's multiplier at ``step < warmup``: ``1/warmup`` at the first step, 1 at the last."""
    return (step + 1) / warmup


def warmup_cosine(step: int, total: int, warmup_fraction: float, final_fraction: float) -> float:
    """Multiplier of the peak learning rate: linear 0→1 over the warm-up, cosine 1→``final_fraction``."""
    warmup = int(warmup_fraction * total)
    if step < warmup:
        return linear_warmup(step, warmup)
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return final_fraction + (1 - final_fraction) * 0.5 * (1 + math.cos(math.pi * progress))

