"""Settings of the whole test suite."""

import torch

# The tests' models are tiny: one thread per test process runs them several times faster than threads that contend for
# the cores with each other and with the other worker processes of `pytest -n`.
torch.set_num_threads(1)
