"""What a compiled graph's wrapper imports to run a launch-spec winner (launch_lowering.py puts the
import there): the launch op's C++ kernel called from Python with no dispatcher in between,

    launch(key, program, *inputs) -> [outputs]   (or launch(key, program, [inputs]))

the same function as torch.ops.cuda_agent.launch's CUDA kernel. Importing this module loads the
launch op's extension (building it once per machine, torch and Python, as launch_op.native does).
"""
from agent_backend.env.launch_op import native

launch = native().launch
