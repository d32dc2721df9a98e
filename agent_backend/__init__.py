"""cuda-agent: a torch.compile backend that runs verified CUDA kernels where they beat Inductor.

Use it by name after `pip install`: torch.compile(model, backend="cuda_agent").
With options={"mode": "background"}, `agent_backend.refresh()` makes compiled models pick up the
kernels found since.
"""
import logging

from .background import refresh

__version__ = "0.1.0"

# Quiet by default: the library never configures logging for the application.
logging.getLogger("cuda_agent").addHandler(logging.NullHandler())

__all__ = ["refresh"]
