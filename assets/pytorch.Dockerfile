# The homegpu PyTorch worker image: Python with torch from PyPI, whose CUDA libraries come with it.
#
# torch's Linux wheels on PyPI carry their CUDA runtime, cuDNN and NCCL (the nvidia-* wheels), so no CUDA
# base image is needed: the node's NVIDIA driver reaches the container through the NVIDIA Container
# Toolkit, and the same image runs gloo on a CPU-only node. Nothing else is added but NumPy: homegpu ships
# its launcher, the demo and your scripts to the nodes at launch, so code changes need no rebuild.
#
# Build it on your Docker nodes (each node's engine pulls the base image from Docker Hub):
#     homegpu image build --framework pytorch                   # on every node with runtime = "docker"
#     homegpu image build --framework pytorch --node desktop    # on one node
# or build it on one node and copy it to the others over SSH (no registry needed):
#     homegpu image copy homegpu/pytorch:2.14 --from desktop
# homegpu/pytorch:2.14 is the default `image` of a PyTorch job (framework = "pytorch").
FROM python:3.12-slim

# Every node of a job runs the same torch (homegpu's preflight refuses versions that differ). NumPy too, which
# torch's wheel leaves out: without it every process warns "Failed to initialize NumPy".
RUN python3 -m pip install --no-cache-dir torch==2.14.1 numpy \
 && python3 -c "import numpy, torch, torch.distributed; assert torch.__version__.startswith('2.14')"
