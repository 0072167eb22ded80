# The homegpu JAX worker image: Python with jax from PyPI (its CPU build, with gloo between processes).
#
# On GPU nodes install the CUDA plugin instead, which brings its CUDA libraries as wheels (no CUDA base image
# needed: the node's NVIDIA driver reaches the container through the NVIDIA Container Toolkit):
#     RUN python3 -m pip install --no-cache-dir "jax[cuda12]==0.10.2" numpy
# Nothing else is added: homegpu ships its cluster environment, the demo and your scripts to the nodes at launch,
# so code changes need no rebuild. Keras 3 scripts on JAX add `keras` to the pip line.
#
# Build it on your Docker nodes (each node's engine pulls the base image from Docker Hub):
#     homegpu image build --framework jax                   # on every node with runtime = "docker"
#     homegpu image build --framework jax --node desktop    # on one node
# or build it on one node and copy it to the others over SSH (no registry needed):
#     homegpu image copy homegpu/jax:0.10 --from desktop
# homegpu/jax:0.10 is the default `image` of a JAX job (framework = "jax").
FROM python:3.12-slim

# Every node of a job runs the same jax (homegpu's preflight refuses versions that differ).
RUN python3 -m pip install --no-cache-dir jax==0.10.2 numpy \
 && python3 -c "import jax, jax.distributed; assert jax.__version__.startswith('0.10')"
