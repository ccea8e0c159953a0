"""
accelerate applies `--use_fsdp` to accelerator devices only: it runs CPU processes as DDP replicas (`MULTI_CPU`,
without its FSDP plugin). torch's FSDP2 (`fully_shard`) itself runs on CPU processes with gloo, so the two-process
FSDP scripts let accelerate take their gloo processes for GPU ones; it then shards the model as it does on GPUs.
"""

from accelerate import PartialState
from accelerate.utils import DistributedType


def shard_cpu_processes_with_fsdp() -> None:
    """Makes accelerate apply its FSDP plugin to the CPU processes of this launch; call before building a trainer."""
    initialize = PartialState.__init__

    def initialize_as_accelerator_processes(self, cpu: bool = False, **kwargs) -> None:
        initialize(self, cpu, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.MULTI_GPU

    PartialState.__init__ = initialize_as_accelerator_processes
