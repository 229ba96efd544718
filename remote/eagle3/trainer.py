"""Training-time-test training of the draft on stored hidden states.

Per record (tokens ``x``, trained-token mask ``m``, aux states ``f``, final
states ``z``): the target's distribution at position ``t`` is
``softmax(lm_head(z_t))``, its guess for ``x[t+1]``. Step ``k`` of the chain
reads ``f`` (fused; or the previous step's output), the token ``x[t+k+1]``,
and is trained to match the target's distribution at ``t+k+1`` restricted to
the draft vocabulary, wherever the predicted token ``x[t+k+2]`` is a trained
token and the target's own top token is in the draft vocabulary. The loss is
``sum_k 0.8**k * loss_k``; ``acc_k`` is how often the draft's top token is the
target's top token at step ``k``.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from remote.eagle3 import StageInputError, distributed, resume
from remote.eagle3.distributed import World
from remote.eagle3.model import Eagle3Draft, shift_left
from remote.eagle3.resume import TrainState

STEP_DECAY = 0.8


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T)
    loss_mask: torch.Tensor  # (B, T)
    aux: torch.Tensor  # (B, T, 3H)
    final: torch.Tensor  # (B, T, H)


def collate(samples: list[dict[str, Any]], max_length: int, dtype: torch.dtype) -> Batch:
    """Right-pad samples (cut to `max_length`) into one batch; pads carry mask 0."""
    length = min(max_length, max(len(s["input_ids"]) for s in samples))
    count = len(samples)
    aux_width = samples[0]["aux_hidden_state"].shape[-1]
    hidden = samples[0]["hidden_state"].shape[-1]
    batch = Batch(
        input_ids=torch.zeros(count, length, dtype=torch.long),
        loss_mask=torch.zeros(count, length, dtype=torch.long),
        aux=torch.zeros(count, length, aux_width, dtype=dtype),
        final=torch.zeros(count, length, hidden, dtype=dtype),
    )
    for row, s in enumerate(samples):
        n = min(length, len(s["input_ids"]))
        batch.input_ids[row, :n] = s["input_ids"][:n]
        batch.loss_mask[row, :n] = s["loss_mask"][:n]
        batch.aux[row, :n] = s["aux_hidden_state"][0, :n].to(dtype)
        batch.final[row, :n] = s["hidden_state"][0, :n].to(dtype)
    return batch


@torch.no_grad()
def target_distribution(final: torch.Tensor, head: torch.Tensor, t2d: torch.Tensor, chunk: int = 512):
    """(p over the draft vocab, whether the target's top token is in it), a chunk of positions at a time."""
    probs, in_draft = [], []
    for start in range(0, final.shape[1], chunk):
        # NOTE: chunked so a 160k vocabulary never needs a full T x V tensor.
        logits = final[:, start : start + chunk].float() @ head.float().T
        in_draft.append(t2d[logits.argmax(-1)])
        probs.append(torch.softmax(logits[..., t2d], dim=-1))
    return torch.cat(probs, dim=1), torch.cat(in_draft, dim=1)


def ttt_loss(draft: Eagle3Draft, batch: Batch, head: torch.Tensor, steps: int,
             forward: Callable[..., Any] | None = None) -> tuple[torch.Tensor, list[float]]:
    """The decayed sum of the per-step losses, and the per-step top-1 accuracies; `forward` runs the
    draft (its DDP wrapper when several processes train it)."""
    target_p, in_draft = target_distribution(batch.final, head, draft.t2d)
    logits = (forward or draft)(batch.input_ids, batch.aux, steps)
    total = torch.zeros((), device=batch.aux.device)
    accuracies = []
    for k, step_logits in enumerate(logits):
        p = shift_left(target_p, k + 1)
        valid = (shift_left(batch.loss_mask, k + 2) * shift_left(in_draft.long(), k + 1)).float()
        count = valid.sum().clamp(min=1.0)
        log_q = torch.log_softmax(step_logits.float(), dim=-1)
        loss = -((p * log_q).sum(-1) * valid).sum() / count
        total = total + (STEP_DECAY**k) * loss
        hits = (step_logits.argmax(-1) == p.argmax(-1)).float() * valid
        accuracies.append(float(hits.sum() / count))
    return total, accuracies


def autocast(device: torch.device):
    """bf16 matmuls on a GPU (fp32 weights and optimizer state); plain fp32 on the CPU."""
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batches(samples: list[Any], size: int, seed: int) -> Iterator[list[Any]]:
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    for start in range(0, len(order), size):
        yield [samples[i] for i in order[start : start + size]]


def rate_factor(step: int, total_steps: int, warmup_steps: int) -> float:
    """The learning rate's share at optimizer step `step`: a linear rise over `warmup_steps` (a fresh
    optimizer's first steps are its largest: on a trained draft they undo what it knew), then a cosine to 0."""
    rise = min(1.0, (step + 1) / warmup_steps) if warmup_steps else 1.0
    return rise * 0.5 * (1 + math.cos(math.pi * step / max(total_steps, 1)))


def optimizer_for(draft: Eagle3Draft, learning_rate: float, total_steps: int, state: TrainState, warmup_steps: int = 0):
    """AdamW over the draft's trainable weights and the schedule of `rate_factor` over `total_steps`,
    both as `state` left them (a fresh state: as new)."""
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: rate_factor(i, total_steps, warmup_steps))
    if state.optimizer:
        optimizer.load_state_dict(state.optimizer)
    if state.schedule:
        schedule.load_state_dict(state.schedule)
    return optimizer, schedule


