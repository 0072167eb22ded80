"""homegpu.remote.images: the workers' Docker images on the nodes: built there from assets/Dockerfile,
or copied node to node in a chain that needs no registry.
"""

from __future__ import annotations

from homegpu.remote.images.chain import CopyProgress
from homegpu.remote.images.node_images import ImageError, NodeOutcome, build_on_nodes, copy_image

__all__ = [
    "CopyProgress", "ImageError", "NodeOutcome", "build_on_nodes", "copy_image",
]
