"""A callback that kills the main process of a launched run right after a given step, as a crash or a pre-emption
would: the two-process resume scripts stop a run this way and check that it resumes."""

import os
import signal

from transformers import TrainerCallback


class KillAtStep(TrainerCallback):
    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and state.is_world_process_zero:
            os.kill(os.getpid(), signal.SIGKILL)