def train_step(draft: Eagle3Draft, batch: Batch, head: torch.Tensor, steps: int, optimizer, schedule,
               forward: Callable[..., Any] | None = None) -> tuple[float, list[float]]:
    """One optimizer step on `batch` (moved to the head's device; gradients clipped at 0.5):
    its loss and per-step accuracies (this process's: `train` averages them over the ranks)."""
    device = head.device
    batch = Batch(*(t.to(device) for t in (batch.input_ids, batch.loss_mask, batch.aux, batch.final)))
    with autocast(device):
        loss, accuracies = ttt_loss(draft, batch, head, steps, forward)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(draft.parameters(), 0.5)
    optimizer.step()
    schedule.step()
    return float(loss.detach()), accuracies


def train(draft: Eagle3Draft, head: torch.Tensor, samples: list[Any], load: Callable[[Any], dict[str, Any]], *,
          epochs: int, batch_size: int, learning_rate: float, steps: int, max_length: int,
          on_step: Callable[[int, float, list[float], int], None], on_epoch: Callable[[int], None], seed: int = 0,
          state: TrainState | None = None, on_checkpoint: Callable[[TrainState], None] | None = None,
          checkpoint_every: int = 0, schedule_steps: int = 0, warmup_steps: int = 0, world: World = World()) -> TrainState:
    """Train `draft` in place; `samples` are loaded lazily with `load` (records may not fit in memory).

    From `state` (a saved `TrainState`) it goes on where that run stopped (for a state over other data,
    only the optimizer and the step count). `on_checkpoint` gets the state every `checkpoint_every` steps
    and after every epoch. `schedule_steps` sizes the cosine schedule when this call is one chunk of a
    longer run; the learning rate rises over its first `warmup_steps`. In a `world` of several processes
    (`remote.eagle3.distributed`) every rank gets the same `samples` and trains on its share of each
    global batch (`batch_size` per process); the callbacks get the figures averaged over the ranks.
    """
    dtype = draft.fc.weight.dtype
    state = state or TrainState(world=world.size)
    per_step = batch_size * world.size
    total_steps = schedule_steps or epochs * math.ceil(len(samples) / per_step)
    optimizer, schedule = optimizer_for(draft, learning_rate, total_steps, state, warmup_steps)
    forward = distributed.wrap(draft, world)
    step = state.step

    def snapshot(epoch: int, position: int) -> TrainState:
        return TrainState(epoch=epoch, position=position, step=step, optimizer=optimizer.state_dict(),
                          schedule=schedule.state_dict(), data=state.data, world=world.size, learning_rate=learning_rate)

    draft.train()
    for epoch in range(state.epoch, epochs):
        skip = state.position if epoch == state.epoch else 0
        for index, chunk in enumerate(batches(samples, per_step, seed + epoch)):
            if index < skip:
                continue
            batch = collate([load(s) for s in distributed.share(chunk, world)], max_length, dtype)
            loss, accuracies = train_step(draft, batch, head, steps, optimizer, schedule, forward)
            loss, *accuracies = distributed.mean([loss, *accuracies], world)
            if not math.isfinite(loss):  # every rank sees the same mean: all stop here, and no draft is kept
                raise StageInputError(f"the training loss is {loss} at step {step + 1}: the draft diverged; "
                                      f"{resume.after_diverging(learning_rate)}")
            step += 1
            on_step(step, loss, accuracies, len(chunk) if epoch == 0 else 0)
            if on_checkpoint and checkpoint_every and step % checkpoint_every == 0:
                on_checkpoint(snapshot(epoch, index + 1))
        on_epoch(epoch + 1)
        if on_checkpoint:
            on_checkpoint(snapshot(epoch + 1, 0))
    draft.eval()
    return snapshot(epochs, 0)
