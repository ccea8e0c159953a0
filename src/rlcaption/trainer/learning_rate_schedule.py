"""
The learning-rate schedule of a run counted in captioner steps: the Trainer's schedule (`lr_scheduler_type`, warmup)
spans the optimizer steps that train the captioner, holds the base rates while a pretraining phase keeps the
captioner fixed, and may decay in steps (`lr_decay_factor` every `lr_decay_epochs` epochs, as Ren et al. 2017 do).

Counting captioner steps only makes budgets comparable: actor-critic with P value-pretraining steps and N policy steps
gives its policy the learning rates SCST gives its captioner over N steps, instead of a linear decay that is already
P steps down when the policy starts to learn.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.optim.lr_scheduler import LambdaLR, LRScheduler

__all__ = ["captioner_step_schedule"]


def captioner_step_schedule(
    schedule: LRScheduler, fixed_steps: int, decay_factor: float = 1.0, decay_interval: int | None = None
) -> LRScheduler:
    """
    Shifts `schedule` past the steps that keep the captioner fixed, and multiplies it by a step decay.

    Args:
        schedule (`LRScheduler`): the Trainer's schedule, built for the captioner's steps alone; a `LambdaLR`, as
            every schedule of `transformers.get_scheduler` but `reduce_lr_on_plateau` and `greedy` is.
        fixed_steps (`int`): optimizer steps at the start of the run that keep the captioner fixed (its objective's
            pretraining phases): the learning rates stay at their base values through them (a warmup would leave
            the networks pretrained there without any), and `schedule` starts after them.
        decay_factor (`float`, *optional*, defaults to 1.0): multiplies the learning rates every `decay_interval`
            captioner steps; 1.0 for none.
        decay_interval (`int`, *optional*): captioner steps between two decays; needed when `decay_factor` is not 1.

    Returns:
        `LRScheduler`: `schedule` itself when there is nothing to change, else a `LambdaLR` over every optimizer step
        of the run, for every parameter group of `schedule`'s optimizer.
    """
    if fixed_steps == 0 and decay_factor == 1.0:
        return schedule
    if not isinstance(schedule, LambdaLR):
        raise ValueError(
            f"lr_scheduler_type gave a {type(schedule).__name__}, which cannot be shifted past {fixed_steps} "
            f"pretraining steps nor decayed by lr_decay_factor={decay_factor}: choose a schedule of the step (linear, "
            "cosine, constant, ...), or train without a pretraining phase and with lr_decay_factor=1.0."
        )
    if decay_factor != 1.0 and (decay_interval is None or decay_interval < 1):
        raise ValueError(f"A step decay by {decay_factor} needs decay_interval >= 1 steps, got {decay_interval}.")

    def in_captioner_steps(factor: Callable[[int], float]) -> Callable[[int], float]:
        # a closure, not an object: LambdaLR's state then holds no callable, and checkpoints load with weights_only
        def factor_at(step: int) -> float:
            if step < fixed_steps:
                return 1.0
            captioner_step = step - fixed_steps
            decay = decay_factor ** (captioner_step // decay_interval) if decay_factor != 1.0 else 1.0
            return factor(captioner_step) * decay

        return factor_at

    # the optimizer's groups keep the `initial_lr` that `schedule` recorded: the base rates of both schedules
    return LambdaLR(schedule.optimizer, [in_captioner_steps(factor) for factor in schedule.lr_lambdas])
